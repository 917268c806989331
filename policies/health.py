"""A worker's health as routing sees it: a circuit breaker over request outcomes and
hysteresis over health checks, pure functions of what happened (no clock of their own).

Circuit breaker: `failures` consecutive request failures (connect errors, resets,
timeouts, engine 5xx) open the circuit for `open_s`; after that the worker is half-open:
it gets traffic again, and one more failure re-opens it at once while a success closes
it (a success of a request that was in flight when it opened closes it too: the worker
answers). Health checks are separate: a worker failing `unhealthy_after` checks in a row is
unhealthy until `healthy_after` good checks. Either one keeps a worker out of routing.

The state is the driver's per-worker object: the breaker's (`BreakerState`) is the load a
worker slot counts on — the gateway's `WorkerState`, the simulator's `SimWorkerView`
(simulator/cluster.py) — and the core applies the breaker on every attempt's outcome in
both drivers (policies/core.py); the hysteresis (`WorkerHealth`) is the gateway's health
loop's, on every check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class BreakerState(Protocol):
    breaker_fails: int  # consecutive failures
    open_until: float  # out of routing until then; 0.0: never opened, or closed since


class WorkerHealth(BreakerState, Protocol):
    healthy: bool
    proven: bool  # answered a check or a scrape since start
    health_fails: int
    health_oks: int


@dataclass(slots=True)
class HealthState:
    """`WorkerHealth` as plain data (the simulator's workers; the gateway keeps the same
    fields on its `WorkerState`)."""

    healthy: bool = True
    proven: bool = False
    health_fails: int = 0
    health_oks: int = 0
    breaker_fails: int = 0
    open_until: float = 0.0


def routable(state: WorkerHealth, now: float) -> bool:
    return state.healthy and now >= state.open_until


@dataclass(frozen=True, slots=True)
class Breaker:
    failures: int = 5
    open_s: float = 30.0

    def failed(self, state: BreakerState, now: float) -> bool:
        """Count a failure; True when it (re)opens the circuit."""
        state.breaker_fails += 1
        if state.breaker_fails >= self.failures:
            state.open_until = now + self.open_s
            state.breaker_fails = self.failures - 1  # half-open later: one failure re-opens
            return True
        return False

    @staticmethod
    def succeeded(state: BreakerState) -> bool:
        """Count a success; True when it closes a circuit that had opened."""
        state.breaker_fails = 0
        if state.open_until:
            state.open_until = 0.0
            return True
        return False


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
