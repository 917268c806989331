"""The gateway's own prefix index: which prompt blocks it sent to which worker (QUARTZ's
prefix-locality proxy ℓ_r, Table 2 of the QUARTZ paper, §3.1).

A request brings the chained hashes of its prompt's full blocks (`RequestInfo.
prefix_hashes`, block i's hash covers blocks 0..i), so "worker w was sent block i" means
w was sent the whole prefix up to i. The locality of r on w is the longest such prefix,
in tokens (`block_tokens` per block), found by binary search over r's hashes: O(log n)
dictionary lookups per worker.

The engine's prefix cache is not visible to the gateway (other replicas' traffic, its
own evictions): this index is a proxy, and QUARTZ only uses it coarsely — its bucket
none / partial / high (`high` when at least `high_fraction` of the prompt matched) and
as one feature the calibration absorbs the drift of (§3.1, "cache state drift").

Bounds: an entry (block hash → the workers sent it, with when) expires `ttl_s` after it
was last sent, and the index holds at most `max_entries` (hash, worker) pairs, evicting
the least recently sent block first. A request's blocks are touched from the last to the
first, so the first blocks of a prefix are the most recent and evicted last: what
remains of a prefix is still a prefix, which is what the binary search assumes.

Cost: only every `stride`-th block is indexed (blocks 0, stride, 2·stride, …), so a
locality is known to `stride` blocks (128 tokens at the defaults — a quarter of a
prefill chunk, finer than prefill time can tell) and recording an 8,000-token prompt
touches 63 entries, not 500.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

NONE, PARTIAL, HIGH = 0, 1, 2


@dataclass(slots=True)
class PrefixIndex:
    block_tokens: int = 16  # tokens per hashed block (the engines' block size)
    ttl_s: float = 300.0  # an entry not sent again for this long is forgotten
    max_entries: int = 200_000  # (block, worker) pairs held at most: the memory bound
    high_fraction: float = 0.5  # ℓ_r / p_r at or above this is `high` locality
    stride: int = 8  # index every stride-th block: locality known to stride blocks
    _blocks: OrderedDict[int, dict[str, float]] = field(default_factory=OrderedDict)
    _pairs: int = 0

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.max_entries < 1 or self.ttl_s <= 0 or self.stride < 1:
            raise ValueError(
                "prefix index: block_tokens, max_entries, ttl_s, stride must be positive"
            )
        if not 0.0 < self.high_fraction <= 1.0:
            raise ValueError("prefix index: high_fraction must be in (0, 1]")

    def __len__(self) -> int:
        """(block, worker) pairs held."""
        return self._pairs

    def add(self, worker: str, hashes: tuple[int, ...], now: float) -> None:
        """`worker` was sent a prompt with these block hashes at `now`."""
        if not hashes:
            return
        blocks = self._blocks
        get, touch = blocks.get, blocks.move_to_end
        pairs = self._pairs
        # the indexed blocks, last first: the first blocks end up the most recent
        for h in reversed(hashes[:: self.stride]):
            sent = get(h)
            if sent is None:
                blocks[h] = {worker: now}
                pairs += 1
            else:
                n = len(sent)
                sent[worker] = now
                pairs += len(sent) - n
                touch(h)
        while pairs > self.max_entries:
            _, sent = blocks.popitem(last=False)
            pairs -= len(sent)
        self._pairs = pairs

    def matched_blocks(self, worker: str | None, hashes: tuple[int, ...], now: float) -> int:
        """How many leading blocks of `hashes` this gateway sent `worker` (None: any
        worker) within the TTL, to `stride` blocks: the last indexed block sent, plus one."""
        if not hashes or not self._blocks:
            return 0
        oldest = now - self.ttl_s
        stride = self.stride
        sent = self._sent
        if not sent(hashes[0], worker, oldest):
            return 0
        # the last indexed position (block i·stride) sent: sent(lo) holds, sent(hi) not
        lo, hi = 0, (len(hashes) - 1) // stride
        if sent(hashes[hi * stride], worker, oldest):
            return hi * stride + 1
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if sent(hashes[mid * stride], worker, oldest):
                lo = mid
            else:
                hi = mid
        return lo * stride + 1

    def _sent(self, h: int, worker: str | None, oldest: float) -> bool:
        at = self._blocks.get(h)
        if at is None:
            return False
        if worker is None:
            return max(at.values()) >= oldest
        t = at.get(worker)
        return t is not None and t >= oldest

    def best_locality(self, hashes: tuple[int, ...], prompt_tokens: int, now: float) -> int:
        """The longest prefix of the prompt sent to any worker, in tokens: `matched_blocks`
        inlined for any worker (the queue asks once per arrival)."""
        if not hashes:
            return 0
        get = self._blocks.get
        oldest = now - self.ttl_s
        at = get(hashes[0])
        if at is None or max(at.values()) < oldest:
            return 0
        stride = self.stride
        lo, hi = 0, (len(hashes) - 1) // stride
        at = get(hashes[hi * stride])
        if at is not None and max(at.values()) >= oldest:
            lo = hi
        else:
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                at = get(hashes[mid * stride])
                if at is not None and max(at.values()) >= oldest:
                    lo = mid
                else:
                    hi = mid
        matched = (lo * stride + 1) * self.block_tokens
        return matched if matched < prompt_tokens else prompt_tokens

    def locality(self, worker: str, hashes: tuple[int, ...], prompt_tokens: int, now: float) -> int:
        """ℓ_r on `worker`, in tokens (never more than the prompt): `matched_blocks`
        inlined for one worker (routing asks K times per decision)."""
        if not hashes:
            return 0
        get = self._blocks.get
        oldest = now - self.ttl_s
        at = get(hashes[0])
        t = None if at is None else at.get(worker)
        if t is None or t < oldest:
            return 0
        stride = self.stride
        lo, hi = 0, (len(hashes) - 1) // stride
        at = get(hashes[hi * stride])
        t = None if at is None else at.get(worker)
        if t is not None and t >= oldest:
            lo = hi
        else:
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                at = get(hashes[mid * stride])
                t = None if at is None else at.get(worker)
                if t is not None and t >= oldest:
                    lo = mid
                else:
                    hi = mid
        matched = (lo * stride + 1) * self.block_tokens
        return matched if matched < prompt_tokens else prompt_tokens

    def bucket(self, locality_tokens: int, prompt_tokens: int) -> int:
        """The coarse class: NONE (0), PARTIAL (1) or HIGH (2)."""
        if locality_tokens <= 0:
            return NONE
        if locality_tokens >= self.high_fraction * max(prompt_tokens, 1):
            return HIGH
        return PARTIAL

    def sweep(self, now: float) -> int:
        """Forget blocks not sent to anyone within the TTL (oldest first); returns how many
        pairs went. Called now and then by the predictor, never per request."""
        blocks = self._blocks
        oldest = now - self.ttl_s
        gone = 0
        while blocks:
            h, sent = next(iter(blocks.items()))
            if max(sent.values()) >= oldest:
                break
            del blocks[h]
            gone += len(sent)
        self._pairs -= gone
        return gone
