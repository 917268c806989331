"""Which prompt blocks this gateway sent to which worker: the cache-aware routers' view of
the engines' prefix caches (docs/CACHE_ROUTING.md).

A prompt is a chain of block hashes: block i's hash covers blocks 0..i (vLLM's prefix-cache
keys, and Dynamo's), so two prompts share exactly the hashes of their common full-block
prefix, and "worker w holds block i" implies it was sent the whole prefix up to i. The
overlap of a request with a worker is the number of its leading blocks the worker was sent
within the TTL — an estimate of the blocks it will not have to prefill there (the engine's
cache is not visible: other replicas' traffic and its own evictions are not in it). This is
Dynamo's "approximate" KV indexer (no KV events), kept current by routing decisions or by
the core's dispatch events (policies/routing/kv_state.py).

Hashes come from one of two places, and one index must hold only one kind:
- `token_block_hashes(token_ids, block_size)`: from the token ids, where the pool's counter
  gives them, with the engine's block size — the same chain as the engine model's cache
  (emulator/prefix.py), so overlaps are counted in real KV blocks;
- `byte_block_hashes(data, block_bytes)`: from the request's bytes when no token ids are at
  hand — chained BLAKE2b-64 of fixed `block_bytes`-byte chunks (full chunks only), stable
  across processes and gateway replicas (unlike Python's salted hash of bytes); a chunk of
  512 bytes is ~128 tokens, so set `block_tokens` to block_bytes / 4 and read overlaps as
  approximate.

Bounds (an unbounded prefix tree is a known out-of-memory bug in a peer): an entry (worker,
block) expires `ttl_s` after it was last sent, and the index never holds more than
`max_blocks` entries after any call returns — the least recently sent entry over all
workers goes first. A request's blocks are touched last to first, so the first blocks of a
prefix are the most recent and are evicted last: what remains of a chain is still a prefix,
which lets `overlap` binary-search it (O(log n) dictionary lookups per worker).

Time: `record` is given `now`; `overlap` and `evict` read the injected `Clock`, or without
one judge the TTL against the latest `now` recorded. Pure: no I/O, no wall clock.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from policies.clock import Clock

_TOKEN_ROOT = 0x5EED  # hash_{-1} of a token chain: emulator/prefix.py's, so the chains agree
_BYTE_ROOT = b"fleetgate-prefix"  # the first link's predecessor in a byte chain


def token_block_hashes(
    token_ids: Sequence[int], block_size: int = 16, parent: int | None = None
) -> tuple[int, ...]:
    """Chained hashes of the full `block_size`-token blocks of `token_ids` (a partial last
    block has none: engines cache full blocks only). The engine model's scheme: Python's
    hash of a tuple of ints is not salted, so the chain is the same in every process.
    `parent`: the hash of the block before the first (None: the chain's root) — to extend
    a chain, as an engine's KV event does."""
    if block_size < 1:
        raise ValueError("block_size: must be >= 1")
    out: list[int] = []
    prev = _TOKEN_ROOT if parent is None else parent
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        prev = hash((prev, tuple(token_ids[start : start + block_size])))
        out.append(prev)
    return tuple(out)


def byte_block_hashes(data: bytes, block_bytes: int = 512) -> tuple[int, ...]:
    """Chained hashes of the full `block_bytes`-byte chunks of `data`, for requests whose
    token ids are unknown: link i = BLAKE2b-64(link i−1 ‖ chunk i), as an unsigned int.
    Deterministic across processes and machines; ~0.5 µs per 512-byte chunk."""
    if block_bytes < 1:
        raise ValueError("block_bytes: must be >= 1")
    out: list[int] = []
    prev = _BYTE_ROOT
    view = memoryview(data)
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        link = hashlib.blake2b(prev, digest_size=8)
        link.update(view[start : start + block_bytes])
        prev = link.digest()
        out.append(int.from_bytes(prev, "big"))
    return tuple(out)


@dataclass(slots=True)
class PrefixIndex:
    """Chains of block hashes sent to each worker, aged by TTL and bounded by LRU."""

    block_tokens: int = 16  # tokens per hashed block (the engine's block size)
    ttl_s: float = 120.0  # Dynamo's approximate indexer forgets a block after 120 s
    # (worker, block) entries held at most: the memory bound, ~230 bytes an entry (about
    # 60 MB here; bench/prefix_index.py). More than the pool's engines hold in all their KV
    # caches (Σ num_gpu_blocks) buys nothing: they would have evicted the rest.
    max_blocks: int = 262_144
    clock: Clock | None = None
    # per worker: block hash → when it was last sent, least recent first
    _workers: dict[str, OrderedDict[int, float]] = field(default_factory=dict)
    _size: int = 0
    _latest: float = float("-inf")  # the latest `now` recorded (the TTL's time without a clock)
    # held chains need not be prefixes (`remove` took a block from inside one, or a KV-event
    # feeder records chains piecewise): `overlap` scans from the first block instead of
    # binary-searching
    scan: bool = False

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError("block_tokens: must be >= 1")
        if not self.ttl_s > 0:
            raise ValueError("ttl_s: must be positive")
        if self.max_blocks < 1:
            raise ValueError("max_blocks: must be >= 1")

    def __len__(self) -> int:
        """(worker, block) entries held, expired ones not yet swept included."""
        return self._size

    def blocks_of(self, worker: str) -> int:
        """Entries held for `worker` (Dynamo's "tree size", its tie-break at τ = 0)."""
        held = self._workers.get(worker)
        return 0 if held is None else len(held)

    def workers(self) -> list[str]:
        return list(self._workers)

    def now(self) -> float:
        return self.clock.now() if self.clock is not None else self._latest

    def record(self, worker: str, block_hashes: Sequence[int], now: float) -> None:
        """`worker` was sent a prompt with these chained block hashes at `now`. A chain
        longer than the whole bound keeps its first `max_blocks` blocks."""
        if now > self._latest:
            self._latest = now
        if not block_hashes:
            return
        held = self._workers.get(worker)
        if held is None:
            held = self._workers[worker] = OrderedDict()
        oldest = now - self.ttl_s
        size = self._size
        while held:  # this worker's expired entries go first: cheap, and keeps it honest
            h, t = next(iter(held.items()))
            if t >= oldest:
                break
            del held[h]
            size -= 1
        chain = block_hashes[: self.max_blocks]
        touch = held.move_to_end
        for h in reversed(chain):  # last first: the first blocks end up the most recent
            if h in held:
                touch(h)
            else:
                size += 1
            held[h] = now
        self._size = size
        if size > self.max_blocks:
            self._shrink(self.max_blocks)

    def overlap(self, worker: str, block_hashes: Sequence[int], now: float | None = None) -> int:
        """How many leading blocks of `block_hashes` `worker` was sent within the TTL."""
        held = self._workers.get(worker)
        if held is None or not block_hashes:
            return 0
        oldest = (self.now() if now is None else now) - self.ttl_s
        get = held.get
        if self.scan:  # the first block not held ends the prefix (as an engine's match)
            n = 0
            for h in block_hashes:
                t = get(h)
                if t is None or t < oldest:
                    break
                n += 1
            return n
        t = get(block_hashes[0])
        if t is None or t < oldest:
            return 0
        lo, hi = 0, len(block_hashes) - 1  # held(lo) is known; find the last held position
        t = get(block_hashes[hi])
        if t is not None and t >= oldest:
            return hi + 1
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            t = get(block_hashes[mid])
            if t is not None and t >= oldest:
                lo = mid
            else:
                hi = mid
        return lo + 1

    def overlaps(
        self, workers: Iterable[str], block_hashes: Sequence[int], now: float | None = None
    ) -> dict[str, int]:
        at = self.now() if now is None else now
        return {w: self.overlap(w, block_hashes, at) for w in workers}

    def clear(self) -> None:
        """Forget everything, and the latest time recorded (a new time source follows)."""
        self._workers.clear()
        self._size = 0
        self._latest = float("-inf")
        self.scan = False

    def remove(self, worker: str, block_hashes: Iterable[int]) -> int:
        """Drop these blocks of `worker` (its engine evicted them: a KV event); returns how
        many were held. A block's descendants may stay, but `overlap` stops at the first
        block not held, as the engine's prefix match does."""
        held = self._workers.get(worker)
        if held is None:
            return 0
        gone = 0
        for h in block_hashes:
            if held.pop(h, None) is not None:
                gone += 1
        if gone:
            self._size -= gone
            self.scan = True
            if not held:
                del self._workers[worker]
        return gone

    def forget(self, worker: str) -> int:
        """Drop everything held for `worker` (it left the pool, or its cache was reset);
        returns how many entries went."""
        held = self._workers.pop(worker, None)
        gone = 0 if held is None else len(held)
        self._size -= gone
        return gone

    def evict(self, now: float | None = None, max_blocks: int | None = None) -> int:
        """Sweep entries older than the TTL, then the least recent ones down to
        `max_blocks` (default: the bound); returns how many went. Routing never needs it
        (expired entries do not match and the bound holds on every `record`); call it now
        and then to give the memory back."""
        at = self.now() if now is None else now
        oldest = at - self.ttl_s
        gone = 0
        for worker, held in list(self._workers.items()):
            while held:
                h, t = next(iter(held.items()))
                if t >= oldest:
                    break
                del held[h]
                gone += 1
            if not held:
                del self._workers[worker]
        self._size -= gone
        limit = self.max_blocks if max_blocks is None else max(0, max_blocks)
        if self._size > limit:
            gone += self._shrink(limit)
        return gone

    def _shrink(self, limit: int) -> int:
        """Evict least recently sent entries over all workers until `limit` remain: take
        from the worker whose oldest entry is the oldest, down to the next worker's."""
        workers = self._workers
        gone = 0
        while self._size > limit:
            heads = sorted((next(iter(held.values())), w) for w, held in workers.items() if held)
            _, worker = heads[0]
            until = heads[1][0] if len(heads) > 1 else float("inf")
            held = workers[worker]
            while self._size > limit and held:
                h, t = next(iter(held.items()))
                if t > until:
                    break
                del held[h]
                self._size -= 1
                gone += 1
            if not held:
                del workers[worker]
        return gone
