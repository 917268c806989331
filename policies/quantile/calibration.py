"""Online calibration of predicted prefill quantiles, and the fallback it drives (QUARTZ
§3.2, §3.5, §4.2 of the QUARTZ paper).

Regimes: a request's feature vector falls in one of 3 × 3 × 3 buckets — prompt length
(< 1,024 / < 4,096 / longer tokens, `prompt_edges`), locality class (none / partial /
high) and worker load (running + waiting < 8 / < 48 / more, `load_edges`).

Correction, conformal style (Romano et al. 2019, one-sided): each bucket keeps the last
`window` residuals e = y − q̂α of the model's raw α-quantile, where y is the observed
prefill time; the calibrated quantile is

    Q̂α = q̂α + c_b,   c_b = the ⌈(n+1)·α⌉-th smallest of the bucket's n residuals

(so, were residuals exchangeable, P(y ≤ Q̂α) ≥ α). The mean is shifted by the bucket's
mean residual of the raw mean. A bucket with fewer than `min_samples` residuals borrows
the pooled correction of all buckets (and with fewer than that, none). The residual
window is kept sorted beside its arrival order, so a correction is one index lookup on
the hot path and an observation one `insort` and one removal.

Coverage: each observation records whether y ≤ the calibrated Q̂α the request was routed
with — per regime (reported) and pooled over the last `window` observations. Fallback:
when pooled under-coverage α − coverage exceeds δ (after `min_samples` observations) the
calibration reports `degraded`, the router falls back to least-loaded and the queue to
FIFO; it recovers once under-coverage is back below δ/2 (hysteresis, so it does not flap).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass, field

from policies.quantile.features import BUCKET, PROMPT, RUNNING, WAITING, Quantiles, Vector

REGIMES = 27
PROMPT_NAMES = ("short", "medium", "long")
LOCALITY_NAMES = ("none", "partial", "high")
LOAD_NAMES = ("low", "mid", "high")


def regime_name(regime: int) -> str:
    """`prompt/locality/load`, e.g. `long/none/high` (a metric label: 27 values at most)."""
    p, rest = divmod(regime, 9)
    loc, load = divmod(rest, 3)
    return f"{PROMPT_NAMES[p]}/{LOCALITY_NAMES[loc]}/{LOAD_NAMES[load]}"


@dataclass(slots=True)
class _Window:
    """The last `size` values, in arrival order and sorted."""

    size: int
    order: deque[float] = field(default_factory=deque)
    ranked: list[float] = field(default_factory=list)

    def add(self, v: float) -> None:
        self.order.append(v)
        insort(self.ranked, v)
        if len(self.order) > self.size:
            del self.ranked[bisect_left(self.ranked, self.order.popleft())]

    def __len__(self) -> int:
        return len(self.order)


@dataclass(slots=True)
class _Recent:
    """The last `size` values in arrival order and their sum (a mean needs no ranks)."""

    size: int
    order: deque[float] = field(default_factory=deque)
    total: float = 0.0

    def add(self, v: float) -> None:
        self.order.append(v)
        self.total += v
        if len(self.order) > self.size:
            self.total -= self.order.popleft()

    def __len__(self) -> int:
        return len(self.order)


@dataclass(slots=True)
class _Bucket:
    q_res: _Window  # y − raw q̂α
    m_res: _Recent  # y − raw mean
    hits: deque[bool]
    hit_count: int = 0
    shift_q: float = 0.0  # cached corrections (recomputed on observe)
    shift_m: float = 0.0
    ready: bool = False


@dataclass(slots=True)
class Calibration:
    alpha: float = 0.95
    delta: float = 0.05  # fall back when α − coverage exceeds this
    window: int = 256  # residuals (and coverage outcomes) kept per bucket
    min_samples: int = 32  # a bucket's own correction needs this many; coverage too
    prompt_edges: tuple[int, int] = (1024, 4096)
    load_edges: tuple[int, int] = (8, 48)
    enabled: bool = (
        True  # False: raw quantiles (the "no calibration" ablation); coverage still tracked
    )
    degraded: bool = False
    _buckets: list[_Bucket] = field(init=False)
    _pooled: _Bucket = field(init=False)
    changes: int = 0  # how many times `degraded` flipped (a metric)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError("calibration: alpha must be in (0, 1)")
        if not 0.0 < self.delta < self.alpha:
            raise ValueError("calibration: delta must be in (0, alpha)")
        if self.window < 2 or self.min_samples < 1:
            raise ValueError("calibration: window >= 2 and min_samples >= 1")
        self._buckets = [self._bucket() for _ in range(REGIMES)]
        self._pooled = self._bucket()

    def _bucket(self) -> _Bucket:
        return _Bucket(_Window(self.window), _Recent(self.window), deque(maxlen=self.window))

    def regime(self, x: Vector) -> int:
        p = x[PROMPT]
        pe = self.prompt_edges
        pb = 0 if p < pe[0] else 1 if p < pe[1] else 2
        load = x[RUNNING] + x[WAITING]
        le = self.load_edges
        lb = 0 if load < le[0] else 1 if load < le[1] else 2
        return pb * 9 + int(x[BUCKET]) * 3 + lb

    def correct(self, raw: Quantiles, regime: int) -> Quantiles:
        """The calibrated quantiles of one prediction (raw itself when calibration is off
        or has no samples yet)."""
        t = (raw.mean, raw.q90, raw.q95)
        c = self.correct_tuple(t, regime)
        return raw if c is t else Quantiles(*c)

    def correct_tuple(
        self, raw: tuple[float, float, float], regime: int
    ) -> tuple[float, float, float]:
        """`correct` on a plain (mean, q90, q95), by the same arithmetic (`max(a, b)` is
        `b if b > a else a`): the routing hot path makes no `Quantiles` per candidate."""
        if not self.enabled:
            return raw
        b = self._buckets[regime]
        if not b.ready:
            b = self._pooled
            if not b.ready:
                return raw
        sq = b.shift_q
        m, a, c = raw
        mean = m + b.shift_m
        if mean < 0.0:
            mean = 0.0
        q90 = a + sq
        if mean > q90:
            q90 = mean
        q95 = c + sq
        if q90 > q95:
            q95 = q90
        return mean, q90, q95

    def observe(self, regime: int, raw: Quantiles, routed_q: float, y: float) -> None:
        """A first token: `y` seconds of prefill for a request predicted `raw` (the model's)
        and routed with calibrated α-quantile `routed_q`."""
        self.observe_tuple(regime, (raw.mean, raw.q90, raw.q95), routed_q, y)

    def observe_tuple(
        self, regime: int, raw: tuple[float, float, float], routed_q: float, y: float
    ) -> None:
        """`observe` with the model's prediction as a plain (mean, q90, q95)."""
        q = raw[1] if self.alpha == 0.9 else raw[2]  # raw q̂α (q95 for another α)
        e_q = y - q
        e_m = y - raw[0]
        hit = y <= routed_q
        alpha, min_samples = self.alpha, self.min_samples
        for b in (self._buckets[regime], self._pooled):
            w = b.q_res  # _Window.add and _Recent.add, inlined
            order, ranked = w.order, w.ranked
            order.append(e_q)
            insort(ranked, e_q)
            if len(order) > w.size:
                del ranked[bisect_left(ranked, order.popleft())]
            m = b.m_res
            m.order.append(e_m)
            m.total += e_m
            if len(m.order) > m.size:
                m.total -= m.order.popleft()
            hits = b.hits
            if len(hits) == hits.maxlen:
                b.hit_count -= hits[0]
            hits.append(hit)
            b.hit_count += hit
            n = len(order)
            if n >= min_samples:
                k = math.ceil((n + 1) * alpha) - 1
                b.shift_q = ranked[k if k < n - 1 else n - 1]
                b.shift_m = m.total / n
                b.ready = True
        self._check()

    def _check(self) -> None:
        pooled = self._pooled
        n = len(pooled.hits)
        if n < self.min_samples:
            return
        under = self.alpha - pooled.hit_count / n
        if not self.degraded and under > self.delta:
            self.degraded = True
            self.changes += 1
        elif self.degraded and under < self.delta / 2:
            self.degraded = False
            self.changes += 1

    def coverage(self) -> float | None:
        """Pooled coverage over the recent window (None before any observation)."""
        n = len(self._pooled.hits)
        return self._pooled.hit_count / n if n else None

    def coverage_by_regime(self) -> dict[str, tuple[float, int]]:
        """Per regime with observations: (coverage over its window, observations)."""
        out = {}
        for i, b in enumerate(self._buckets):
            n = len(b.hits)
            if n:
                out[regime_name(i)] = (b.hit_count / n, n)
        return out
