"""Token budget estimation: L_total = ⌈bytes / ĉ_k⌉ + max_tokens (FleetOpt §2.1).

The gateway must know how many tokens a request takes before any engine has seen it,
without paying for a tokenizer on every request. It divides the UTF-8 byte count of
the prompt's content by ĉ_k, a bytes-per-token estimate for the request's content
category k (compressor/content.py; categories differ: bench/budget_accuracy.py learns
~4.3 bytes/token for indented Python source and ~3.6–4.0 for documentation prose, RAG
and chat), adds the template's overhead (per message, reply header and BOS: the
emulated engine's Llama-3 layout, compressor/template.py), and adds L_out =
max_tokens, or `default_max_tokens` when the client sets none.

Gateway use: `size = measure_chat(messages)` (or `measure_prompt(prompt)`);
`BudgetEstimator.estimate(size, category, max_tokens)` → `Budget` (L_in, L_out, `.total`);
after the response, `BudgetEstimator.observe(size_sent, category, usage.prompt_tokens)` with
the size of what was actually sent (the compressed request, if it was compressed).

ĉ_k learns from the engines: after each request the gateway calls `observe` with the
prompt_tokens the engine reported. The state keeps exponential moving averages of bytes
and of content tokens (prompt_tokens − template overhead) per category and uses their
ratio, so a large request weighs more than a small one. The first observations of a
category are averaged with weight 1/n until n reaches 1/α (the usual bias-corrected
warm-up), so ĉ_k leaves the prior after a handful of requests instead of ~1/α of them.

Where a budget must be exact — the compressor's target T_c — the gateway does not use
this estimate: the compressor counts with cl100k through the same template as the engine
(compressor/compress.py). Failure posture: an implausible observation (ratio outside
[`min_ratio`, `max_ratio`], or too few content tokens to measure) is ignored and counted
in `BytesPerToken.rejected`; estimates never fail and are always ≥ 1 token per non-empty
content.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compressor.template import call_json, content_text, tool_calls, tool_json
from policies.types import Category


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    bytes_per_token: float = 4.0  # prior ĉ: cl100k on English prose averages ~4 bytes per token
    message_overhead: int = (
        5  # Llama-3 template: 3 specials, the role, "\n\n" (compressor/template.py)
    )
    reply_overhead: int = 5  # BOS and the reply header (2 specials, "assistant", "\n\n")
    prompt_overhead: int = 1  # a completion prompt: BOS
    default_max_tokens: int = 256  # L_out assumed when the client sets no max_tokens
    ema_alpha: float = 0.05  # one observation's weight in ĉ_k once warm: ~20 requests of memory
    category_priors: Mapping[Category, float] = field(
        default_factory=dict, hash=False
    )  # ĉ_k priors
    min_ratio: float = 1.0  # bytes/token below this is not text (a token is ≥ 1 byte)
    max_ratio: float = 16.0  # above this the engine's count cannot be this request's
    min_tokens: int = 16  # fewer content tokens than this measure the template, not ĉ_k

    def __post_init__(self) -> None:
        if not 0 < self.ema_alpha <= 1:
            raise ValueError(f"ema_alpha must be in (0, 1]: {self.ema_alpha}")
        if self.bytes_per_token <= 0 or any(v <= 0 for v in self.category_priors.values()):
            raise ValueError("bytes-per-token priors must be positive")

    def prior(self, category: Category) -> float:
        return self.category_priors.get(category, self.bytes_per_token)


@dataclass(frozen=True, slots=True)
class Budget:
    prompt_tokens: int
    max_tokens: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass(frozen=True, slots=True)
class ChatSize:
    """What the estimate needs from a request: content bytes and message count (0 for a
    completion prompt, which has no template)."""

    content_bytes: int
    n_messages: int


def text_bytes(text: str) -> int:
    """UTF-8 length without encoding ASCII text (str.isascii() is O(1) in CPython)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def measure_chat(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
) -> ChatSize:
    """Bytes of the text a chat template renders: contents, assistant `tool_calls` and the
    request's `tools` (as compact JSON, compressor/template.py's `call_json`/`tool_json`)."""
    n = sum(text_bytes(content_text(m.get("content"))) for m in messages)
    n += sum(text_bytes(call_json(c)) for m in messages for c in tool_calls(m))
    n += sum(text_bytes(tool_json(t)) for t in tools)
    return ChatSize(n, len(messages))


