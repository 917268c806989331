"""Content category of a request: code, prose, RAG or chat — fast, no model.

The category keys the bytes-per-token estimate (policies/budget.py: categories pack
different numbers of bytes into a token) and gates compression (FleetOpt §5.2:
extraction is safe for prose and retrieved passages, not for code). It runs on every
request, so it only uses C-speed string operations (`str.count`, literal-prefixed
regular expressions) on at most `_SAMPLE` characters from each end of each text:
~30–60 µs per request here (bench/compressor_speed.py's hot-path table).

Rules, in order:
1. **rag** if the request carries retrieved material: a `tool` message with content; or
   source headers at line starts (`[1]`, `Document 2`, `Passage 3:`, `Source:`,
   `<document …>`) or a context label (`Context:`, `Sources:`, `Search results:`,
   `Retrieved …`) in a non-assistant message — for a plain prompt, only if its last 400
   characters ask about that material: they name it ("the context", "the passages",
   "sources", "cite", "according to"), or hold a question mark with a label or ≥ 2
   headers. Retrieval comes first: retrieved passages may well contain code.
2. **code** if the code score ≥ `CODE_THRESHOLD` (0.15) — unless the text is a pasted log
   (`is_log`) or JSON (`json_paste`): classed by what compressing them does (issue 24),
   they lose whole lines or records, which code never does — where per line
   score = (lines ending in `:` `;` `{` `}` `)` `,` + ` = ` + `()` + `return ` + `def `)
           − `>>> ` − ½·(`. ` + `, `),
   or if fenced code blocks hold more than half the characters. Documentation with
   examples has doctest prompts and sentences; source code has neither.
3. **chat** if the messages hold a conversation: an assistant turn or ≥ 2 user turns.
4. **prose** otherwise.

Accuracy is measured on the labelled set built by tests/corpus.py (see
bench/compressor_fidelity.py's category table and tests/unit/compressor/test_content.py).
Failure posture: a wrong category only changes the bytes/token prior (the EMA then
learns it per category) or forgoes/permits compression; compression itself still
never cuts a fenced code block and never exceeds its budget.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from compressor.category import Category
from compressor.compiled import fast as _fast
from compressor.fences import code_spans, has_fence_marker
from compressor.template import content_text

CODE_THRESHOLD = 0.15  # separates labelled code from documentation (bench/compressor_fidelity.py)
_SAMPLE = 1_000  # characters from each end of a text: 98.5% accuracy, half the cost of 3000

# code_score also counts " = ", "()", "return ", "def " (assignments, calls, definitions)
# and ". ", ", " (sentences and clauses: documentation and conversation).
_CODE_ENDINGS = re.compile(r"\n(?<=[:;{}),]\n)")  # a statement ends or a block opens
_DOCTEST = ">>> "  # documentation shows code after a prompt; source code never does
# Both run on the lower-cased sample and start with a literal "\n" (fast to scan for).
_SOURCE_HEADER = re.compile(
    r"\n[^\S\n]*(?:\[\d{1,3}\]|<(?:document|doc|source|passage)\b|source\s*:|"
    r"(?:\#+\s*)?(?:document|doc|passage|source|chunk|result|excerpt|snippet)\s*\#?\s*\d{1,3}\b)"
)
_CONTEXT_LABEL = re.compile(
    r"\n[^\S\n]*(?:context|sources|search results|retrieved (?:documents|passages|context)|"
    r"documents|references)\s*:"
)
_SOURCE_WORDS = ("context", "passage", "document", "source", "retrieved", "cite", "according to")


def _sample(text: str, size: int = _SAMPLE) -> str:
    if len(text) <= 2 * size:
        return text
    return text[:size] + "\n" + text[-size:]


def code_score(text: str, sample: int = _SAMPLE) -> float:
    """Per-line code evidence minus documentation evidence (see the module docstring),
    on up to `sample` characters from each end."""
    s = _sample(text, sample)
    if _fast is not None:  # the same counts in one scan (compressor/_fast.c)
        counts: tuple[int, int, int, int] = _fast.code_counts(s)
        code, doctest, prose, lines = counts
        return (code - doctest - 0.5 * prose) / (lines + 1)
    c = s.count  # spelled out: it runs once per message of every chat the compressor sees
    code = len(_CODE_ENDINGS.findall(s)) + c(" = ") + c("()") + c("return ") + c("def ")
    prose = c(". ") + c(", ")
    return (code - c(_DOCTEST) - 0.5 * prose) / (c("\n") + 1)


def _fenced_share(text: str) -> float:
    s = _sample(text)
    if not has_fence_marker(s):
        return 0.0
    return sum(b - a for a, b in code_spans(s)) / max(len(s), 1)


def is_code(text: str, threshold: float = CODE_THRESHOLD, sample: int = _SAMPLE) -> bool:
    return code_score(text, sample) >= threshold or _fenced_share(text) > 0.5


# a log line opens with a timestamp: ISO date, syslog "Mon DD HH:MM:SS", or a bare time
_LOG_LINE = re.compile(
    r"^[^\S\n]*(?:\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|"
    r"\[?\d\d:\d\d:\d\d)",
    re.MULTILINE,
)
LOG_SHARE = 0.6  # of a sample's lines opening with a timestamp: a pasted log


def is_log(text: str, sample: int = _SAMPLE) -> bool:
    """Mostly timestamped lines: a log. Log lines end in `:` `)` `,` like statements,
    so the code score takes them for code, but they are records, not a program: each
    line stands alone and dropping some is what extractive summarisation of a log does."""
    s = _sample(text, sample)
    need = LOG_SHARE * (s.count("\n") + 1)
    # every timestamp above holds a ":" (on its own line): with fewer colons than the
    # lines needed it is not a log, found by one C-speed count instead of the regex
    # (which Python's re tries at every position of the sample: ~0.1 ms for prose)
    return s.count(":") >= need and len(_LOG_LINE.findall(s)) >= need


def unfenced(text: str) -> str:
    """`text` without its fenced code blocks."""
    if not has_fence_marker(text):
        return text
    out, pos = [], 0
    for a, b in code_spans(text):
        out.append(text[pos:a])
        pos = b
    out.append(text[pos:])
    return "\n".join(out)


def code_outside_fences(rest: str) -> bool:
    """The compressor's per-text gate (a text inside a request it may shorten), given the
    text's `unfenced` part: the code score on a 4× larger sample (it separates
    documentation with examples from source code better than the hot-path classifier's
    sample) of the text *outside* its fenced blocks — those are kept whole anyway, so a
    README or an answer with code examples is shortened around them, while a message that
    is only a fenced program has nothing else to shorten. Logs are not code (`is_log`)."""
    return code_score(rest, 4 * _SAMPLE) >= CODE_THRESHOLD and not is_log(rest, 4 * _SAMPLE)


def _is_rag(text: str, need_ask: bool = True) -> bool:
    """Retrieved material (numbered source headers or a context label) that the prompt
    then asks about (see the module docstring)."""
    s = ("\n" + _sample(text)).lower()
    headers = len(_SOURCE_HEADER.findall(s))
    if headers == 0 and _CONTEXT_LABEL.search(s) is None:
        return False
    if not need_ask:
        return True
    tail = text[-400:].lower()
    names_sources = any(w in tail for w in _SOURCE_WORDS)
    return names_sources or (headers != 1 and "?" in tail)


# a JSON paste: a `{` or `[` opening a line, then a key or an item, and `"key": ` pairs
# on a good share of the sample's lines (indented JSON ends its lines in `,` `{` `[` like
# code, which is what made it look like code before issue 24)
_JSON_START = re.compile(r"(?:^|\n)[^\S\n]*[\[{]\s*[\[{\"]")
JSON_KEY_SHARE = 0.15  # `": ` per line (indented records: ~0.25; lists of strings lower it)
JSON_QUOTES = 1.5  # `"` per line (JSON: ~2 and more; Python source: ~0.3)


def json_paste(text: str) -> bool:
    """Mostly JSON (on the sample): compressed by dropping whole records
    (compressor/records.py), so not code. A false positive only costs a look for a
    record array that parses; without one the compressor's own code gate still holds."""
    s = _sample(text)
    if _JSON_START.search(s) is None:
        return False
    lines = s.count("\n") + 1
    return s.count('": ') >= JSON_KEY_SHARE * lines and s.count('"') >= JSON_QUOTES * lines


def classify_text(text: str) -> Category:
    """Category of a completion prompt (or of one message's text)."""
    if _is_rag(text):
        return Category.RAG
    if is_code(text) and not json_paste(text) and not is_log(text):
        return Category.CODE
    return Category.PROSE


def classify_chat(messages: Sequence[Mapping[str, Any]]) -> Category:
    """Category of a chat request (see the module docstring for the rules)."""
    texts = [content_text(m.get("content")) for m in messages]
    roles = [str(m.get("role", "")) for m in messages]
    if any(r == "tool" and t for r, t in zip(roles, texts, strict=True)):
        return Category.RAG
    if any(
        _is_rag(t, need_ask=False)
        for r, t in zip(roles, texts, strict=True)
        if r != "assistant" and len(t) > 1000
    ):
        return Category.RAG
    joined = "\n".join(texts)
    if is_code(joined) and not json_paste(joined) and not is_log(joined):
        return Category.CODE
    if "assistant" in roles or roles.count("user") >= 2:
        return Category.CHAT
    return Category.PROSE


def classify(
    prompt: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None
) -> Category:
    """Category of a request given as a completion `prompt` or chat `messages`."""
    if messages is not None:
        return classify_chat(messages)
    return classify_text(prompt or "")
