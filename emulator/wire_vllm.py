"""vLLM 0.33's response shapes (WIRE_SPEC §3–§5), byte for byte.

Non-streaming bodies are `model_dump()` of the response models: every field, nulls
included. Stream chunks are `model_dump_json(exclude_unset=True)`, so each kind of chunk
carries exactly the fields vLLM's generator sets on it:

    role chunk     choices[{index, delta{role, content:""}, logprobs, finish_reason}],
                   [usage], prompt_token_ids, prompt_text
    content chunk  choices[{index, delta{content}, logprobs, finish_reason, token_ids}],
                   [usage], kv_transfer_params
    finish chunk   choices[{…, finish_reason, stop_reason, token_ids, weight_versions}],
                   [usage], [system_fingerprint unless include_usage], kv_transfer_params
    usage chunk    choices[], usage{prompt, total, completion[, prompt_tokens_details]},
                   system_fingerprint

`[usage]` is continuous_usage_stats (chat adds completion_tokens_details: null;
completions do not). Mid-stream errors: chat compact, completions with spaces.

`stop_reason` is the matched stop string or stop token id (null on EOS / length).
Logprobs (`vllm/entrypoints/openai/chat_completion/protocol.py`, `completion/protocol.py`;
`_create_chat_logprobs`, `_create_completion_logprobs`): chat
`{"content":[{"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]}]}`
(ChatCompletionLogProb field order: token, logprob, bytes); completions
`{"text_offset","token_logprobs","tokens","top_logprobs":[{token: logprob}]}`, offsets
counted from the text sent before the chunk. Stream chunks carry the logprobs of the
tokens of that step, even while stop-string holdback leaves their text empty.
"""

from __future__ import annotations

import secrets
from typing import Any

from emulator.schema import ApiError
from emulator.wire import Choice, Head, TokenLogprob, Usage, dumps, sse, sse_spaced


def _error_obj(err: ApiError) -> dict[str, Any]:
    return {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.status}
    }


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def _chat_logprobs(lps: tuple[TokenLogprob, ...] | None) -> dict[str, Any] | None:
    if lps is None:
        return None
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": _bytes(t.token),
                "top_logprobs": [
                    {"token": tok, "logprob": lp, "bytes": _bytes(tok)} for tok, lp in t.top
                ],
            }
            for t in lps
        ]
    }


def completion_logprobs(
    lps: tuple[TokenLogprob, ...] | None, offset: int, unknown_offsets: bool = False
) -> dict[str, Any] | None:
    """The legacy completions shape; `unknown_offsets`: every text_offset -1 (SGLang)."""
    if lps is None:
        return None
    offsets: list[int] = []
    for t in lps:
        offsets.append(-1 if unknown_offsets else offset)
        offset += len(t.token)
    return {
        "text_offset": offsets,
        "token_logprobs": [t.logprob for t in lps],
        "tokens": [t.token for t in lps],
        "top_logprobs": [dict(t.top) for t in lps],
    }


def _message(c: Choice) -> dict[str, Any]:
    """ChatMessage.model_dump(): `tool_calls` (between function_call and reasoning) is
    dropped when empty; a tool call's message has content "" (a named or required call)."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": c.text if c.tool_call is None else "",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    call = c.tool_call
    if call is not None:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ]
    message["reasoning"] = None
    return message


def _delta(c: Choice) -> dict[str, Any]:
    """DeltaMessage(exclude_unset): content, or one DeltaToolCall — id, type, index and the
    function's name with the first arguments when it opens, then index and arguments."""
    call = c.tool_call
    if call is None:
        return {"content": c.text}
    if call.first:
        return {
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "index": 0,
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ]
        }
    return {"tool_calls": [{"index": 0, "function": {"arguments": call.arguments}}]}


