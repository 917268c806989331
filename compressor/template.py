"""The chat template: how a messages list becomes the prompt an engine counts.

fleetgate's budgets are in the engine's tokens, and an engine counts the *rendered*
prompt: every message wrapped in role markers, plus the header that opens the reply.
The project fixes one template for the emulated engines and for the compressor's exact
target, the Zephyr layout (a real, widely used chat template):

    <|system|>\\n{content}</s>\\n<|user|>\\n{content}</s>\\n ... <|assistant|>\\n

tokenised as ordinary cl100k text (markers are not special tokens), so a message costs
its content plus ~7 tokens and the reply header 5. Content given as a list of parts
contributes its text parts joined by "\\n" (images and audio are not counted); a message
without content (an assistant tool call) renders its markers only. A completion prompt
is counted as is.

This module is the single definition: the emulator, the compressor and the budget
benchmark all render through it, so "the engine's count" means the same thing everywhere.
`segments` exposes the same rendering in pieces so the compressor can edit message texts
in place and still produce exactly what `render_chat` would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

ROLE_OPEN = "<|{role}|>\n"
MESSAGE_CLOSE = "</s>\n"
REPLY_HEADER = "<|assistant|>\n"

Message = Mapping[str, Any]
Slot = tuple[int, int | None]  # (message index, part index; None: string content)
Editable = Callable[[int, str, str], bool]  # (message index, role, text) → may be edited


def content_text(content: object) -> str:
    """The text of a message's `content`: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return ""


def segments(
    messages: Sequence[Message], editable: Editable | None = None
) -> tuple[list[str], list[Slot | None]]:
    """The rendered prompt as consecutive segments. A text that `editable` accepts is a
    segment of its own with its `Slot`; everything else (markers, other texts) is merged
    into fixed segments (slot None). "".join(segments) == render_chat(messages)."""
    segs: list[str] = []
    slots: list[Slot | None] = []
    fixed: list[str] = []

    def add(text: str, slot: Slot | None) -> None:
        if slot is None:
            fixed.append(text)
            return
        if fixed:
            segs.append("".join(fixed))
            slots.append(None)
            fixed.clear()
        segs.append(text)
        slots.append(slot)

    for i, m in enumerate(messages):
        role = str(m.get("role", "user"))
        add(ROLE_OPEN.format(role=role), None)
        content = m.get("content")
        if isinstance(content, str):
            ok = editable is not None and editable(i, role, content)
            add(content, (i, None) if ok else None)
        elif isinstance(content, Sequence):
            n = 0
            for k, part in enumerate(content):
                if not (isinstance(part, Mapping) and part.get("type") == "text"):
                    continue
                if n:
                    add("\n", None)
                n += 1
                text = str(part.get("text", ""))
                ok = editable is not None and editable(i, role, text)
                add(text, (i, k) if ok else None)
        add(MESSAGE_CLOSE, None)
    add(REPLY_HEADER, None)
    if fixed:
        segs.append("".join(fixed))
        slots.append(None)
    return segs, slots


def render_chat(messages: Sequence[Message]) -> str:
    """The prompt an engine sees for a chat request."""
    return "".join(segments(messages)[0])
