"""Time for pure code.

Policies, the compressor and the engine model never read the wall clock: they are handed
a `Clock`. The gateway passes a monotonic clock, the simulator a virtual one, and tests a
`ManualClock` they move by hand, so one policy object behaves identically in all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Seconds as a float; only differences are meaningful."""

    def now(self) -> float: ...


@dataclass
class ManualClock:
    """A clock that moves only when told to (tests, the simulator's kernel)."""

    t: float = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        if dt < 0:
            raise ValueError(f"a clock cannot go back: advance({dt})")
        self.t += dt
        return self.t

    def set(self, t: float) -> None:
        if t < self.t:
            raise ValueError(f"a clock cannot go back: set({t}) < {self.t}")
        self.t = t
