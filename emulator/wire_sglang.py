"""SGLang 0.5.23's response shapes (WIRE_SPEC §3–§5).

Ids are 32-hex rids without prefix; `model` echoes the request. Bodies carry
`matched_stop` (the EOS id when generation stopped on EOS, else the matched stop string
or stop token id) and a 6-key usage
(`prompt_tokens, total_tokens, completion_tokens, prompt_tokens_details, reasoning_tokens,
completion_tokens_details`). Chat stream chunks (msgspec) always carry
`delta.reasoning_content` first and omit `usage` unless continuous stats are on; the
finish reason arrives in its own chunk after the last content chunk, and empty deltas
are not sent. Completion chunks carry `"usage":null` and the last one holds the finish
reason; the completion usage chunk drops nulls. Errors are flat
`{"object":"error",…,"param":null,"code":N}`; mid-stream ones are nested and spaced.

Logprobs: chat `{"content":[{"token","bytes","logprob","top_logprobs":[…]}]}` on the body
and on each content chunk (a step whose text is empty sends no chunk, so its logprobs
are not sent either, as on SGLang's plain streaming path); completions the legacy lists
with every `text_offset` -1. Streams hold nothing back: a stop string split over several
tokens may show its beginning before the match trims the end (SGLang streams the
detokenizer's text as it comes and trims only the finished output).

Tool calls (`serving_chat.py` `_process_tool_calls` / `_process_tool_call_stream`; the
`ToolCall`, `FunctionResponse`, `DeltaMessage` models of `protocol.py`): the body's message
gets `"content":""` and `"tool_calls":[{"id":"call_<24 hex>","index":0,"type":"function",
"function":{"name":N,"arguments":"<JSON text>"}}]` after `reasoning_content`; `finish_reason`
`tool_calls`, `matched_stop` null. A stream sends pydantic chunks (every delta key, nulls
kept, `"usage":null` last): first the call's id, index, type and name with `"arguments":""`
(the parser names the function before its arguments), then `{"id":null,…,"name":null,
"arguments":"<part>"}` per step with new arguments, then the usual finish chunk with
`finish_reason` `tool_calls` and the engine's own `matched_stop`. Ids are made here, one per
call, as SGLang's `_process_tool_call_id` does at serving time (`call_` + `uuid4().hex[:24]`).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from emulator.chat_template import EOS
from emulator.schema import ApiError
from emulator.wire import Choice, Head, TokenLogprob, ToolCall, Usage, dumps, sse, sse_spaced
from emulator.wire_vllm import completion_logprobs


def _matched(c: Choice) -> int | str | None:
    if c.finish_reason != "stop":
        return None
    if c.stop_reason is not None:
        return c.stop_reason
    return EOS if c.stopped_on_eos else None


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _tool_call(call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    """protocol.py `ToolCall`: id, index, type, function (name, arguments)."""
    return {
        "id": call_id,
        "index": 0,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _message(c: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": c.text if c.tool_call is None else "",
        "reasoning_content": None,
    }
    if c.tool_call is not None:
        call = c.tool_call
        message["tool_calls"] = [_tool_call(_call_id(), call.name, call.arguments)]
    return message


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def _chat_logprobs(lps: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    """ChoiceLogprobs: ChatCompletionTokenLogprob / TopLogprob field order is token, bytes,
    logprob (`entrypoints/openai/protocol.py`), unlike vLLM's token, logprob, bytes."""
    if lps is None:
        return None
    return {
        "content": [
            {
                "token": t.token,
                "bytes": _bytes(t.token),
                "logprob": t.logprob,
                "top_logprobs": [
                    {"token": tok, "bytes": _bytes(tok), "logprob": lp} for tok, lp in t.top
                ],
            }
            for t in lps
        ]
    }


