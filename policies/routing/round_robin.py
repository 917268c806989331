"""Round-robin routing: each eligible worker in turn, blind to load. A baseline to compare with.

As a profile (policies/routing/profile.py): the default filters → no scorer → `InTurn`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.protocols.routing import config_from, register
from policies.routing.profile import InTurn, Profile


@dataclass(frozen=True, slots=True)
class RoundRobinConfig:
    pass


NAME = "round_robin"


def round_robin(config: RoundRobinConfig | None = None) -> Profile:
    return Profile(NAME, InTurn())


@register(NAME)
def _factory(params: Mapping[str, Any]) -> Profile:
    return round_robin(config_from(RoundRobinConfig, params))
