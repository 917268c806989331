"""Dynamo's KV-aware routing cost, sampled by a softmax with temperature τ
(docs/CACHE_ROUTING.md; "The Price of Anarchy in Disaggregated Inference", eq. 1–2).

    c_j = ω · (blocks still to prefill on j) + (active decode blocks on j)

- blocks to prefill = (ISL − cached overlap on j) / block_size, a fraction as in Dynamo's
  selector (ISL = the request's prompt tokens, the overlap from the prefix index in
  tokens, never more than the prompt);
- active blocks on j, the first known of: the `WorkerView`'s `active_blocks` (a driver
  that knows them), this gateway's accounting (`KvState`, once the core's events feed
  it), or else ⌈outstanding tokens / block_size⌉ — this gateway's Σ (prompt + max_tokens)
  on j, an upper bound until the hooks are attached;
- ω = `overlap_weight` (Dynamo's `kv_overlap_score_weight`, default 1.0), τ =
  `temperature` (`router_temperature`, default 0): Dynamo's defaults. Both are per pool
  (each pool's `routing.params`) and a request may override them
  (`RequestInfo.overlap_weight` / `router_temperature`).

The picker is `Softmax` (softmax.py): range-normalised by default, as Dynamo's selector
does; τ = 0 takes the argmin, ties to the worker with the smallest cached tree (entries in
the index), then a seeded uniform draw.

As a profile: the default filters → `KvCost` → `Softmax`. Reads: `healthy`, `stale`,
`has_room`'s fields, `block_size`, `active_blocks`, `outstanding_tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.hooks import Hook
from policies.protocols.routing import config_from, register
from policies.routing.kv_state import PER_REQUEST, CacheConfig, KvState, blocks_for
from policies.routing.profile import Profile
from policies.routing.softmax import NORMALISE, Softmax
from policies.types import RequestInfo, WorkerView


@dataclass(slots=True)
class KvCost:
    """Scorer: c_j, in blocks (lower is better)."""

    state: KvState
    overlap_weight: float = 1.0  # ω
    name: str = "kv_cost"

    def prefill_blocks(self, request: RequestInfo, worker: WorkerView) -> float:
        bs = worker.block_size or self.state.block_size
        index = self.state.index
        isl = request.prompt_tokens
        cached = index.overlap(worker.id, request.prefix_hashes) * index.block_tokens
        return max(0, isl - cached) / bs

    def decode_blocks(self, worker: WorkerView) -> float:
        if worker.active_blocks is not None:
            return float(worker.active_blocks)
        state = self.state
        if state.fed:
            return float(state.active_blocks(worker.id))
        return float(blocks_for(worker.outstanding_tokens, worker.block_size or state.block_size))

    def score(self, request: RequestInfo, worker: WorkerView) -> float:
        omega = self.overlap_weight if request.overlap_weight is None else request.overlap_weight
        return omega * self.prefill_blocks(request, worker) + self.decode_blocks(worker)


@dataclass(frozen=True, slots=True)
class KvCostConfig(CacheConfig):
    temperature: float = 0.0  # τ (Dynamo's router_temperature)
    overlap_weight: float = 1.0  # ω (Dynamo's kv_overlap_score_weight)
    normalise: str = "range"  # "range": Dynamo's min–max normalised softmax; "none": raw
    seed: int = 0  # the picker's RNG (simulated runs are reproducible)

    def __post_init__(self) -> None:
        CacheConfig.__post_init__(self)
        if not 0.0 <= self.temperature < float("inf"):
            raise ValueError("temperature: must be finite and >= 0")
        if not 0.0 <= self.overlap_weight < float("inf"):
            raise ValueError("overlap_weight: must be finite and >= 0")
        if self.normalise not in NORMALISE:
            raise ValueError(f"normalise: must be one of {', '.join(NORMALISE)}")


@dataclass(slots=True)
class KvCostRouter:
    # what a driver fills for it before Core.start (policies/build.py request_fields)
    request_fields: ClassVar[tuple[str, ...]] = PER_REQUEST
    config: KvCostConfig
    name: str = "kv_cost"
    state: KvState = field(init=False)
    cost: KvCost = field(init=False)
    picker: Softmax = field(init=False)
    _profile: Profile = field(init=False)

    def __post_init__(self) -> None:
        self.bind_kv_state(self.config.state())

    def bind_kv_state(self, state: KvState) -> None:
        """Share `state` (its index and accounting) — e.g. with a wrapper's hooks."""
        c = self.config
        self.state = state
        self.cost = KvCost(state, c.overlap_weight)
        index = state.index
        self.picker = Softmax(c.temperature, c.seed, c.normalise, lambda w: index.blocks_of(w.id))
        self._profile = Profile(self.name, self.picker, ((self.cost, 1.0),))

    def hooks(self) -> tuple[Hook, ...]:
        """What the composition root attaches to the core: the index and accounting."""
        return (self.state,)

    @property
    def temperature(self) -> float:
        return self.picker.temperature

    @property
    def overlap_weight(self) -> float:
        return self.cost.overlap_weight

    def set_params(self, temperature: float, overlap_weight: float) -> None:
        """Switch (τ, ω) (the regime controller's knob)."""
        self.picker.temperature = temperature
        self.cost.overlap_weight = overlap_weight

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        return self.state.choose(self._profile, request, candidates)


NAME = "kv_cost"


def kv_cost(config: KvCostConfig | None = None) -> KvCostRouter:
    return KvCostRouter(config or KvCostConfig())


@register(NAME)
def _factory(params: Mapping[str, Any]) -> KvCostRouter:
    return kv_cost(config_from(KvCostConfig, params))