def _completion_logprobs(lps: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    """`to_openai_style_logprobs`: text offsets are not supported (-1 each)."""
    return completion_logprobs(lps, 0, unknown_offsets=True)


class SglangWire:
    personality = "sglang"

    def error(self, err: ApiError) -> bytes:
        return dumps(
            {
                "object": "error",
                "message": err.message,
                "type": err.type,
                "param": None,
                "code": err.status,
            }
        )

    def _usage(self, head: Head, u: Usage) -> dict[str, Any]:
        return {
            "prompt_tokens": u.prompt,
            "total_tokens": u.total,
            "completion_tokens": u.completion,
            "prompt_tokens_details": {"cached_tokens": u.cached} if head.cache_report else None,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }

    def full(self, head: Head, choices: list[Choice], usage: Usage) -> bytes:
        if head.chat:
            cs: list[dict[str, Any]] = [
                {
                    "index": c.index,
                    "message": _message(c),
                    "logprobs": _chat_logprobs(c.logprobs),
                    "finish_reason": c.finish_reason,
                    "matched_stop": _matched(c),
                }
                for c in choices
            ]
        else:
            cs = [
                {
                    "index": c.index,
                    "text": c.text,
                    "logprobs": _completion_logprobs(c.logprobs),
                    "finish_reason": c.finish_reason,
                    "matched_stop": _matched(c),
                }
                for c in choices
            ]
        return dumps(
            {
                "id": head.id,
                "object": "chat.completion" if head.chat else "text_completion",
                "created": head.created,
                "model": head.model,
                "choices": cs,
                "usage": self._usage(head, usage),
                "metadata": {"weight_version": "default"},
            }
        )

    def _chunk(self, head: Head, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": head.id,
            "object": "chat.completion.chunk" if head.chat else "text_completion",
            "created": head.created,
            "model": head.model,
            "choices": choices,
        }

    def role(self, head: Head, index: int, usage: Usage) -> bytes:
        choice = {
            "index": index,
            "delta": {"reasoning_content": None, "role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
            "matched_stop": None,
        }
        return sse(self._chunk(head, [choice]))

    def delta(self, head: Head, choice: Choice, usage: Usage) -> bytes:
        if not head.chat:
            chunk = self._chunk(
                head,
                [
                    {
                        "index": choice.index,
                        "text": choice.text,
                        "logprobs": _completion_logprobs(choice.logprobs),
                        "finish_reason": choice.finish_reason,
                        "matched_stop": _matched(choice),
                    }
                ],
            )
            chunk["usage"] = self._usage(head, usage) if head.continuous_usage else None
            return sse(chunk)
        out = b""
        if choice.tool_call is not None:
            out = self._tool_chunks(head, choice.index, choice.tool_call, usage)
        if choice.text:
            chunk = self._chunk(
                head,
                [
                    {
                        "index": choice.index,
                        "delta": {"reasoning_content": None, "content": choice.text},
                        "logprobs": _chat_logprobs(choice.logprobs),
                        "finish_reason": None,
                        "matched_stop": None,
                    }
                ],
            )
            if head.continuous_usage:
                chunk["usage"] = self._usage(head, usage)
            out = sse(chunk)
        if choice.finish_reason is not None:
            # a stream keeps the engine's matched stop when a call turns "stop" into
            # "tool_calls" (the body drops it)
            ended = replace(choice, finish_reason="stop") if choice.tool_call else choice
            out += sse(
                self._chunk(
                    head,
                    [
                        {
                            "index": choice.index,
                            "delta": {"reasoning_content": None},
                            "logprobs": None,
                            "finish_reason": choice.finish_reason,
                            "matched_stop": _matched(ended),
                        }
                    ],
                )
            )
        return out

    def _tool_chunks(self, head: Head, index: int, call: ToolCall, usage: Usage) -> bytes:
        """One step of a call: its opening (id, name, no arguments yet) when it opens, and
        the arguments this step added — pydantic `ChatCompletionStreamResponse` chunks."""
        calls = []
        if call.first:
            calls.append(_tool_call(_call_id(), call.name, ""))
        if call.arguments:
            calls.append(_tool_call(None, None, call.arguments))
        out = b""
        for c in calls:
            chunk = self._chunk(
                head,
                [
                    {
                        "index": index,
                        "delta": {
                            "role": None,
                            "content": None,
                            "reasoning_content": None,
                            "tool_calls": [c],
                        },
                        "logprobs": None,
                        "finish_reason": None,
                        "matched_stop": None,
                    }
                ],
            )
            chunk["usage"] = self._usage(head, usage) if head.continuous_usage else None
            out += sse(chunk)
        return out

    def usage_chunk(self, head: Head, usage: Usage) -> bytes:
        u = self._usage(head, usage)
        if not head.chat:
            u = {k: v for k, v in u.items() if v is not None}
        chunk = self._chunk(head, [])
        chunk["usage"] = u
        return sse(chunk)

    def stream_error(self, head: Head, err: ApiError) -> bytes:
        return sse_spaced(
            {
                "error": {
                    "object": "error",
                    "message": err.message,
                    "type": err.type,
                    "param": None,
                    "code": err.status,
                }
            }
        )

    def models(self, names: tuple[str, ...], root: str, max_model_len: int, now: int) -> bytes:
        return dumps({"object": "list", "data": [self.model_card(names[0], max_model_len, now)]})

    def model_card(self, name: str, max_model_len: int, now: int) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": now,
            "owned_by": "sglang",
            "root": name,
            "parent": None,
            "max_model_len": max_model_len,
        }

    def tokenize(self, tokens: list[int], max_model_len: int, strs: list[str] | None) -> bytes:
        return dumps({"tokens": tokens, "count": len(tokens), "max_model_len": max_model_len})

    def detokenize(self, text: str) -> bytes:
        return dumps({"text": text})
