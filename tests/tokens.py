"""The engine's prompt-token count computed independently of compressor/counting.py:
plain tiktoken over the emulated engine's Llama-3 template (emulator/chat_template.py),
BOS and the five special tokens counting one id each. Tests compare the compressor's
exact counts against this."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from compressor.template import content_text
from compressor.tokenizer import cl100k


def text_tokens(text: str) -> int:
    return len(cl100k().encode(text))


def engine_tokens(
    prompt: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None
) -> int:
    if messages is None:
        return 1 + text_tokens(prompt or "")
    n = 1  # <|begin_of_text|>
    for m in messages:
        n += (
            3
            + text_tokens(str(m.get("role")))
            + text_tokens("\n\n" + content_text(m.get("content")))
        )
        # each assistant tool call, encoded on its own after the content (the emulator's
        # documented layout, emulator/chat_template.py)
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            spelled = {"name": fn.get("name"), "arguments": fn.get("arguments")}
            n += text_tokens(json.dumps(spelled, ensure_ascii=False, separators=(",", ":")))
    return n + 2 + text_tokens("assistant") + text_tokens("\n\n")
