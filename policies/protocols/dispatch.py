"""The dispatch extension point (step 6, policies/dispatch.py): the order in which
requests that found no worker with room wait for one.

The core asks `wait` when routing found no worker with room while some are healthy and
`wake(pool)` whenever a slot in `pool` is released; `cancel` removes a waiter whose
client left or whose deadline (`Waiter.deadline`, set here: the `Wait` action's, which the
driver's timer reports as `Deadline`) passed. Each waiter leaves the queue exactly once:
woken or cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from policies.registry import Registry
from policies.types import RequestInfo


@dataclass(slots=True, eq=False)
class Waiter:
    """One request waiting for room in any of `pools` (in preference order)."""

    key: str
    pools: tuple[str, ...]
    since: float
    deadline: float
    done: bool = False  # woken or cancelled: out of the queue
    token: object = None  # the driver's handle (the gateway: a future to resolve)
    request: RequestInfo | None = None


class Dispatcher(Protocol):
    def wait(self, request: RequestInfo, pools: tuple[str, ...], now: float) -> Waiter | None:
        """Queue a request; None when the queue is full."""
        ...

    def served(self, request: RequestInfo, now: float) -> None:
        """A request had its first token (fair dispatchers count the client's service)."""
        ...

    def wake(self, pool: str) -> Waiter | None:
        """The waiter that takes the slot just freed in `pool`, if any."""
        ...

    def cancel(self, waiter: Waiter) -> None: ...

    def waiting(self, pool: str) -> int:
        """Requests queued that could use `pool` (a newcomer for it queues behind them)."""
        ...

    def __len__(self) -> int: ...


DISPATCHERS: Registry[Dispatcher] = Registry("dispatch policy")
