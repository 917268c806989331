"""The token budget: a token bucket in exact integers (the token-pools paper, §4.3 check 4).

An entitlement's throughput λ_e (and a pool's Λ_p) is a bucket that refills at that rate
up to a depth of rate·window tokens; a request reserves its budget (prompt + max_tokens)
from it at admission and settlement refunds what the engine did not use. The arithmetic is
in integers — time in microseconds, tokens in milli-tokens — so that the Redis store's Lua
script (gateway/store_redis_lua.py) computes bit for bit what this module computes: the
only floating-point steps are `rate·dt/1000` and `added·1000/rate`, each floored, which
IEEE doubles evaluate identically in Python and in Lua.

Refill advances the bucket's clock only by the time the added milli-tokens account for,
so frequent calls lose nothing to rounding (a 1 token/s bucket read every 100 µs still
refills at 1 token/s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MILLI = 1000  # milli-tokens per token
MICRO = 1_000_000  # microseconds per second


def to_us(seconds: float) -> int:
    return round(seconds * MICRO)


@dataclass(slots=True)
class Bucket:
    rate: float  # tokens/s
    depth: int  # milli-tokens
    level: int  # milli-tokens, 0 ≤ level ≤ depth
    t: int  # µs: the time `level` is valid at

    @classmethod
    def full(cls, rate: float, window_s: float, now_us: int) -> Bucket:
        depth = math.floor(rate * window_s * MILLI)
        return cls(rate, depth, depth, now_us)

    def refill(self, now_us: int) -> None:
        dt = now_us - self.t
        if dt <= 0:
            return
        if self.level >= self.depth or self.rate <= 0:
            self.level = min(self.level, self.depth)
            self.t = now_us
            return
        added = math.floor(self.rate * dt / 1000)
        if self.level + added >= self.depth:
            self.level = self.depth
            self.t = now_us
        elif added > 0:
            self.level += added
            self.t += min(dt, math.floor(added * 1000 / self.rate))

    def wait_s(self, need: int) -> float:
        """Seconds until `need` milli-tokens are there (0 if they are now)."""
        if need <= self.level:
            return 0.0
        if self.rate <= 0:
            return math.inf
        return (need - self.level) / (self.rate * MILLI)

    def take(self, amount: int) -> int:
        """Take up to `amount`; returns what was taken (the level never goes below 0)."""
        taken = min(amount, self.level)
        self.level -= taken
        return taken

    def give(self, amount: int) -> None:
        self.level = min(self.depth, self.level + amount)
