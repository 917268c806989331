"""Least-loaded routing: the baseline.

Picks the eligible worker with the fewest requests on it, where a worker's load is
max(engine running + waiting, gateway in-flight) (`WorkerView.load`): the engine's figure
sees other replicas' traffic, ours sees dispatches newer than the last scrape. Ties go
round-robin, so a light load still spreads across the pool instead of piling onto the
first worker.

As a profile (policies/routing/profile.py): the default filters → `Load` → `LowestScore`.
Reads: `healthy`, `stale`, `running`, `waiting`, `in_flight`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.protocols.routing import config_from, register
from policies.routing.profile import Load, LowestScore, Profile


@dataclass(frozen=True, slots=True)
class LeastLoadedConfig:
    pass


NAME = "least_loaded"


def least_loaded(config: LeastLoadedConfig | None = None) -> Profile:
    return Profile(NAME, LowestScore(), ((Load(), 1.0),))


@register(NAME)
def _factory(params: Mapping[str, Any]) -> Profile:
    return least_loaded(config_from(LeastLoadedConfig, params))
