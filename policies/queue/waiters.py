"""The waiter bookkeeping every dispatcher keeps, whatever order it serves in.

Who waits (an arrival-ordered deque), how many could use each pool, the queue bound
(`max_waiting`: full → None, the driver's 429) and each waiter's deadline (`timeout_s`
after it came: the `Wait` action carries it, the driver's timer reports `Deadline` and the
core cancels the waiter, 503 queue_timeout); each waiter leaves exactly once — woken or
cancelled — and the dispatcher's own index (QUARTZ's heaps, token_fair's client queues) is
told through `on_leave`, so stale entries there are skipped or compacted by the dispatcher
alone.

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

    def add(self, request: RequestInfo, pools: tuple[str, ...], now: float) -> Waiter | None:
        """A new waiter for `request`, or None when the queue is full."""
        if self.live >= self.max_waiting:
            return None
        waiter = Waiter(request.id, pools, now, now + self.timeout_s, request=request)
        self.arrivals.append(waiter)
        per_pool = self.per_pool
        for pool in pools:
            per_pool[pool] = per_pool.get(pool, 0) + 1
        self.live += 1
        return waiter

    def leave(self, waiter: Waiter) -> None:
        """Take a live waiter out of the queue (woken or cancelled)."""
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
        """The client left, or its deadline passed: a no-op once the waiter was woken or
        cancelled."""
        if not waiter.done:
            self.leave(waiter)

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
