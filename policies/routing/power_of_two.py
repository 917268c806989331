"""Power of two choices (Mitzenmacher): sample two eligible workers, keep the less loaded.

Nearly as good as least-loaded on fresh telemetry and much less prone to herding when
many replicas act on the same stale snapshot. The sampler is seeded, so simulated runs
are reproducible.

As a profile (policies/routing/profile.py): the default filters → `Load` → `TwoChoices`.
Reads: `healthy`, `stale`, `running`, `waiting`, `in_flight`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.protocols.routing import config_from, register
from policies.routing.profile import Load, Profile, TwoChoices


@dataclass(frozen=True, slots=True)
class PowerOfTwoConfig:
    seed: int = 0  # fixed so that a simulated run is reproducible bit for bit


NAME = "power_of_two"


def power_of_two(config: PowerOfTwoConfig | None = None) -> Profile:
    config = config or PowerOfTwoConfig()
    return Profile(NAME, TwoChoices(config.seed), ((Load(), 1.0),))


@register(NAME)
def _factory(params: Mapping[str, Any]) -> Profile:
    return power_of_two(config_from(PowerOfTwoConfig, params))
