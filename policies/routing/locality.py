"""Locality-aware routing, the QUARTZ paper's baseline (§5.3): prefix
affinity first, then load.

Among eligible workers with room whose load is within `load_slack` requests of the least
loaded, pick the one this gateway sent the longest prefix of the request to (the
predictor's prefix index, policies/quantile/prefix_index.py); ties, and requests with no
known prefix, go least-loaded (round-robin among equals). The slack keeps a popular prefix
from piling every request onto one worker. Without a predictor bound it is least-loaded.

Reads: `healthy`, `stale`, `running`, `waiting`, `in_flight`, and `has_room`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.protocols.routing import config_from, register
from policies.quantile.predictor import Predictor
from policies.routing.least_loaded import least_loaded
from policies.routing.profile import DEFAULT_FILTERS, Profile
from policies.types import RequestInfo, WorkerView


@dataclass(frozen=True, slots=True)
class LocalityConfig:
    load_slack: int = 4  # prefer a prefix on a worker at most this many requests busier

    def __post_init__(self) -> None:
        if self.load_slack < 0:
            raise ValueError("load_slack: must not be negative")


@dataclass(slots=True)
class LocalityRouter:
    config: LocalityConfig
    name: str = "locality"
    predictor: Predictor | None = None
    fallback: Profile = field(default_factory=least_loaded)
    _turn: int = 0

    def bind_predictor(self, predictor: Predictor) -> None:
        self.predictor = predictor

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        predictor = self.predictor
        if predictor is None or not request.prefix_hashes:
            return self.fallback.choose(request, candidates)
        workers = list(candidates)
        for keep in DEFAULT_FILTERS:
            workers = keep(request, workers)
            if not workers:
                return None
        least = min(w.load for w in workers)
        near = [w for w in workers if w.load <= least + self.config.load_slack]
        scored = [(predictor.locality(request, w.id), -w.load, w) for w in near]
        best = max(m for m, _, _ in scored)
        if best == 0:
            tied = [w for _, _, w in scored if w.load == least]
        else:
            top = max(nl for m, nl, _ in scored if m == best)
            tied = [w for m, nl, w in scored if m == best and nl == top]
        self._turn += 1
        return tied[self._turn % len(tied)]


@register("locality")
def _factory(params: Mapping[str, Any]) -> LocalityRouter:
    return LocalityRouter(config_from(LocalityConfig, params))
