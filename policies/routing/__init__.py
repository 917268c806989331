"""Choosing a worker inside a pool.

A router is a small object with one verb, `choose(request, candidates)`, registered under
a name so that configuration picks it (`routing.policy: least_loaded`). Routers see
`WorkerView`s the driver has already merged (engine telemetry + the gateway's own
in-flight counts); they hold no I/O and read no clock they were not given.

Routers are built as profiles — filters → weighted scorers → picker
(policies/routing/profile.py) — and the shared posture is the default filters, applied
once per decision:
- an unhealthy worker (failed health checks or an open circuit) is never chosen;
- a stale worker (telemetry older than the bound) counts as saturated: it is chosen only
  when every healthy worker is stale, so a scrape outage degrades to blind balancing
  instead of refusing traffic (`fleetgate_worker_telemetry_stale` tells the cases apart).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from policies.types import RequestInfo, WorkerView


class Router(Protocol):
    name: str

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        """The worker to send `request` to, or None when no candidate can take it."""
        ...


def eligible(candidates: Sequence[WorkerView]) -> list[WorkerView]:
    """Healthy workers, fresh ones only unless every healthy worker is stale: the default
    filters of policies/routing/profile.py, for routers and tests that are not profiles."""
    from policies.routing.profile import DEFAULT_FILTERS

    workers = list(candidates)
    for keep in DEFAULT_FILTERS:
        workers = keep(_ANY, workers)
    return workers


_ANY = RequestInfo(id="", model="", arrival=0.0, prompt_tokens=0, max_tokens=0)


RouterFactory = Callable[[Mapping[str, Any]], Router]
_REGISTRY: dict[str, RouterFactory] = {}


def register(name: str) -> Callable[[RouterFactory], RouterFactory]:
    def deco(factory: RouterFactory) -> RouterFactory:
        if name in _REGISTRY:
            raise ValueError(f"router {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def make_router(name: str, params: Mapping[str, Any] | None = None) -> Router:
    """Build a router by name; unknown names and unknown parameters fail here, at start-up."""
    _load_builtins()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown router {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None
    return factory(dict(params or {}))


def _load_builtins() -> None:
    from policies.routing import least_loaded, power_of_two, round_robin  # noqa: F401


def config_from(cls: Any, params: Mapping[str, Any]) -> Any:
    """Build a frozen config dataclass from a mapping, naming any unknown key."""
    fields = set(getattr(cls, "__dataclass_fields__", {}))
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(fields)) or 'none'}"
        )
    return cls(**params)
