"""Response bytes per personality: the JSON and SSE shapes of WIRE_SPEC §3–§5.

A `Wire` turns plain values (ids, texts, finish reasons, token counts) into the exact
bytes each server sends: key order, compact separators (Starlette's JSONResponse and
pydantic's model_dump_json are both compact, non-ASCII kept as UTF-8 — orjson's output),
and every `null` the real serializer keeps. `emulator/wire_vllm.py` and
`emulator/wire_sglang.py` hold the shapes (they import this module, never the reverse);
`emulator/state.py`'s `wire_for(personality)` picks one.

SSE: every event is `data: <json>\\n\\n` and a stream ends `data: [DONE]\\n\\n`.
Mid-stream errors are serialized with `json.dumps` default separators (spaces), as both
servers do for those.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from emulator.schema import ApiError

DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_spaced(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt: int
    completion: int
    cached: int = 0

    @property
    def total(self) -> int:
        return self.prompt + self.completion


@dataclass(frozen=True, slots=True)
class Head:
    """What every chunk / body of one response repeats."""

    id: str
    created: int
    model: str
    chat: bool  # chat.completion(.chunk) vs text_completion
    include_usage: bool = False  # stream_options.include_usage
    continuous_usage: bool = False  # … and continuous_usage_stats
    cache_report: bool = False  # --enable-prompt-tokens-details / --enable-cache-report


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's logprob and its top list (most likely first)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A choice's tool call (emulator/tools.py): whole in a body; in a stream, the part of
    its arguments this chunk adds, `first` on the chunk that opens it (id, type, name)."""

    id: str
    name: str
    arguments: str
    first: bool = True


@dataclass(frozen=True, slots=True)
class Choice:
    index: int
    text: str
    finish_reason: str | None
    stopped_on_eos: bool = False  # finish_reason "stop" by EOS (SGLang's matched_stop)
    stop_reason: str | int | None = None  # matched stop string / stop token id
    # Logprobs of the tokens this body / chunk covers; None when not asked for.
    logprobs: tuple[TokenLogprob, ...] | None = None
    text_offset: int = 0  # characters of the answer sent before this chunk (completions)
    tool_call: ToolCall | None = None  # the answer is this call, not `text` (chat)


class Wire(Protocol):
    """Everything personality-specific about response bytes."""

    personality: str

    def error(self, err: ApiError) -> bytes: ...

    def full(self, head: Head, choices: list[Choice], usage: Usage) -> bytes: ...

    # streaming: each returns complete SSE event bytes (possibly several events)
    def role(self, head: Head, index: int, usage: Usage) -> bytes: ...

    def delta(self, head: Head, choice: Choice, usage: Usage) -> bytes:
        """New text of one choice; with a finish_reason it is that choice's last event(s)."""
        ...

    def usage_chunk(self, head: Head, usage: Usage) -> bytes: ...

    def stream_error(self, head: Head, err: ApiError) -> bytes: ...

    def models(self, names: tuple[str, ...], root: str, max_model_len: int, now: int) -> bytes: ...

    def tokenize(self, tokens: list[int], max_model_len: int, strs: list[str] | None) -> bytes: ...

    def detokenize(self, text: str) -> bytes: ...
