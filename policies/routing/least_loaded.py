"""Least-loaded routing: the baseline.

Picks the eligible worker with the fewest requests on it, where a worker's load is
max(engine running + waiting, gateway in-flight) (`WorkerView.load`): the engine's figure
sees other replicas' traffic, ours sees dispatches newer than the last scrape. Ties go
round-robin, so a light load still spreads across the pool instead of piling onto the
first worker.

Reads: `healthy`, `stale`, `running`, `waiting`, `in_flight`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.routing import config_from, eligible, register
from policies.types import RequestInfo, WorkerView


@dataclass(frozen=True, slots=True)
class LeastLoadedConfig:
    pass


class LeastLoaded:
    name = "least_loaded"

    def __init__(self, config: LeastLoadedConfig | None = None) -> None:
        self.config = config or LeastLoadedConfig()
        self._turn = 0

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        pool = eligible(candidates)
        if not pool:
            return None
        least = min(w.load for w in pool)
        tied = [w for w in pool if w.load == least]
        self._turn += 1
        return tied[self._turn % len(tied)]


@register(LeastLoaded.name)
def _factory(params: Mapping[str, Any]) -> LeastLoaded:
    return LeastLoaded(config_from(LeastLoadedConfig, params))