def measure_prompt(prompt: str) -> ChatSize:
    return ChatSize(text_bytes(prompt), 0)


def template_tokens(n_messages: int, config: BudgetConfig) -> int:
    """Tokens the template adds around `n_messages` messages (0: a completion prompt)."""
    if n_messages <= 0:
        return config.prompt_overhead
    return n_messages * config.message_overhead + config.reply_overhead


def estimate_tokens(n_bytes: int, config: BudgetConfig, ratio: float | None = None) -> int:
    """⌈bytes / ĉ⌉: tokens a text of `n_bytes` UTF-8 bytes is estimated to take."""
    return math.ceil(n_bytes / (ratio or config.bytes_per_token))


def estimate_chat(
    content_bytes: int, n_messages: int, config: BudgetConfig, ratio: float | None = None
) -> int:
    """Prompt tokens of a request: content plus the template around each message (or
    BOS for a completion prompt, `n_messages` = 0)."""
    return estimate_tokens(content_bytes, config, ratio) + template_tokens(n_messages, config)


@dataclass
class _Average:
    bytes: float = 0.0
    tokens: float = 0.0
    n: int = 0


@dataclass
class BytesPerToken:
    """ĉ_k per content category: the learnt state (one per gateway process; soft state)."""

    config: BudgetConfig = field(default_factory=BudgetConfig)
    rejected: int = 0
    _avg: dict[Category, _Average] = field(default_factory=dict)

    def ratio(self, category: Category) -> float:
        avg = self._avg.get(category)
        if avg is None or avg.tokens <= 0:
            return self.config.prior(category)
        return avg.bytes / avg.tokens

    def observations(self, category: Category) -> int:
        avg = self._avg.get(category)
        return 0 if avg is None else avg.n

    def observe(
        self, category: Category, content_bytes: int, n_messages: int, prompt_tokens: int
    ) -> bool:
        """Learn from one request the engine counted; False if the sample was ignored."""
        tokens = prompt_tokens - template_tokens(n_messages, self.config)
        if tokens < self.config.min_tokens or content_bytes <= 0:
            self.rejected += 1
            return False
        ratio = content_bytes / tokens
        if not self.config.min_ratio <= ratio <= self.config.max_ratio:
            self.rejected += 1
            return False
        avg = self._avg.setdefault(category, _Average())
        avg.n += 1
        alpha = max(self.config.ema_alpha, 1.0 / avg.n)
        avg.bytes += alpha * (content_bytes - avg.bytes)
        avg.tokens += alpha * (tokens - avg.tokens)
        return True

    def snapshot(self) -> dict[str, float]:
        """ĉ_k per category (for metrics and the admin API)."""
        return {c.value: self.ratio(c) for c in Category}


@dataclass
class BudgetEstimator:
    """A request's token budget (L_in, L_out) estimated before any engine saw it, and
    ĉ_k learnt from what the engines counted after: `estimate` before placement,
    `observe` after the answer. (Not the token pools' `token_budget` admission check,
    policies/tenancy/ledger.py, which is a tenant's rate of tokens.)"""

    config: BudgetConfig = field(default_factory=BudgetConfig)
    state: BytesPerToken = field(init=False)

    def __post_init__(self) -> None:
        self.state = BytesPerToken(self.config)

    def estimate(self, size: ChatSize, category: Category, max_tokens: int | None) -> Budget:
        """L_in and L_out of a request (L_total = `.total`)."""
        prompt = estimate_chat(
            size.content_bytes, size.n_messages, self.config, self.state.ratio(category)
        )
        out = self.config.default_max_tokens if max_tokens is None else max(int(max_tokens), 0)
        return Budget(prompt, out)

    def observe(self, size: ChatSize, category: Category, prompt_tokens: int) -> bool:
        """Feed back the engine's prompt_tokens for what was actually sent (after any
        compression: measure the compressed request)."""
        return self.state.observe(category, size.content_bytes, size.n_messages, prompt_tokens)
