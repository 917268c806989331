"""Round-robin routing: each eligible worker in turn, blind to load. A baseline to compare with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.routing import config_from, eligible, register
from policies.types import RequestInfo, WorkerView


@dataclass(frozen=True, slots=True)
class RoundRobinConfig:
    pass


class RoundRobin:
    name = "round_robin"

    def __init__(self, config: RoundRobinConfig | None = None) -> None:
        self.config = config or RoundRobinConfig()
        self._turn = -1

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        pool = eligible(candidates)
        if not pool:
            return None
        self._turn += 1
        return pool[self._turn % len(pool)]


@register(RoundRobin.name)
def _factory(params: Mapping[str, Any]) -> RoundRobin:
    return RoundRobin(config_from(RoundRobinConfig, params))
