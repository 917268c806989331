"""A pool's saturation regime from the TTFTs the gateway measures ("The Price of Anarchy in
Disaggregated Inference", §6.2, eq. 10–11; docs/CACHE_ROUTING.md).

Every control interval Δ (5 s):

    L(t)  = the P99 of the TTFTs of the last `window_s` seconds (nearest rank)
    L̄(t)  = α·L(t) + (1 − α)·L̄(t − Δ)          α = 0.3; L̄ starts at the first L
    Below if L̄ < θ1, Transition if θ1 ≤ L̄ < θ2, Saturated if L̄ ≥ θ2

An interval without a TTFT in its window leaves L̄ and the regime as they are (no
latency was measured; the paper polls Prometheus, which repeats its last value).

Thresholds are absolute (`theta1_s`, `theta2_s`: the paper's 70B used 0.3 s / 2 s, its
340B 1 s / 10 s) or relative to a baseline: the median of the P99s of the first
`warmup_intervals` intervals with traffic (or `baseline_s` when known), θ1 = 4 × baseline
(the paper's rule of thumb is 3–5×) and θ2 = 6.7 × θ1 — which gives the paper's 300 ms /
2 s for a 75 ms baseline. The regime is Below during warm-up.

Hysteresis (the paper leaves k and ε open; ours: k = 2, ε = 0.1 × the threshold): the
regime rises only after k consecutive samples of L̄ above a threshold (> θ1, ≥ θ2) and falls
only after k consecutive samples below it by the margin (< θ1 − ε1, < θ2 − ε2); it moves to
the least extreme level the k samples agree on. A signal within ±ε of θ1 therefore changes
the regime at most once. Pure: time is the `now` it is given.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum


class Regime(IntEnum):
    BELOW = 0
    TRANSITION = 1
    SATURATED = 2


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    interval_s: float = 5.0  # Δ, the control interval
    alpha: float = 0.3  # the EWMA's weight of the newest P99
    window_s: float = 30.0  # the P99's window (the paper leaves it open)
    quantile: float = 0.99
    theta1_s: float | None = None  # absolute thresholds, seconds; None: relative
    theta2_s: float | None = None
    baseline_s: float | None = None  # a known baseline P99; None: learnt at warm-up
    theta1_x_baseline: float = 4.0
    theta2_x_theta1: float = 6.7
    warmup_intervals: int = 6  # intervals with traffic whose P99s make the baseline
    k: int = 2  # consecutive samples to change regime
    epsilon: float = 0.1  # the margin below a threshold to fall back, × the threshold
    max_samples: int = 100_000  # TTFTs kept in the window at most (memory bound)

    def __post_init__(self) -> None:
        if not self.interval_s > 0 or not self.window_s > 0:
            raise ValueError("interval_s, window_s: must be positive")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError("alpha: must be in (0, 1]")
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError("quantile: must be in (0, 1]")
        if (self.theta1_s is None) != (self.theta2_s is None):
            raise ValueError("theta1_s, theta2_s: give both or neither")
        t1, t2 = self.theta1_s, self.theta2_s
        if t1 is not None and t2 is not None and not 0 < t1 < t2:
            raise ValueError("theta1_s, theta2_s: need 0 < theta1_s < theta2_s")
        if self.baseline_s is not None and not self.baseline_s > 0:
            raise ValueError("baseline_s: must be positive")
        if not self.theta1_x_baseline > 0 or not self.theta2_x_theta1 > 1:
            raise ValueError("theta1_x_baseline must be > 0 and theta2_x_theta1 > 1")
        if self.warmup_intervals < 1 or self.k < 1 or self.max_samples < 1:
            raise ValueError("warmup_intervals, k, max_samples: must be >= 1")
        if not 0.0 <= self.epsilon < 1.0:
            raise ValueError("epsilon: must be in [0, 1)")


def p_quantile(values: list[float], q: float) -> float:
    """The nearest-rank q-quantile of non-empty `values`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(slots=True)
