"""What a prompt costs an engine: the chat template and vocabulary of the emulated model.

fleetgate's budgets are in the engine's tokens. The emulated engines
(emulator/chat_template.py) count like a Llama-3 server with OpenAI's cl100k vocabulary:
five special tokens of ONE id each, text in cl100k BPE, and the Llama-3 layout

    <|begin_of_text|>
    for each message:  <|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>
    then:              <|start_header_id|>assistant<|end_header_id|>\\n\\n

so a chat prompt costs 1 + Σ_m (3 + tokens(role_m) + tokens("\\n\\n" + content_m))
+ 2 + tokens("assistant") + tokens("\\n\\n") tokens, and a completion prompt BOS + its
text. A message's content is a string, null, or a list of parts whose text parts are
joined with nothing (images and audio cost nothing). Every text is encoded on its own
(special tokens separate them), which is what lets the compressor count a shortened
message without re-encoding the others.

This module mirrors the emulator's definition for the pure side (the gateway may not
import the emulator): tests/unit/compressor/test_template.py checks that both count
the same. `chat_segments` exposes the encoded texts one by one so the compressor can
edit message contents and still know the exact total.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compressor.counting import default_counter


def count(text: str) -> int:
    return default_counter().count(text)


SPECIALS_PER_MESSAGE = 3  # <|start_header_id|>, <|end_header_id|>, <|eot_id|>
BOS = 1  # <|begin_of_text|>
REPLY_ROLE = "assistant"
CONTENT_PREFIX = "\n\n"  # follows <|end_header_id|>, encoded with the content

Message = Mapping[str, Any]
Slot = tuple[int, int | None]  # (message index, index of its only text part; None: a string)
Editable = Callable[[int, str, str], bool]  # (message index, role, text) → may be edited


def content_text(content: object) -> str:
    """The countable text of a message's `content`."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    out.append(text)
        return "".join(out)
    return ""


def _slot(index: int, content: object) -> tuple[Slot | None, str]:
    """Where the editable text of a message lives: a string content, or its only text part."""
    if isinstance(content, str):
        return (index, None), content
    if isinstance(content, Sequence):
        texts = [
            k
            for k, p in enumerate(content)
            if isinstance(p, Mapping)
            and p.get("type", "text") == "text"
            and isinstance(p.get("text"), str)
        ]
        if len(texts) == 1 and all(isinstance(p, Mapping) for p in content):
            return (index, texts[0]), str(content[texts[0]]["text"])
    return None, content_text(content)


def fixed_tokens(messages: Sequence[Message]) -> int:
    """Tokens of a chat prompt outside the message texts: BOS, the specials, the role
    names and the reply header."""
    roles = default_counter().count_all([str(m.get("role", "")) for m in messages])
    reply = 2 + count(REPLY_ROLE) + count(CONTENT_PREFIX)
    return BOS + SPECIALS_PER_MESSAGE * len(messages) + roles + reply


def chat_segments(
    messages: Sequence[Message], editable: Editable | None = None
) -> tuple[int, list[str], list[Slot | None]]:
    """The chat prompt as (fixed tokens, encoded texts, slots): text i is
    "\\n\\n" + content of message i, encoded on its own; its slot says where an editable
    text lives (None: not editable). Total tokens = fixed + Σ tokens(text i)."""
    texts: list[str] = []
    slots: list[Slot | None] = []
    for i, m in enumerate(messages):
        slot, text = _slot(i, m.get("content"))
        if slot is not None and (editable is None or not editable(i, str(m.get("role", "")), text)):
            slot = None
        texts.append(CONTENT_PREFIX + text)
        slots.append(slot)
    return fixed_tokens(messages), texts, slots


def chat_tokens(messages: Sequence[Message]) -> int:
    """Prompt tokens of a chat request as the engine counts them."""
    fixed, texts, _ = chat_segments(messages)
    return fixed + sum(count(t) for t in texts)


def completion_tokens(prompt: str) -> int:
    """Prompt tokens of a completion request (BOS + text)."""
    return BOS + count(prompt)