class VllmWire:
    personality = "vllm"

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint

    # -- plain JSON ---------------------------------------------------------------------

    def error(self, err: ApiError) -> bytes:
        return dumps(_error_obj(err))

    def _usage_full(self, head: Head, u: Usage) -> dict[str, Any]:
        details = (
            {"cached_tokens": u.cached, "created_cache_tokens": None, "multimodal_tokens": None}
            if head.cache_report
            else None
        )
        return {
            "prompt_tokens": u.prompt,
            "total_tokens": u.total,
            "completion_tokens": u.completion,
            "prompt_tokens_details": details,
            "completion_tokens_details": None,
        }

    def full(self, head: Head, choices: list[Choice], usage: Usage) -> bytes:
        if head.chat:
            body: dict[str, Any] = {
                "id": head.id,
                "object": "chat.completion",
                "created": head.created,
                "model": head.model,
                "choices": [
                    {
                        "index": c.index,
                        "message": _message(c),
                        "logprobs": _chat_logprobs(c.logprobs),
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                        "token_ids": None,
                        "routed_experts": None,
                        "weight_versions": None,
                    }
                    for c in choices
                ],
                "service_tier": None,
                "system_fingerprint": self.fingerprint,
                "usage": self._usage_full(head, usage),
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        else:
            body = {
                "id": head.id,
                "object": "text_completion",
                "created": head.created,
                "model": head.model,
                "choices": [
                    {
                        "index": c.index,
                        "text": c.text,
                        "logprobs": completion_logprobs(c.logprobs, c.text_offset),
                        "finish_reason": c.finish_reason,
                        "stop_reason": c.stop_reason,
                        "token_ids": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": None,
                        "routed_experts": None,
                        "weight_versions": None,
                    }
                    for c in choices
                ],
                "service_tier": None,
                "system_fingerprint": self.fingerprint,
                "usage": self._usage_full(head, usage),
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        return dumps(body)

    # -- streaming ----------------------------------------------------------------------

    def _chunk(self, head: Head, choice: dict[str, Any], usage: Usage | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": head.id,
            "object": "chat.completion.chunk" if head.chat else "text_completion",
            "created": head.created,
            "model": head.model,
            "choices": [choice],
        }
        if head.continuous_usage and usage is not None:
            cont: dict[str, Any] = {
                "prompt_tokens": usage.prompt,
                "total_tokens": usage.total,
                "completion_tokens": usage.completion,
            }
            if head.chat:
                cont["completion_tokens_details"] = None
            out["usage"] = cont
        return out

    def role(self, head: Head, index: int, usage: Usage) -> bytes:
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        chunk = self._chunk(head, choice, usage)
        chunk["prompt_token_ids"] = None
        chunk["prompt_text"] = None
        return sse(chunk)

    def delta(self, head: Head, choice: Choice, usage: Usage) -> bytes:
        if head.chat:
            c: dict[str, Any] = {
                "index": choice.index,
                "delta": _delta(choice),
                "logprobs": _chat_logprobs(choice.logprobs),
                "finish_reason": choice.finish_reason,
            }
            if choice.finish_reason is not None:
                c["stop_reason"] = choice.stop_reason
                c["token_ids"] = None
                c["weight_versions"] = None
            else:
                c["token_ids"] = None
        else:
            c = {
                "index": choice.index,
                "text": choice.text,
                "logprobs": completion_logprobs(choice.logprobs, choice.text_offset),
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
                "prompt_token_ids": None,
                "token_ids": None,
                "weight_versions": None,
            }
        chunk = self._chunk(head, c, usage)
        if choice.finish_reason is not None and not head.include_usage:
            chunk["system_fingerprint"] = self.fingerprint
        chunk["kv_transfer_params"] = None
        return sse(chunk)

    def usage_chunk(self, head: Head, usage: Usage) -> bytes:
        u: dict[str, Any] = {
            "prompt_tokens": usage.prompt,
            "total_tokens": usage.total,
            "completion_tokens": usage.completion,
        }
        if head.cache_report:
            u["prompt_tokens_details"] = {"cached_tokens": usage.cached}
        return sse(
            {
                "id": head.id,
                "object": "chat.completion.chunk" if head.chat else "text_completion",
                "created": head.created,
                "model": head.model,
                "choices": [],
                "usage": u,
                "system_fingerprint": self.fingerprint,
            }
        )

    def stream_error(self, head: Head, err: ApiError) -> bytes:
        return sse(_error_obj(err)) if head.chat else sse_spaced(_error_obj(err))

    # -- other endpoints ----------------------------------------------------------------

    def models(self, names: tuple[str, ...], root: str, max_model_len: int, now: int) -> bytes:
        return dumps(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": now,
                        "owned_by": "vllm",
                        "root": root,
                        "parent": None,
                        "max_model_len": max_model_len,
                        "permission": [
                            {
                                "id": "modelperm-" + secrets.token_hex(8),
                                "object": "model_permission",
                                "created": now,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                    for name in names
                ],
            }
        )

    def tokenize(self, tokens: list[int], max_model_len: int, strs: list[str] | None) -> bytes:
        return dumps(
            {
                "count": len(tokens),
                "max_model_len": max_model_len,
                "tokens": tokens,
                "token_strs": strs,
            }
        )

    def detokenize(self, text: str) -> bytes:
        return dumps({"prompt": text})
