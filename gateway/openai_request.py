"""Step 1 of the pipeline: parse and validate an OpenAI chat/completions request.

Only what the gateway relies on is checked (the engine validates the rest and its 4xx is
passed through): the body is a JSON object, `model` a non-empty string, `messages` a
non-empty list of messages (chat) or `prompt` a non-empty string / list of strings /
token ids (completions), `max_tokens`/`max_completion_tokens` positive integers, `stream`
a boolean, `stream_options` an object. Unknown fields pass through untouched. Every
refusal is a 400 naming the field (never FastAPI's 422).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest

CHAT = "chat"
COMPLETIONS = "completions"


@dataclass(slots=True)
class ParsedRequest:
    endpoint: str  # CHAT or COMPLETIONS
    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # the client asked for the usage chunk (stream_options.include_usage)
    max_tokens: int | None
    prompt_bytes: int  # UTF-8 bytes of the prompt text (messages' text content)
    n_messages: int
    prompt_token_ids: int  # completions given as token ids: their exact count
    prompt_ascii: bool = True  # every character of the prompt text is ASCII
    # what the engine runs (token-pool admission charges it): the prompts of a batched
    # completion, and per prompt n sequences (best_of when larger)
    prompts: int = 1
    choices: int = 1


def _count(body: dict[str, Any], key: str) -> int:
    """A positive integer `key`, else 1 (the engine answers a bad one with its own 400)."""
    v = body.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 1


def _text_bytes(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


class _Text:
    """UTF-8 bytes of the prompt's text, and whether all of it is ASCII (str.isascii() is
    O(1) in CPython): non-ASCII text can pack fewer bytes into a token than any bound
    the budget's fast path assumes for ASCII."""

    __slots__ = ("ascii", "bytes")

    def __init__(self) -> None:
        self.bytes = 0
        self.ascii = True

    def add(self, s: str) -> None:
        if s.isascii():
            self.bytes += len(s)
        else:
            self.ascii = False
            self.bytes += len(s.encode("utf-8", "surrogatepass"))


def _content_bytes(content: Any, where: str, text: _Text) -> None:
    if content is None:
        return
    if isinstance(content, str):
        text.add(content)
        return
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                raise InvalidRequest(f"{where} parts must be objects", param=where)
            value = part.get("text")
            if isinstance(value, str):
                text.add(value)
        return
    raise InvalidRequest(f"{where} must be a string, a list of content parts or null", param=where)


# The largest integer the gateway takes where a count or token id is expected (the
# documented schema's maximum; no engine takes more).
MAX_INT = 2**31 - 1


def _is_int(v: Any) -> bool:
    """A JSON integer: 5 or 5.0 (JSON Schema and the engines' pydantic take both), not true."""
    if isinstance(v, int):
        return not isinstance(v, bool)
    return isinstance(v, float) and v.is_integer()


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v):
        raise InvalidRequest(f"'{key}' must be an integer, got {type(v).__name__}", param=key)
    n = int(v)
    if n < 1:
        raise InvalidRequest(f"'{key}' must be at least 1, got {v}", param=key)
    if n > MAX_INT:
        raise InvalidRequest(f"'{key}' must be at most {MAX_INT}, got {v}", param=key)
    return n


def _token_ids(items: list[Any]) -> bool:
    return all(_is_int(t) and 0 <= t <= MAX_INT for t in items)


def parse(raw: bytes, endpoint: str) -> ParsedRequest:
    if not raw:
        raise InvalidRequest("the request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")

    model = body.get("model")
    if model is None:
        raise InvalidRequest("'model' is required", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string", param="model")

    stream = body.get("stream")
    if stream is None:
        stream = False
    elif not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", param="stream")
    opts = body.get("stream_options")
    wants_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise InvalidRequest("'stream_options' must be an object", param="stream_options")
        if not stream:  # vLLM's rule, refused before a worker is chosen
            raise InvalidRequest(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        wants_usage = opts.get("include_usage") is True

    max_tokens = _positive_int(body, "max_tokens")
    if endpoint == CHAT:
        mct = _positive_int(body, "max_completion_tokens")
        if mct is not None:
            max_tokens = mct

    text = _Text()
    prompt_bytes = 0
    n_messages = 0
    token_ids = 0
    prompts = 1
    if endpoint == CHAT:
        messages = body.get("messages")
        if messages is None:
            raise InvalidRequest("'messages' is required", param="messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("'messages' must be a non-empty list", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
            role = m.get("role")
            if not isinstance(role, str) or not role:
                raise InvalidRequest(
                    f"messages[{i}].role must be a non-empty string", param=f"messages[{i}].role"
                )
            _content_bytes(m.get("content"), f"messages[{i}].content", text)
            if m.get("tool_calls"):  # rendered into the prompt by every chat template
                text.add(orjson.dumps(m["tool_calls"]).decode())
        for key in ("tools", "tool_choice"):  # tool schemas are prompt text too
            if body.get(key) is not None and not isinstance(body[key], str):
                text.add(orjson.dumps(body[key]).decode())
        n_messages = len(messages)
        prompt_bytes = text.bytes
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise InvalidRequest("'prompt' is required", param="prompt")
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequest("'prompt' must not be empty", param="prompt")
            text.add(prompt)
            prompt_bytes = text.bytes
        elif isinstance(prompt, list) and prompt:
            if all(isinstance(p, str) for p in prompt):
                prompt_bytes = max(_text_bytes(p) for p in prompt)
                text.ascii = all(p.isascii() for p in prompt)
                prompts = len(prompt)
            elif _token_ids(prompt):
                token_ids = len(prompt)
            elif all(isinstance(p, list) and p and _token_ids(p) for p in prompt):
                token_ids = max(len(p) for p in prompt)
                prompts = len(prompt)
            else:
                raise InvalidRequest(
                    "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists",
                    param="prompt",
                )
        else:
            raise InvalidRequest("'prompt' must be a non-empty string or list", param="prompt")
    choices = 1
    if "n" in body or "best_of" in body:  # (most requests ask for one: no lookups then)
        choices = max(_count(body, "n"), _count(body, "best_of"))
    return ParsedRequest(
        endpoint,
        body,
        model,
        stream,
        wants_usage,
        max_tokens,
        prompt_bytes,
        n_messages,
        token_ids,
        text.ascii,
        prompts,
        choices,
    )
