"""A pool's capacity in inference-native units (the token-pools paper, §3.1).

Three resources, each a different constraint:
- token throughput Λ (tokens/s): how fast work advances; a request's nominal cost is
  n_in + n_out (prefill and decode weigh differently on a GPU; the paper's approximation
  suffices for admission);
- KV cache χ (bytes): how much attention state may exist at once. A token costs
  c = 2·L·H_kv·d_h·b bytes (keys and values, L layers, H_kv key-value heads of dimension
  d_h, b bytes an element), so a sequence of context S holds χ = S·c;
- concurrency r (slots): sequences resident at once; for a GPU with KV budget χ_gpu and
  sequences of length S, r_max = ⌊χ_gpu / (S·c)⌋.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KvGeometry:
    """The model's attention shape: what one token of context costs in KV cache."""

    layers: int  # L
    kv_heads: int  # H_kv (grouped-query attention: fewer than the query heads)
    head_dim: int  # d_h
    dtype_bytes: float = 2.0  # b: 2 for fp16/bf16, 1 for fp8

    def __post_init__(self) -> None:
        if min(self.layers, self.kv_heads, self.head_dim) < 1 or self.dtype_bytes <= 0:
            raise ValueError(
                "KV geometry: layers, kv_heads, head_dim and dtype_bytes must be positive"
            )

    @property
    def bytes_per_token(self) -> int:
        """c = 2·L·H_kv·d_h·b (the 2: one key and one value vector per head)."""
        return int(2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes)


def max_concurrency(kv_budget_bytes: int, context_tokens: int, bytes_per_token: int) -> int:
    """r_max = ⌊χ_gpu / (S·c)⌋: sequences of length S that fit in a KV budget."""
    if context_tokens < 1 or bytes_per_token < 1:
        raise ValueError("context_tokens and bytes_per_token must be positive")
    return kv_budget_bytes // (context_tokens * bytes_per_token)


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    """What a pool offers: Λ_p tokens/s, χ_p KV bytes, r_p slots; and the KV cost of a
    token of its model, so that a request's KV footprint is (prompt + max_tokens)·c."""

    tokens_per_s: float  # Λ_p: backend replicas × per-replica throughput
    kv_bytes: int  # χ_p
    slots: int  # r_p
    bytes_per_token: int  # c of the pool's model
    # the throughput budget's depth: a burst may spend this many seconds of Λ_p at once
    window_s: float = 60.0
    # a request's typical length: the Retry-After of a refusal that waits for one to end,
    # until the pool has observed real latencies
    typical_request_s: float = 1.0

    def __post_init__(self) -> None:
        if self.tokens_per_s <= 0 or self.kv_bytes < 1 or self.slots < 1:
            raise ValueError("pool capacity: tokens_per_s, kv_bytes and slots must be positive")
        if self.bytes_per_token < 1 or self.window_s <= 0 or self.typical_request_s <= 0:
            raise ValueError(
                "pool capacity: bytes_per_token, window_s and typical_request_s must be positive"
            )

    def kv_of(self, tokens: int) -> int:
        """χ = S·c for a sequence of S tokens of context."""
        return tokens * self.bytes_per_token