class SaturationDetector:
    config: DetectorConfig = field(default_factory=DetectorConfig)
    regime: Regime = Regime.BELOW
    smoothed: float | None = None  # L̄
    last_p99: float | None = None  # L of the last interval with traffic
    theta1: float | None = None
    theta2: float | None = None
    changes: int = 0  # regime changes so far
    _samples: deque[tuple[float, float]] = field(default_factory=deque)
    _next_tick: float | None = None
    _warm: list[float] = field(default_factory=list)
    _streak: int = 0  # consecutive samples proposing a move in direction `_dir`
    _dir: int = 0
    _level: int = 0  # the least extreme level the streak agrees on

    def __post_init__(self) -> None:
        c = self.config
        if c.theta1_s is not None:
            self.theta1, self.theta2 = c.theta1_s, c.theta2_s
        elif c.baseline_s is not None:
            self._set_baseline(c.baseline_s)

    @property
    def baseline(self) -> float | None:
        if self.theta1 is None:
            return None
        return self.theta1 / self.config.theta1_x_baseline

    def observe(self, ttft_s: float, now: float) -> Regime:
        """A TTFT measured at `now` (after closing the intervals that ended before)."""
        self.advance(now)
        samples = self._samples
        samples.append((now, ttft_s))
        if len(samples) > self.config.max_samples:
            samples.popleft()
        return self.regime

    def advance(self, now: float) -> Regime:
        """Close every control interval that ended by `now`."""
        if self._next_tick is None:
            self._next_tick = now + self.config.interval_s
            return self.regime
        while self._next_tick <= now:
            tick = self._next_tick
            self._next_tick = tick + self.config.interval_s
            self.step(self._window_p99(tick))
        return self.regime

    def _window_p99(self, now: float) -> float | None:
        samples = self._samples
        oldest = now - self.config.window_s
        while samples and samples[0][0] < oldest:
            samples.popleft()
        if not samples:
            return None
        # events may come a little out of time order (a first token stamped later than the
        # next arrival): the window is a filter, not only the deque's order
        window = [v for t, v in samples if oldest <= t <= now]
        return p_quantile(window, self.config.quantile) if window else None

    def step(self, p99: float | None) -> Regime:
        """One control interval whose window P99 is `p99` (None: no traffic)."""
        if p99 is None:
            return self.regime
        c = self.config
        self.last_p99 = p99
        prev = self.smoothed
        self.smoothed = p99 if prev is None else c.alpha * p99 + (1 - c.alpha) * prev
        if self.theta1 is None:  # warm-up: learn the baseline
            self._warm.append(p99)
            if len(self._warm) >= c.warmup_intervals:
                self._set_baseline(statistics.median(self._warm))
            return self.regime
        self._classify(self.smoothed)
        return self.regime

    def _set_baseline(self, baseline: float) -> None:
        c = self.config
        self.theta1 = c.theta1_x_baseline * baseline
        self.theta2 = c.theta2_x_theta1 * self.theta1

    def _propose(self, level: float) -> int:
        assert self.theta1 is not None and self.theta2 is not None
        t1, t2, eps = self.theta1, self.theta2, self.config.epsilon
        r = int(self.regime)
        up = 2 if level >= t2 else 1 if level > t1 else 0
        if up > r:
            return up
        down = 0 if level < t1 * (1 - eps) else 1 if level < t2 * (1 - eps) else 2
        return down if down < r else r

    def _classify(self, level: float) -> None:
        r = int(self.regime)
        p = self._propose(level)
        if p == r:
            self._streak, self._dir = 0, 0
            return
        d = 1 if p > r else -1
        if d != self._dir:
            self._streak, self._dir, self._level = 0, d, p
        self._streak += 1
        self._level = min(self._level, p) if d > 0 else max(self._level, p)
        if self._streak >= self.config.k:
            self.regime = Regime(self._level)
            self.changes += 1
            self._streak, self._dir = 0, 0
