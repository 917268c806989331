"""From an OpenAI request body to an engine plan, as vLLM 0.33 or SGLang 0.5.23 decides it.

WIRE_SPEC §2. A request becomes one `SeqPlan` per output choice (chat: n; completions:
n per prompt, choice index = prompt_idx·n + i), each with its prompt length P, the
prompt's block hashes, the effective max_tokens and the natural output length.

vLLM 0.33 (L = max_model_len, M = max_completion_tokens or max_tokens):
  schema → stream_options without stream → unknown model (404) → M > L → P > L →
  temperature/top_p/n → effective max = min(M, L − P), absent M ⇒ L − P (chat) or 16
  (completions); an effective max < 1 is an error. Oversized M is clamped silently.
SGLang 0.5.23: model unchecked and echoed ("default" when absent); empty messages /
  prompt → 400; M ≤ 0 → schema 400; P ≥ L → 400; P + M > L → 400 (no clamping);
  absent M ⇒ L − 1 − P.

Failure posture: every refusal is an `ApiError`/`SchemaError` raised before anything
reaches the engine, so a refused request never shows in running/waiting.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compressor.hf_template import TemplateError
from emulator.chat_template import render_chat, render_completion
from emulator.prefix import block_hashes
from emulator.sampling import Outcome, OutputModel, plan_outcome
from emulator.schema import COERCE, ApiError, FieldError, SchemaError, check
from emulator.tools import ToolPlan, plan_tool

MAX_STOP_STRINGS = 4  # vLLM's VLLM_MAX_STOP_STRINGS
MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
VOCAB_SIZE = 100262  # the emulated vocabulary: cl100k's 100256 + 6 ids (specials)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What request handling needs to know about the emulated server."""

    personality: str  # "vllm" | "sglang"
    served_names: tuple[str, ...]
    root: str  # --model path
    max_model_len: int
    block_size: int = 16
    output: OutputModel = field(default_factory=OutputModel)


@dataclass(frozen=True, slots=True)
class SeqPlan:
    index: int  # choice index
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    max_tokens: int  # effective, fits the context
    outcome: Outcome  # how it ends: tokens the engine generates (EOS included), text, reason
    key: int = 0  # names the choice: its logprobs derive from it
    token_ids: Sequence[int] = ()  # the prompt's ids (the engine's KV events carry a block's)

    @property
    def output_tokens(self) -> int:
        return self.outcome.tokens


@dataclass(frozen=True, slots=True)
class GenPlan:
    kind: str  # "chat" | "completion"
    response_id: str
    model: str  # the `model` every response carries
    stream: bool
    include_usage: bool
    continuous_usage: bool
    n: int
    seqs: tuple[SeqPlan, ...]
    prompt_tokens: int  # usage.prompt_tokens (summed over prompts)
    max_tokens_param: int | None  # what the client asked for (metrics)
    top_n: int | None = None  # logprobs: entries in each token's top list; None: no logprobs
    holdback: int = 0  # characters a stream holds back while stop strings may still match
    tool: ToolPlan | None = None  # every choice answers with this tool call (emulator/tools.py)


_COMMON = {
    "model": ("str", False),
    "stream": ("bool", False),
    "stream_options": ("dict", False),
    "max_tokens": ("int", False),
    "n": ("int", False),
    "temperature": ("float", False),
    "top_p": ("float", False),
    "seed": ("int", False),
    "ignore_eos": ("bool", False),
    "min_tokens": ("int", False),
    "stop_token_ids": ("list", False),
}
_CHAT_FIELDS = {
    "messages": ("list", True),
    **_COMMON,
    "max_completion_tokens": ("int", False),
    "logprobs": ("bool", False),
    "top_logprobs": ("int", False),
}
_COMPLETION_FIELDS = {"prompt": ("any", True), **_COMMON, "logprobs": ("int", False)}


