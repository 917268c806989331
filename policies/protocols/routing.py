"""The routing extension point (policies/routing/): choosing a worker inside a pool.

A router is a small object with one verb, `choose(request, candidates)`, registered under
a name so that configuration picks it (`routing.policy: least_loaded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.registry import Registry, config_from
from policies.types import RequestInfo, WorkerView


class Router(Protocol):
    name: str

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        """The worker to send `request` to, or None when no candidate can take it."""
        ...


ROUTERS: Registry[Router] = Registry("router")
register = ROUTERS.register

__all__ = ["ROUTERS", "Router", "config_from", "register"]
