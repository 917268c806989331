"""Uniformly random pairs (SGLang's PD load balancer for tests, `mini_lb.py`:
`random.choice` of each role), from a seeded RNG so simulated runs repeat.

A baseline: it reads nothing but the default filters' fields (healthy, stale, has_room).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.protocols.pairs import config_from, register
from policies.routing import with_room
from policies.types import RequestInfo, WorkerView

NAME = "random"


@dataclass(frozen=True, slots=True)
class RandomPairsConfig:
    seed: int = 0


@dataclass(slots=True)
class RandomPairs:
    config: RandomPairsConfig = field(default_factory=RandomPairsConfig)
    name: str = NAME
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.config.seed)

    def select(
        self, request: RequestInfo, prefill: Sequence[WorkerView], decode: Sequence[WorkerView]
    ) -> tuple[WorkerView, WorkerView] | None:
        p_ok = with_room(prefill)
        d_ok = with_room(decode)
        if not p_ok or not d_ok:
            return None
        return self.rng.choice(p_ok), self.rng.choice(d_ok)


@register(NAME)
def _factory(params: Mapping[str, Any]) -> RandomPairs:
    return RandomPairs(config_from(RandomPairsConfig, params))