def random_id(info: ModelInfo) -> str:
    """vLLM 0.33's random_uuid() is 16 hex chars; SGLang's rid is uuid4().hex."""
    return secrets.token_hex(8) if info.personality == "vllm" else uuid.uuid4().hex


def plan(kind: str, body: Any, headers: Mapping[str, str], info: ModelInfo) -> GenPlan:
    """Validate a chat/completion body and plan its engine requests; raises on refusal."""
    fields = dict(_CHAT_FIELDS if kind == "chat" else _COMPLETION_FIELDS)
    fields.pop("prompt", None)  # validated by _prompts (a union type)
    b = check(body, fields, list_items={"messages": "dict", "stop_token_ids": "int"})
    stop = _stop(b, info)
    stop_ids = tuple(COERCE["int"](t) for t in b.get("stop_token_ids") or ())
    if kind == "completion" and "prompt" not in b:
        raise SchemaError([FieldError("missing", ("body", "prompt"), "Field required", body)])
    vllm = info.personality == "vllm"
    stream = bool(b.get("stream") or False)
    opts = b.get("stream_options")
    if vllm and opts is not None and not stream:
        raise ApiError(
            400,
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            "BadRequestError",
            "stream_options",
        )
    if vllm and kind == "chat":
        _vllm_chat_logprobs(b)
    model = _model(b.get("model"), info)
    n_req = b.get("n")
    n = max(1, n_req) if n_req is not None else 1
    field, m = _requested_max(kind, b)
    if not vllm and m is not None and m <= 0:
        raise SchemaError(
            [
                FieldError(
                    "value_error",
                    ("body", field),
                    f"Value error, {field} must be positive",
                    m,
                    {"error": ValueError(f"{field} must be positive")},
                )
            ]
        )
    if vllm and m is not None and m > info.max_model_len and b.get(field) is not None:
        raise ApiError(
            400,
            f"{field}={m} cannot be greater than max_model_len={info.max_model_len}."
            f" Please request fewer output tokens. (parameter={field}, value={m})",
            "BadRequestError",
            field,
        )
    prompts = _prompts(kind, b, info)
    if vllm:
        _vllm_sampling(b)
        if stop and not all(stop):
            raise ApiError(400, "stop cannot contain an empty string.", "BadRequestError")
    top_n = _top_n(kind, b, vllm)
    seqs: list[SeqPlan] = []
    for p_idx, (ids, from_text) in enumerate(prompts):
        max_tokens = _effective_max(kind, len(ids), m, from_text, info)
        hashes = block_hashes(ids, info.block_size)
        for i in range(n):
            natural = info.output.natural_length(ids, i, b.get("seed"))
            out = plan_outcome(
                natural,
                max_tokens,
                ignore_eos=bool(b.get("ignore_eos")),
                min_tokens=b.get("min_tokens") or 0,
                stop=stop,
                stop_token_ids=stop_ids,
                vllm=vllm,
            )
            key = info.output.choice_key(ids, i, b.get("seed"))
            seqs.append(SeqPlan(p_idx * n + i, len(ids), hashes, max_tokens, out, key, ids))
    opts = opts or {}
    include_usage = bool(opts.get("include_usage"))
    rid = _request_id(b, headers, info)
    prefix = "" if not vllm else ("chatcmpl-" if kind == "chat" else "cmpl-")
    return GenPlan(
        kind=kind,
        response_id=prefix + rid,
        model=model,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=include_usage and bool(opts.get("continuous_usage_stats")),
        n=n,
        seqs=tuple(seqs),
        prompt_tokens=sum(len(ids) for ids, _ in prompts),
        max_tokens_param=m,
        top_n=top_n,
        holdback=max(len(s) for s in stop) - 1 if vllm and stop else 0,
        tool=plan_tool(b, vllm) if kind == "chat" else None,
    )


