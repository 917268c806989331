"""Prefix-overlap routing: prefer the worker this gateway sent the longest prefix of the
prompt to, traded against load (the prefix-cache scorer of llm-d's endpoint picker, SGLang's
`cache_aware` in spirit; docs/CACHE_ROUTING.md).

    score_j = −(leading blocks of the prompt sent to j) / (blocks of the prompt)
              + load_weight · load_j

The overlap fraction is in [0, 1]; at the default `load_weight` = 0.05, a worker 20
requests busier must hold the whole prompt to win. Lowest score wins, ties round-robin. A
request without prefix hashes routes least-loaded. The prefix index (policies/
prefix_index.py) is the router's `KvState`: kept by its own choices until the core's
dispatch events feed it (kv_state.py).

As a profile: the default filters → `PrefixOverlap` + `Load` → `LowestScore`.
Reads: `healthy`, `stale`, `has_room`'s fields, `running`, `waiting`, `in_flight`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.hooks import Hook
from policies.protocols.routing import config_from, register
from policies.routing.kv_state import CacheConfig, KvState
from policies.routing.profile import Load, LowestScore, Profile
from policies.types import RequestInfo, WorkerView


@dataclass(slots=True)
class PrefixOverlap:
    """Scorer: minus the fraction of the prompt's blocks `worker` was sent (lower is
    better); 0 for a request without hashes."""

    state: KvState
    name: str = "prefix_overlap"

    def score(self, request: RequestInfo, worker: WorkerView) -> float:
        hashes = request.prefix_hashes
        if not hashes:
            return 0.0
        return -self.state.index.overlap(worker.id, hashes) / len(hashes)


@dataclass(frozen=True, slots=True)
class PrefixOverlapConfig(CacheConfig):
    load_weight: float = 0.05  # score per request of load; the overlap is worth 1

    def __post_init__(self) -> None:
        CacheConfig.__post_init__(self)
        if not 0.0 <= self.load_weight < float("inf"):
            raise ValueError("load_weight: must be finite and >= 0")


@dataclass(slots=True)
class PrefixOverlapRouter:
    request_fields: ClassVar[tuple[str, ...]] = ("prefix_hashes",)
    config: PrefixOverlapConfig
    name: str = "prefix_overlap"
    state: KvState = field(init=False)
    _profile: Profile = field(init=False)

    def __post_init__(self) -> None:
        self.bind_kv_state(self.config.state())

    def bind_kv_state(self, state: KvState) -> None:
        self.state = state
        scorers = ((PrefixOverlap(state), 1.0), (Load(), self.config.load_weight))
        self._profile = Profile(self.name, LowestScore(), scorers)

    def hooks(self) -> tuple[Hook, ...]:
        """What the composition root attaches to the core: the index and accounting."""
        return (self.state,)

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        return self.state.choose(self._profile, request, candidates)


NAME = "prefix_overlap"


@register(NAME)
def _factory(params: Mapping[str, Any]) -> PrefixOverlapRouter:
    return PrefixOverlapRouter(config_from(PrefixOverlapConfig, params))
