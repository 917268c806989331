"""Step 6: a request that finds no worker with room waits in the gateway, first come first
served, until a completion frees a slot in one of its pools or its deadline passes.

Why in the gateway: a worker's engine would queue the request itself, but then it is
committed to that worker; waiting here keeps the choice open until a slot frees anywhere
in the pool, and gives the queue an order the gateway controls (the fair, size-aware
QUARTZ queue replaces this FIFO behind the same `Dispatcher` protocol).

A worker's room is its capacity (`WorkerView.capacity`: the engine's `max_num_seqs` from
configuration, None = unbounded) less the gateway's own in-flight count; routing's
`has_room` filter keeps only workers with room. The driver asks `wait` when routing
found no worker *with room* while some are healthy (none healthy is still a 503), then
calls `wake(pool)` whenever a slot in `pool` is released and `expire(now)` as time
passes; `cancel` removes a waiter whose client left. Each waiter leaves the queue exactly
once: woken, expired or cancelled.

The order is the dispatcher's: `fifo` (this file) serves first come first served;
`quartz` (policies/queue/quartz.py) orders by predicted tail prefill with aging and
per-client fairness; `token_fair` (policies/queue/token_fair.py) serves the client with
the least recent service first. `wait` is given the request itself (its size, its
client), and `served` tells the dispatcher a request it ordered had its first token
(the fair dispatchers' service counters).

Room (what makes the order matter, for every dispatcher alike): a worker takes another
request while its in-flight count is below `capacity` (`dispatch.capacity: engine`: the
engine's max_num_seqs), its outstanding tokens below `token_capacity`
(`dispatch.kv_overcommit`), and — with `dispatch.prefill_room` set — its prefill backlog
(prompt tokens dispatched without a first token yet, `WorkerView.prefill_tokens`) below
that many tokens. The last keeps a long prompt from being pushed into an engine already
busy prefilling: the request stays here, where the order is ours, and a first token
frees room as a completion does.

Failure posture: a full queue (`max_waiting`) refuses at once (the driver answers 429
with Retry-After); a waiter past `timeout_s` is expired (503 `queue_timeout`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.clock import Clock
from policies.leases import Releasing
from policies.registry import Registry, config_from
from policies.types import RequestInfo


@dataclass(slots=True, eq=False)
class Waiter:
    """One request waiting for room in any of `pools` (in preference order)."""

    key: str
    pools: tuple[str, ...]
    since: float
    deadline: float
    done: bool = False  # woken, expired or cancelled: out of the queue
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

    def expire(self, now: float) -> list[Waiter]:
        """Waiters whose deadline has passed, removed from the queue."""
        ...

    def cancel(self, waiter: Waiter) -> None: ...

    def waiting(self, pool: str) -> int:
        """Requests queued that could use `pool` (a newcomer for it queues behind them)."""
        ...

    def __len__(self) -> int: ...


@dataclass(slots=True)
class FifoDispatcher:
    max_waiting: int = 1024  # beyond this a request is refused at once (429)
    timeout_s: float = 30.0  # a request waits at most this long for room (then 503)
    _queue: deque[Waiter] = field(default_factory=deque)
    _live: int = 0

    def wait(self, request: RequestInfo, pools: tuple[str, ...], now: float) -> Waiter | None:
        if self._live >= self.max_waiting:
            return None
        waiter = Waiter(request.id, pools, now, now + self.timeout_s, request=request)
        self._queue.append(waiter)
        self._live += 1
        return waiter

    def served(self, request: RequestInfo, now: float) -> None:
        pass

    def wake(self, pool: str) -> Waiter | None:
        queue = self._queue
        while queue and queue[0].done:  # cancelled or expired ones left at the head
            queue.popleft()
        for waiter in queue:
            if not waiter.done and pool in waiter.pools:
                self._leave(waiter)
                return waiter
        return None

    def expire(self, now: float) -> list[Waiter]:
        gone = [w for w in self._queue if not w.done and w.deadline <= now]
        for waiter in gone:
            self._leave(waiter)
        return gone

    def cancel(self, waiter: Waiter) -> None:
        if not waiter.done:
            self._leave(waiter)

    def waiting(self, pool: str) -> int:
        if not self._live:
            return 0
        return sum(1 for w in self._queue if not w.done and pool in w.pools)

    def _leave(self, waiter: Waiter) -> None:
        waiter.done = True
        self._live -= 1
        if self._queue and self._queue[0] is waiter:
            self._queue.popleft()
        elif len(self._queue) > 4 * max(self._live, 16):
            self._queue = deque(w for w in self._queue if not w.done)

    def __len__(self) -> int:
        return self._live


def attach_clock(dispatcher: object, clock: Clock) -> bool:
    """Give a dispatcher that reads the time between events (QUARTZ's wait bound: it has
    `bind_clock`) the driver's clock; False when it does not. `wake` carries no time
    (a slot freed by a lease's release), so such a dispatcher asks the clock."""
    bind = getattr(dispatcher, "bind_clock", None)
    if bind is None:
        return False
    bind(clock)
    return True


def expire_in_arrival_order(
    arrivals: deque[Waiter], now: float, leave: Callable[[Waiter], None]
) -> list[Waiter]:
    """The waiters past their deadline, taken from the front of an arrival-ordered deque
    (every waiter has the same timeout, so deadlines come in arrival order) and handed to
    `leave`; waiters already out of the queue are dropped from the front on the way."""
    gone = []
    while arrivals and (arrivals[0].done or arrivals[0].deadline <= now):
        waiter = arrivals.popleft()
        if not waiter.done:
            leave(waiter)
            gone.append(waiter)
    return gone


@dataclass(slots=True, eq=False)
class QueuePosition(Releasing):
    """A waiter's place in the queue as a lease: released (cancelled) exactly once, by
    whoever ends the request first — woken, expired, or the client gone."""

    dispatcher: Dispatcher
    waiter: Waiter

    def release(self) -> None:
        self.dispatcher.cancel(self.waiter)  # a no-op once woken, expired or cancelled


@dataclass(frozen=True)
class FifoConfig:
    max_waiting: int = 1024  # beyond this a request is refused at once (429)
    timeout_s: float = 30.0  # a request waits at most this long for room (then 503)

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError("max_waiting: must not be negative")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")


def _load_builtins() -> None:
    from policies.queue import quartz, token_fair  # noqa: F401


DISPATCHERS: Registry[Dispatcher] = Registry("dispatch policy", _load_builtins)


@DISPATCHERS.register("fifo")
def _fifo(params: Mapping[str, Any]) -> Dispatcher:
    c = config_from(FifoConfig, params)
    return FifoDispatcher(c.max_waiting, c.timeout_s)


def make_dispatcher(name: str, params: Mapping[str, Any] | None = None) -> Dispatcher:
    return DISPATCHERS.make(name, params)
