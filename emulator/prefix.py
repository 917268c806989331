"""Prefix-cache identity of a prompt: chained hashes of its full KV blocks (vLLM's scheme).

Block i covers tokens [i·B, (i+1)·B) and its hash is H(hash_{i-1}, tokens of block i), so
two prompts share the hashes of exactly their common full-block prefix, and a partial
last block never gets a hash (vLLM caches full blocks only). The engine model reuses the
longest run of cached hashes; the gateway's cache-aware router can compute the same
chain from the same token ids.

Python's hash of a tuple of ints is deterministic across processes (no hash
randomisation for ints), so hashes are stable between runs.
"""

from __future__ import annotations

from collections.abc import Sequence

_ROOT = 0x5EED  # hash_{-1}: any fixed value; vLLM uses a per-process random seed here


def block_hashes(tokens: Sequence[int], block_size: int = 16) -> tuple[int, ...]:
    """Chained hashes of the full `block_size`-token blocks of `tokens`."""
    out: list[int] = []
    prev = _ROOT
    for start in range(0, len(tokens) - block_size + 1, block_size):
        prev = hash((prev, tuple(tokens[start : start + block_size])))
        out.append(prev)
    return tuple(out)
