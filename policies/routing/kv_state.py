"""What the cache-aware routers know of each worker's KV cache: the prefix index (blocks
sent) and the active blocks of the requests in flight on it (docs/CACHE_ROUTING.md).

`KvState` implements the core's `Hook` protocol (policies/hooks.py): attached to the core's
hooks by a composition root, it is kept current by the dispatch and completion events of
both drivers — `on_dispatch` records the prompt's block chain on the worker and adds its
blocks to the worker's active blocks; `on_complete` (any outcome) releases them; a retry on
another worker is a second dispatch and moves them. Until a first event arrives (no root
attached it yet), the routers record their own choices instead (Dynamo's approximate
mode: the routing decision stands for the dispatch) and read active blocks from the
`WorkerView` (see `KvCost` in kv_cost.py).

Active blocks, as Dynamo's router counts them: the blocks of the prompts in flight on a
worker, a block shared by several of them (a common system prompt) counted once — when the
index's blocks are KV blocks (`index.block_tokens == block_size`) — plus each prompt's
tail (tokens not covered by a hashed block). Generated tokens are not counted here: the
core reports no per-token progress (Dynamo adds output blocks as they are generated). A
`pd` pool's decode side charges each request's output blocks at once instead (`charge`;
policies/pd/pair_state.py).

Requests of other pools are ignored: a state only follows workers it has seen as routing
candidates (`seen`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from policies.prefix_index import PrefixIndex
from policies.routing.profile import Profile
from policies.types import Outcome, RequestInfo, WorkerView

# the request fields kv_cost reads besides the lengths: the prompt's block chain and the
# per-request (τ, ω) override (a driver fills them before Core.start)
PER_REQUEST = ("prefix_hashes", "router_temperature", "overlap_weight")


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks holding `tokens` tokens (a partial block is a block)."""
    return -(-max(0, tokens) // block_size)


@dataclass(slots=True)
class _InFlight:
    worker: str
    shared: tuple[int, ...]  # hashed blocks counted through the worker's refcounts
    tail: int  # blocks counted for this request alone


@dataclass(slots=True)
class KvState:
    index: PrefixIndex = field(default_factory=PrefixIndex)
    block_size: int = 16  # KV block size in tokens, for active blocks
    fed: bool = False  # a dispatch event arrived: the hooks keep the index current
    # the index's own hit rate (gauges): prompt blocks dispatched, and those of them the
    # index held for the chosen worker at dispatch (its estimate of the engine's hits)
    queried_blocks: int = 0
    hit_blocks: int = 0
    _known: set[str] = field(default_factory=set)
    _tail: dict[str, int] = field(default_factory=dict)  # worker → unshared active blocks
    _refs: dict[str, dict[int, int]] = field(default_factory=dict)  # worker → block → count
    _requests: dict[str, _InFlight] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size: must be >= 1")

    def seen(self, candidates: list[WorkerView]) -> None:
        known = self._known
        for w in candidates:
            if w.id not in known:
                known.add(w.id)

    def knows(self, worker: str) -> bool:
        """Whether `worker` was a routing candidate here (is in this router's pool)."""
        return worker in self._known

    def active_blocks(self, worker: str) -> int:
        """Active blocks this gateway has in flight on `worker`."""
        refs = self._refs.get(worker)
        return self._tail.get(worker, 0) + (0 if refs is None else len(refs))

    def chose(self, request: RequestInfo, worker: str) -> None:
        """A router chose `worker`: record the chain unless dispatch events do (timed by
        the index's clock, or else by the request's arrival)."""
        if not self.fed:
            clock = self.index.clock
            now = request.arrival if clock is None else clock.now()
            self.index.record(worker, request.prefix_hashes, now)

    def choose(
        self, profile: Profile, request: RequestInfo, candidates: Sequence[WorkerView]
    ) -> WorkerView | None:
        """`profile`'s choice among `candidates`, with the pool's workers and the chosen
        chain recorded (the cache routers' `choose`)."""
        workers = list(candidates)
        self.seen(workers)
        chosen = profile.choose(request, workers)
        if chosen is not None:
            self.chose(request, chosen.id)
        return chosen

    # --- policies/hooks.py -------------------------------------------------------------
    def on_arrival(self, request: RequestInfo, now: float) -> None:
        return None

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        if worker not in self._known:
            return
        self.record(request, worker, now)
        self.hold(request, worker)

    def record(self, request: RequestInfo, worker: str, now: float) -> None:
        """`worker`'s cache holds the request's prompt now (its chain into the index; the
        index's hit counts hear how much of it was there already)."""
        self._feed()
        hashes = request.prefix_hashes
        if hashes:
            self.queried_blocks += len(hashes)
            self.hit_blocks += self.index.overlap(worker, hashes, now)
        self.index.record(worker, hashes, now)

    def hold(self, request: RequestInfo, worker: str) -> None:
        """The request's prompt blocks are active on `worker` until `release` (a retry:
        they move from the earlier worker)."""
        self._feed()
        self._release(request.id)
        bs = self.block_size
        total = blocks_for(request.prompt_tokens, bs)
        shared: tuple[int, ...] = ()
        if self.index.block_tokens == bs and request.prefix_hashes:
            shared = request.prefix_hashes[:total]
            refs = self._refs.setdefault(worker, {})
            for h in shared:
                refs[h] = refs.get(h, 0) + 1
        tail = total - len(shared)
        self._tail[worker] = self._tail.get(worker, 0) + tail
        self._requests[request.id] = _InFlight(worker, shared, tail)

    def charge(self, request_id: str, blocks: int) -> None:
        """`blocks` more active blocks for a held request, counted for it alone and
        released with it (a decode worker's output blocks); nothing if it is not held."""
        held = self._requests.get(request_id)
        if held is None or blocks <= 0:
            return
        held.tail += blocks
        self._tail[held.worker] += blocks

    def _feed(self) -> None:
        if not self.fed:
            # the routers' own records were timed by request arrival; the events bring the
            # driver's clock, which need not agree: start the index afresh on it
            self.fed = True
            self.index.clear()

    def release(self, request_id: str) -> None:
        """The request's blocks are no longer active (where they were held)."""
        self._release(request_id)

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        return None

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self._release(request.id)

    def _release(self, request_id: str) -> None:
        held = self._requests.pop(request_id, None)
        if held is None:
            return
        self._tail[held.worker] -= held.tail
        refs = self._refs.get(held.worker)
        if refs is not None:
            for h in held.shared:
                n = refs[h] - 1
                if n:
                    refs[h] = n
                else:
                    del refs[h]


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The cache-aware routers' shared parameters (`routing.params`)."""

    block_size: int = 16  # the engines' KV block size in tokens (a WorkerView's wins)
    # tokens per hashed block of `RequestInfo.prefix_hashes`; None: block_size (hashes of
    # token blocks). The gateway's byte chunks: block_bytes / 4.
    hash_block_tokens: int | None = None
    ttl_s: float = 120.0  # Dynamo's approximate indexer's TTL
    # the prefix index's hard bound, (worker, block) entries (~230 bytes each): about the
    # pool's engines' KV blocks together (Σ num_gpu_blocks); more buys nothing
    max_blocks: int = 262_144

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size: must be >= 1")
        if self.hash_block_tokens is not None and self.hash_block_tokens < 1:
            raise ValueError("hash_block_tokens: must be >= 1")
        if not self.ttl_s > 0:
            raise ValueError("ttl_s: must be positive")
        if self.max_blocks < 1:
            raise ValueError("max_blocks: must be >= 1")

    def state(self) -> KvState:
        tokens = self.block_size if self.hash_block_tokens is None else self.hash_block_tokens
        return KvState(PrefixIndex(tokens, self.ttl_s, self.max_blocks), self.block_size)
