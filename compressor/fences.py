"""Fenced code blocks (``` or ~~~): found once, kept whole (FleetOpt §5.2's code gate).

A fence opens at the start of a line (after optional indentation) with three or more
backticks or tildes and closes at a line holding only the same character repeated at
least as often. An unclosed fence runs to the end of the text: when in doubt, more is
protected, never less. Inline code (```x``` inside a sentence) is not a block, nor is a
bare line of tildes right under a line of text (a reStructuredText heading underline).
"""

from __future__ import annotations

from compressor.compiled import fast as _fast


def has_fence_marker(text: str) -> bool:
    """`"```" in text or "~~~" in text`: may a fence open in it (the test before
    `code_spans`). In C when built: most texts hold inline code, few a fence, and one memchr
    hop per backtick beats two substring searches of the whole text."""
    if _fast is not None:
        found: bool = _fast.has_fence_marker(text)
        return found
    return "```" in text or "~~~" in text


def _fence_at(text: str, pos: int) -> str | None:
    """The fence (```… or ~~~…) opening a line at or after `pos`, if text[pos:] has one."""
    line_start = text.rfind("\n", 0, pos) + 1
    if text[line_start:pos].strip():
        return None
    end = pos
    while end < len(text) and text[end] == text[pos]:
        end += 1
    return text[pos:end]


def _underlines(text: str, at: int, length: int) -> bool:
    """A bare fence line directly below a non-blank line: a heading underline."""
    line_end = text.find("\n", at)
    if text[at + length : len(text) if line_end < 0 else line_end].strip():
        return False  # an info string: a real fence
    line_start = text.rfind("\n", 0, at)
    if line_start <= 0:
        return False
    previous = text[text.rfind("\n", 0, line_start) + 1 : line_start]
    return bool(previous.strip())


def code_spans(text: str) -> list[tuple[int, int]]:
    """Fenced blocks as [start of the fence line, end of the closing fence line)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    # the next "```" and "~~~" at or after pos (found again only once pos passes them:
    # a text with many rules or underlines is scanned once, not once per candidate)
    ahead = {"```": text.find("```"), "~~~": text.find("~~~")}
    while True:
        for marker, at in ahead.items():
            if 0 <= at < pos:
                ahead[marker] = text.find(marker, pos)
        opens = [i for i in ahead.values() if i >= 0]
        if not opens:
            return spans
        at = min(opens)
        fence = _fence_at(text, at)
        if fence is None or (fence[0] == "~" and _underlines(text, at, len(fence))):
            # no fence opens inside this run of the same character either (the text
            # before such a position on its line holds the run's start)
            run = at + 3
            while run < len(text) and text[run] == text[at]:
                run += 1
            pos = run
            continue
        search = text.find("\n", at)
        end = len(text)
        while search >= 0:
            close = text.find(fence, search)
            if close < 0:
                break
            line_end = text.find("\n", close)
            line_end = len(text) if line_end < 0 else line_end
            closing = _fence_at(text, close)
            if (
                closing is not None
                and len(closing) >= len(fence)
                and not text[close + len(closing) : line_end].strip()
            ):
                end = line_end
                break
            search = close + len(fence)
        spans.append((text.rfind("\n", 0, at) + 1, end))
        pos = end