def _stop(b: Mapping[str, Any], info: ModelInfo) -> tuple[str, ...]:
    """`stop`: a string or a list of strings (vLLM: at most 4), as pydantic checks the union
    `str | list[str] | None`: a failure reports both members (`stop.str`, `stop.list[str]`)."""
    value = b.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    as_str = FieldError(
        "string_type", ("body", "stop", "str"), "Input should be a valid string", value
    )
    if not isinstance(value, list):
        raise SchemaError(
            [
                as_str,
                FieldError(
                    "list_type",
                    ("body", "stop", "list[str]"),
                    "Input should be a valid list",
                    value,
                ),
            ]
        )
    bad = [
        FieldError(
            "string_type", ("body", "stop", "list[str]", i), "Input should be a valid string", x
        )
        for i, x in enumerate(value)
        if not isinstance(x, str)
    ]
    if bad:
        raise SchemaError([as_str, *bad])
    if info.personality == "vllm" and len(value) > MAX_STOP_STRINGS:
        too_long = FieldError(
            "too_long",
            ("body", "stop", "list[str]"),
            f"List should have at most {MAX_STOP_STRINGS} items after validation, not {len(value)}",
            value,
            {"field_type": "List", "max_length": MAX_STOP_STRINGS, "actual_length": len(value)},
        )
        raise SchemaError([as_str, too_long])
    return tuple(value)


def _vllm_chat_logprobs(b: Mapping[str, Any]) -> None:
    """vLLM's ChatCompletionRequest.check_logprobs (a before-validator)."""
    top = b.get("top_logprobs")
    if top is None:
        return
    if top < 0 and top != -1:
        raise _param("top_logprobs", "`top_logprobs` must be a positive value or -1.", top)
    if (top == -1 or top > 0) and not b.get("logprobs"):
        raise ApiError(
            400,
            "when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
            "BadRequestError",
            "top_logprobs",
        )


def _top_n(kind: str, b: Mapping[str, Any], vllm: bool) -> int | None:
    """Entries of each token's top list, or None without logprobs.

    vLLM: chat `logprobs: true` + `top_logprobs` N (default 0) → N entries; completions
    `logprobs: N` → the sampled token plus the top N, deduplicated: max(N, 1) entries
    since the emulated model always says its most likely token. N > --max-logprobs (20)
    is refused by SamplingParams._validate_logprobs. SGLang: N entries, no cap.
    """
    if kind == "chat":
        if not b.get("logprobs"):
            return None
        n = b.get("top_logprobs") or 0
    else:
        if b.get("logprobs") is None:
            return None
        n = b["logprobs"]
    if vllm:
        if n < 0 and n != -1:
            raise _param("logprobs", f"logprobs must be non-negative or -1, got {n}.", n)
        asked = VOCAB_SIZE if n == -1 else n
        if asked > MAX_LOGPROBS:
            raise _param(
                "logprobs",
                f"Requested sample logprobs of {asked}, which is greater than max allowed:"
                f" {MAX_LOGPROBS}",
                asked,
            )
        return n if kind == "chat" else max(n, 1)
    return max(n, 0)


def _model(requested: str | None, info: ModelInfo) -> str:
    if info.personality == "sglang":
        return requested if requested is not None else "default"
    if requested and requested not in info.served_names:
        raise ApiError(
            404,
            f"The model `{requested}` does not exist. Valid aliases: {', '.join(info.served_names)}.",
            "NotFoundError",
            "model",
        )
    return info.served_names[0]


def _requested_max(kind: str, b: Mapping[str, Any]) -> tuple[str, int | None]:
    if kind == "chat":
        if b.get("max_completion_tokens") is not None:
            return "max_completion_tokens", b["max_completion_tokens"]
        return "max_tokens", b.get("max_tokens")
    m = b.get("max_tokens")
    return "max_tokens", 16 if m is None else m


