"""The waiter bookkeeping every dispatcher keeps, whatever order it serves in.

Who waits (an arrival-ordered deque), how many could use each pool, the queue bound
(`max_waiting`: full → None, the driver's 429) and the deadline (`timeout_s`: 503
queue_timeout); each waiter leaves exactly once — woken, expired or cancelled — and the
dispatcher's own index (QUARTZ's heaps, token_fair's client queues) is told through
`on_leave`, so stale entries there are skipped or compacted by the dispatcher alone.

Expiry walks the arrivals from the front: every waiter has the same timeout, so deadlines
come in arrival order as long as each `add` is given a time no earlier than the last one;
a driver that ever goes back in time gets a full scan instead (the same answer, slower).
Waiters out of the queue are dropped from the front as they are met, and the deque is
compacted when the dead outnumber the live four to one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from policies.protocols.dispatch import Waiter
from policies.types import RequestInfo


@dataclass(slots=True, eq=False)
class Waiters:
    max_waiting: int = 1024  # beyond this a request is refused at once (429)
    timeout_s: float = 30.0  # a request waits at most this long for room (then 503)
    on_leave: Callable[[Waiter], None] | None = None  # the dispatcher's own index forgets it
    arrivals: deque[Waiter] = field(default_factory=deque)
    per_pool: dict[str, int] = field(default_factory=dict)  # live waiters that could use it
    live: int = 0
    _latest: float = float("-inf")  # the latest time `add` was given
    _in_order: bool = True  # deadlines are in arrival order (no `add` went back in time)

    def add(self, request: RequestInfo, pools: tuple[str, ...], now: float) -> Waiter | None:
        """A new waiter for `request`, or None when the queue is full."""
        if self.live >= self.max_waiting:
            return None
        if now < self._latest:
            self._in_order = False
        else:
            self._latest = now
        waiter = Waiter(request.id, pools, now, now + self.timeout_s, request=request)
        self.arrivals.append(waiter)
        per_pool = self.per_pool
        for pool in pools:
            per_pool[pool] = per_pool.get(pool, 0) + 1
        self.live += 1
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """Take a live waiter out of the queue (woken, expired or cancelled)."""
        waiter.done = True
        self.live -= 1
        for pool in waiter.pools:
            self.per_pool[pool] -= 1
        arrivals = self.arrivals
        if arrivals and arrivals[0] is waiter:
            arrivals.popleft()
        elif len(arrivals) > 4 * max(self.live, 16):
            self.arrivals = deque(w for w in arrivals if not w.done)
        if self.on_leave is not None:
            self.on_leave(waiter)

    def cancel(self, waiter: Waiter) -> None:
        """The client left: a no-op once the waiter was woken, expired or cancelled."""
        if not waiter.done:
            self.leave(waiter)

    def expire(self, now: float) -> list[Waiter]:
        """The waiters whose deadline has passed, in arrival order, out of the queue."""
        if not self._in_order:
            gone = [w for w in self.arrivals if not w.done and w.deadline <= now]
            for waiter in gone:
                self.leave(waiter)
            if not self.live:
                self._in_order, self._latest = True, float("-inf")
            return gone
        arrivals = self.arrivals
        gone = []
        while arrivals and (arrivals[0].done or arrivals[0].deadline <= now):
            waiter = arrivals.popleft()
            if not waiter.done:
                gone.append(waiter)
                self.leave(waiter)
                arrivals = self.arrivals  # `leave` may have compacted it
        return gone

    def oldest(self, pool: str) -> Waiter | None:
        """The longest-waiting waiter that could use `pool`, out of the queue (FIFO)."""
        arrivals = self.arrivals
        while arrivals and arrivals[0].done:
            arrivals.popleft()
        for waiter in arrivals:
            if not waiter.done and pool in waiter.pools:
                self.leave(waiter)
                return waiter
        return None

    def waiting(self, pool: str) -> int:
        return self.per_pool.get(pool, 0) if self.live else 0

    def __len__(self) -> int:
        return self.live
