"""`fifo`: first come first served — the longest-waiting request that could use the pool
where room freed takes it (the default dispatch policy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.protocols.dispatch import DISPATCHERS, Dispatcher, Waiter
from policies.queue.waiters import Waiters
from policies.registry import config_from
from policies.types import RequestInfo


@dataclass(slots=True)
class FifoDispatcher:
    max_waiting: int = 1024  # beyond this a request is refused at once (429)
    timeout_s: float = 30.0  # a request waits at most this long for room (then 503)
    _waiters: Waiters = field(init=False)

    def __post_init__(self) -> None:
        self._waiters = Waiters(self.max_waiting, self.timeout_s)

    def wait(self, request: RequestInfo, pools: tuple[str, ...], now: float) -> Waiter | None:
        return self._waiters.add(request, pools, now)

    def served(self, request: RequestInfo, now: float) -> None:
        pass

    def wake(self, pool: str) -> Waiter | None:
        return self._waiters.oldest(pool)

    def cancel(self, waiter: Waiter) -> None:
        self._waiters.cancel(waiter)

    def waiting(self, pool: str) -> int:
        return self._waiters.waiting(pool)

    def __len__(self) -> int:
        return self._waiters.live


@dataclass(frozen=True)
class FifoConfig:
    max_waiting: int = 1024  # beyond this a request is refused at once (429)
    timeout_s: float = 30.0  # a request waits at most this long for room (then 503)

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError("max_waiting: must not be negative")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")


@DISPATCHERS.register("fifo")
def _fifo(params: Mapping[str, Any]) -> Dispatcher:
    c = config_from(FifoConfig, params)
    return FifoDispatcher(c.max_waiting, c.timeout_s)
