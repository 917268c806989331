"""The default pair selector: the prefill worker by Dynamo's KV cost, the decode worker by
its active decode load ("The Price of Anarchy in Disaggregated Inference", eq. 1–2, §5).

- prefill: `kv_cost` (policies/routing/kv_cost.py) over the prefill workers:
  c_j = ω·(blocks still to prefill on j, after its cached prefix overlap) + (active blocks
  on j), sampled by the softmax with temperature τ (τ = 0: argmin) — Dynamo's defaults
  ω = 1, τ = 0; its prefix index and active blocks follow the core's pair events
  (`hooks()`: policies/pd/pair_state.py) — a prompt's blocks are active on the prefill
  worker from the pair's dispatch to the hand-off, and its cache holds them from the
  hand-off on — so a shared prefix goes back where its KV is cached;
- decode: the least active decode load — the worker's `active_blocks` when the driver
  knows them, else ⌈outstanding tokens / block size⌉ (this gateway's Σ prompt + max_tokens
  held by decode slots), ties by fewer requests in flight, then in turn (so a light load
  still spreads over the decode workers) — among the decode workers the default filters
  keep (healthy, fresh unless all stale, with room).

Reads: the `WorkerView` fields of `kv_cost` and `least_loaded`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.hooks import Hook
from policies.pd.pair_state import PairKvState
from policies.protocols.pairs import config_from, register
from policies.routing import with_room
from policies.routing.kv_cost import KvCostConfig, KvCostRouter
from policies.routing.kv_state import PER_REQUEST, KvState, blocks_for
from policies.types import RequestInfo, WorkerView

NAME = "kv_cost_decode_load"


def decode_load(worker: WorkerView, block_size: int) -> int:
    """A decode worker's active decode blocks, as well as they are known."""
    if worker.active_blocks is not None:
        return worker.active_blocks
    return blocks_for(worker.outstanding_tokens, worker.block_size or block_size)


def least_decode_loaded(decode: Sequence[WorkerView], block_size: int) -> list[WorkerView]:
    """The eligible decode workers with the least (active blocks, requests in flight)."""
    ok = with_room(decode)
    if not ok:
        return []
    keys = [(decode_load(w, block_size), w.in_flight) for w in ok]
    best = min(keys)
    return [w for w, k in zip(ok, keys, strict=True) if k == best]


@dataclass(frozen=True, slots=True)
class SideCostConfig:
    """The KV cost of the side of a pair a selector chooses by it (the prefill side here,
    the decode side in kv_cost_decode)."""

    temperature: float = 0.0  # τ of that choice (Dynamo's router_temperature)
    overlap_weight: float = 1.0  # ω of that choice (kv_overlap_score_weight)
    block_size: int = 16  # KV block size when a worker does not report its own
    seed: int = 0  # that choice's softmax RNG

    def router(self) -> KvCostRouter:
        return KvCostRouter(
            KvCostConfig(
                temperature=self.temperature,
                overlap_weight=self.overlap_weight,
                block_size=self.block_size,
                seed=self.seed,
            )
        )


KvCostDecodeLoadConfig = SideCostConfig  # the prefill side's KV cost


@dataclass(slots=True)
class KvCostDecodeLoad:
    # what a driver fills for it before Core.start (policies/build.py request_fields)
    request_fields: ClassVar[tuple[str, ...]] = PER_REQUEST
    config: KvCostDecodeLoadConfig = field(default_factory=KvCostDecodeLoadConfig)
    name: str = NAME
    prefill_router: KvCostRouter = field(init=False)
    _turn: int = 0  # the decode workers' round-robin among ties

    def __post_init__(self) -> None:
        self.prefill_router = self.config.router()

    @property
    def state(self) -> KvState:
        """The prefill side's prefix index and active blocks (the gauges read it)."""
        return self.prefill_router.state

    def hooks(self) -> tuple[Hook, ...]:
        """The prefill side's prefix index and active blocks, kept by the core's pair
        events (policies/pd/pair_state.py; policies/build.py attaches them)."""
        return (PairKvState(self.prefill_router.state, "prefill"),)

    def select(
        self, request: RequestInfo, prefill: Sequence[WorkerView], decode: Sequence[WorkerView]
    ) -> tuple[WorkerView, WorkerView] | None:
        ties = least_decode_loaded(decode, self.config.block_size)
        if not ties:
            return None
        p = self.prefill_router.choose(request, prefill)
        if p is None:
            return None
        d = ties[self._turn % len(ties)]
        self._turn += 1
        return p, d


@register(NAME)
def _factory(params: Mapping[str, Any]) -> KvCostDecodeLoad:
    return KvCostDecodeLoad(config_from(KvCostDecodeLoadConfig, params))
