"""Choosing a worker inside a pool.

A router is a small object with one verb, `choose(request, candidates)`, registered under
a name so that configuration picks it (`routing.policy: least_loaded`). Routers see
`WorkerView`s the driver has already merged (engine telemetry + the gateway's own
in-flight counts); they hold no I/O and read no clock they were not given.

The protocol and its registry are policies/protocols/routing.py; the built-in routers, one
per file here, register themselves, and the import list below is the one place that loads
them (importing anything under policies.routing fills `ROUTERS`).

Routers are built as profiles — filters → weighted scorers → picker
(policies/routing/profile.py) — and the shared posture is the default filters, applied
once per decision:
- an unhealthy worker (failed health checks or an open circuit) is never chosen;
- a stale worker (telemetry older than the bound) counts as saturated: it is chosen only
  when every healthy worker is stale, so a scrape outage degrades to blind balancing
  instead of refusing traffic (`fleetgate_worker_telemetry_stale` tells the cases apart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.protocols.routing import ROUTERS, Router, config_from, register
from policies.routing import (  # noqa: F401  (each registers itself)
    kv_cost,
    least_loaded,
    locality,
    power_of_two,
    prefix_overlap,
    quartz,
    regime_adaptive,
    round_robin,
    session_affinity,
)
from policies.routing.profile import DEFAULT_FILTERS
from policies.types import RequestInfo, WorkerView


def eligible(candidates: Sequence[WorkerView]) -> list[WorkerView]:
    """Healthy workers, fresh ones only unless every healthy worker is stale: the default
    filters of policies/routing/profile.py, for routers and tests that are not profiles."""
    workers = list(candidates)
    for keep in DEFAULT_FILTERS:
        workers = keep(_ANY, workers)
    return workers


def with_room(candidates: Sequence[WorkerView]) -> list[WorkerView]:
    """The eligible workers that can take one more request now."""
    return [w for w in eligible(candidates) if w.has_room]


_ANY = RequestInfo(id="", model="", arrival=0.0, prompt_tokens=0, max_tokens=0)

names = ROUTERS.names


def make_router(name: str, params: Mapping[str, Any] | None = None) -> Router:
    """Build a router by name; unknown names and unknown parameters fail here, at start-up."""
    return ROUTERS.make(name, params)


__all__ = [
    "ROUTERS",
    "Router",
    "config_from",
    "eligible",
    "make_router",
    "names",
    "register",
    "with_room",
]
