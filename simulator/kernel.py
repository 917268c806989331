"""The event kernel: a virtual clock and a heap of timed callbacks.

An event is a tuple ``(time, priority, sequence, callback, argument)`` in a binary heap
(`heapq`). Ties on time are broken by priority (lower first: a worker's step completes
before an arrival at the same instant is routed, so routing sees the freed slots), and
then by the sequence number the kernel assigns at scheduling time. The order of events is
therefore a pure function of what was scheduled, never of object identity or hashing, so
a seeded run is reproducible bit for bit.

The kernel knows nothing about requests, engines or policies: it moves the clock to the
next event's time and calls ``callback(argument)``. Everything else (workers stepping,
arrivals, telemetry scrapes, metric samples) is a callback someone scheduled.

Failure posture: scheduling into the past raises (a bug in a driver, never silently
reordered); an exception raised by a callback propagates out of `run` with the clock at
the failing event's time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, TypeVar, overload

_Arg = TypeVar("_Arg")

# Priorities of events that share a timestamp (lower runs first).
PRIO_STEP = 0  # a worker's step ends: its tokens and completions exist from this instant
PRIO_ARRIVAL = 1  # a request reaches the gateway
PRIO_TIMER = 2  # periodic work: telemetry scrapes, queue retries
PRIO_SAMPLE = 3  # metric sampling observes the state after everything else at that instant


class VirtualClock:
    """The policies' `Clock` protocol over virtual seconds; only the kernel moves it."""

    __slots__ = ("t",)

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


class Kernel:
    """A discrete-event loop in virtual time."""

    __slots__ = ("_cancelled", "_heap", "_seq", "clock", "events")

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        # (time, priority, sequence, callback, arg): each callback's arg has its own type,
        # checked where it is scheduled (`at`'s overloads)
        self._heap: list[tuple[float, int, int, Callable[[Any], None], Any]] = []
        self._seq = 0
        self._cancelled: set[int] = set()  # events dropped unrun (a timer no longer needed)
        self.events = 0  # callbacks run so far

    def now(self) -> float:
        return self.clock.t

    @overload
    def at(self, time: float, priority: int, callback: Callable[[None], None]) -> int: ...
    @overload
    def at(
        self, time: float, priority: int, callback: Callable[[_Arg], None], arg: _Arg
    ) -> int: ...
    def at(
        self, time: float, priority: int, callback: Callable[[Any], None], arg: object = None
    ) -> int:
        """Run ``callback(arg)`` at virtual `time` (not before now); returns the event's
        handle for `cancel`."""
        if time < self.clock.t:
            raise ValueError(f"event scheduled in the past: {time} < now {self.clock.t}")
        self._seq += 1
        heapq.heappush(self._heap, (time, priority, self._seq, callback, arg))
        return self._seq

    def cancel(self, handle: int) -> None:
        """Drop a scheduled event: it neither runs nor moves the clock (a queue deadline
        of a request that was served must not stretch the run to that deadline)."""
        self._cancelled.add(handle)

    @overload
    def after(self, delay: float, priority: int, callback: Callable[[None], None]) -> int: ...
    @overload
    def after(
        self, delay: float, priority: int, callback: Callable[[_Arg], None], arg: _Arg
    ) -> int: ...
    def after(
        self, delay: float, priority: int, callback: Callable[[Any], None], arg: object = None
    ) -> int:
        return self.at(self.clock.t + delay, priority, callback, arg)

    def pending(self) -> int:
        return len(self._heap) - len(self._cancelled)

    def run(self, until: float | None = None, max_events: int | None = None) -> int:
        """Run events in order until none is left, the next is after `until`, or
        `max_events` have run. Returns the number run by this call."""
        heap = self._heap
        clock = self.clock
        cancelled = self._cancelled
        pop = heapq.heappop
        limit = float("inf") if until is None else until
        budget = -1 if max_events is None else max_events
        ran = 0
        while heap and ran != budget:
            if heap[0][0] > limit:
                break
            time, _prio, seq, callback, arg = pop(heap)
            if cancelled and seq in cancelled:
                cancelled.discard(seq)
                continue
            clock.t = time
            callback(arg)
            ran += 1
        self.events += ran
        if until is not None and clock.t < until and (not heap or heap[0][0] > until):
            clock.t = until
        return ran
