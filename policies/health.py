"""A worker's health as routing sees it: a circuit breaker over request outcomes and
hysteresis over health checks, pure functions of what happened (no clock of their own).

Circuit breaker: `failures` consecutive request failures (connect errors, resets,
timeouts, engine 5xx) open the circuit for `open_s`; after that the worker is half-open:
it gets traffic again, and one more failure re-opens it at once while a success closes
it. Health checks are separate: a worker failing `unhealthy_after` checks in a row is
unhealthy until `healthy_after` good checks. Either one keeps a worker out of routing.

The state is the driver's per-worker object (`WorkerHealth`: the gateway's
`WorkerState`); the core applies the breaker on every attempt's outcome
(policies/core.py), the gateway's health loop applies the hysteresis on every check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class WorkerHealth(Protocol):
    healthy: bool
    proven: bool  # answered a check or a scrape since start
    health_fails: int
    health_oks: int
    breaker_fails: int
    open_until: float


def routable(state: WorkerHealth, now: float) -> bool:
    return state.healthy and now >= state.open_until


@dataclass(frozen=True, slots=True)
class Breaker:
    failures: int = 5
    open_s: float = 30.0

    def failed(self, state: WorkerHealth, now: float) -> bool:
        """Count a failure; True when it (re)opens the circuit."""
        state.breaker_fails += 1
        if state.breaker_fails >= self.failures:
            state.open_until = now + self.open_s
            state.breaker_fails = self.failures - 1  # half-open later: one failure re-opens
            return True
        return False

    @staticmethod
    def succeeded(state: WorkerHealth) -> None:
        state.breaker_fails = 0


@dataclass(frozen=True, slots=True)
class Hysteresis:
    unhealthy_after: int = 3
    healthy_after: int = 2

    def checked(self, state: WorkerHealth, ok: bool) -> None:
        """One health check's result."""
        if ok:
            state.proven = True
            state.health_fails = 0
            state.health_oks += 1
            if not state.healthy and state.health_oks >= self.healthy_after:
                state.healthy = True
                state.breaker_fails = 0
                state.open_until = 0.0
        else:
            state.health_oks = 0
            state.health_fails += 1
            if state.health_fails >= self.unhealthy_after:
                state.healthy = False