def _prompts(kind: str, b: Mapping[str, Any], info: ModelInfo) -> list[tuple[list[int], bool]]:
    """Token ids of each prompt, and whether they came from text."""
    vllm = info.personality == "vllm"
    if kind == "chat":
        messages = b["messages"]
        if not messages and not vllm:
            raise ApiError(400, "Messages cannot be empty.", "BadRequestError")
        try:
            ids = render_chat(messages, bool(b.get("add_generation_prompt", True)), b.get("tools"))
            return [(ids, True)]
        except TemplateError as exc:
            raise ApiError(400, str(exc), "BadRequestError") from None
        except TypeError as exc:
            raise SchemaError(
                [FieldError("value_error", ("body", "messages"), str(exc), messages)]
            ) from None
    prompt = b["prompt"]
    add_special = bool(b.get("add_special_tokens", True))
    if prompt == "" or prompt == []:
        if vllm:
            raise ApiError(
                400,
                "Either prompt or prompt_embeds must be provided and non-empty.",
                "BadRequestError",
            )
        raise ApiError(400, "Prompt cannot be empty", "BadRequestError")
    if isinstance(prompt, str):
        return [(render_completion(prompt, add_special), True)]
    if isinstance(prompt, list):
        if all(isinstance(p, str) for p in prompt):
            return [(render_completion(p, add_special), True) for p in prompt]
        if all(_is_ids(p) for p in prompt):
            return [(list(prompt), False)]
        if all(isinstance(p, list) and p and all(_is_ids(x) for x in p) for p in prompt):
            return [(list(p), False) for p in prompt]
    raise SchemaError(
        [FieldError("string_type", ("body", "prompt"), "Input should be a valid string", prompt)]
    )


def _is_ids(p: Any) -> bool:
    return isinstance(p, int) and not isinstance(p, bool) and p >= 0


def _effective_max(kind: str, p: int, m: int | None, from_text: bool, info: ModelInfo) -> int:
    lim = info.max_model_len
    if info.personality == "vllm":
        if p > lim:
            shown, at_least = (lim + 1, "at least ") if from_text else (p, "")
            raise ApiError(
                400,
                f"This model's maximum context length is {lim} tokens. However, your prompt"
                f" contains {at_least}{shown} input tokens, which exceeds this limit even without"
                " any output tokens. Please reduce the length of the input prompt."
                f" (parameter=input_tokens, value={shown})",
                "BadRequestError",
                "input_tokens",
            )
        eff = lim - p if m is None else min(m, lim - p)
        if eff < 1:
            raise ApiError(
                400,
                f"max_tokens must be at least 1, got {eff}. (parameter=max_tokens, value={eff})",
                "BadRequestError",
                "max_tokens",
            )
        return eff
    if p >= lim:
        raise ApiError(
            400,
            f"The input ({p} tokens) is longer than the model's context length ({lim} tokens).",
            "BadRequestError",
        )
    if m is not None and p + m > lim:
        raise ApiError(
            400,
            f"Requested token count exceeds the model's maximum context length of {lim} tokens."
            f" You requested a total of {p + m} tokens: {p} tokens from the input messages and"
            f" {m} tokens for the completion. Please reduce the number of tokens in the input"
            " messages or the completion to fit within the limit.",
            "BadRequestError",
        )
    return m if m is not None else max(1, lim - 1 - p)


def _vllm_sampling(b: Mapping[str, Any]) -> None:
    t = b.get("temperature")
    if t is not None and not 0.0 <= t <= 2.0:
        raise _param("temperature", f"temperature must be in [0, 2], got {t}.", t)
    top_p = b.get("top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise _param("top_p", f"top_p must be in (0, 1], got {top_p}.", top_p)
    n = b.get("n")
    if n is not None and n < 1:
        raise _param("n", f"n must be at least 1, got {n}.", n)


def _param(name: str, text: str, value: object) -> ApiError:
    return ApiError(400, f"{text} (parameter={name}, value={value})", "BadRequestError", name)


def _request_id(b: Mapping[str, Any], headers: Mapping[str, str], info: ModelInfo) -> str:
    if info.personality == "vllm":
        rid = headers.get("X-Request-Id") or b.get("request_id")
    else:
        rid = b.get("rid")
    return rid if isinstance(rid, str) and rid else random_id(info)
