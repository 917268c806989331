"""Token-length distributions: the workload CDF and its restriction to one pool.

FleetOpt §3.1 and Algorithm 1 steps 3–6. A workload is a CDF of L_total at integer
breakpoints, F(t_i), with an implicit origin (0, 0) and F = 1 beyond the last point (the
`fleetgate.workload_cdf/v1` semantics; the CLI reads the files and passes the points in).

Two interpolations (PlannerOptions.interpolation):
- "linear": F is piecewise-linear; a request in bin i has a uniform integer length in
  [t_{i-1}+1, t_i] (first bin [1, t_1]);
- "step": all of bin i's mass sits at t_i (a conservative, upper-edge reading).

A pool sees the workload through `PoolDistribution`: an ordered list of integer bins
[lo, hi] with the cumulative probability at each bin's end. Restrictions:
- homogeneous: the whole CDF, lengths clamped to the pool's context;
- short pool (Algorithm 1 step 5): F on [1, B], renormalised by F(B);
- long pool (step 6): F on (⌊γB⌋, ∞), renormalised by 1 − F(⌊γB⌋) — the post-compression
  distribution whose recalibration §6 calls critical;
- the band (B, ⌊γB⌋]: borderline requests the compressor could not shrink (1 − p_c of
  them) also go long; the paper's Algorithm 1 leaves them out of μ_l (exact when p_c = 1).
Cumulative values are computed in the reference simulator's arithmetic (F/F(B), and
(F − F(g))/(1 − F(g)) clipped to [0, 1] with the last set to 1) so that a seeded Monte Carlo
draw selects the same bin as the reference does.

Failure posture: malformed points raise ValueError; an empty restriction returns None
(no traffic for that pool) rather than a distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.planner.options import Interpolation, LongEdge


@dataclass(frozen=True, slots=True)
class LengthCdf:
    """F(L_total) at integer breakpoints: tokens strictly increasing, F non-decreasing, last F = 1."""

    points: tuple[tuple[int, float], ...]
    name: str = "workload"

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError(f"{self.name}: a CDF needs at least one point")
        prev_t, prev_f = 0, 0.0
        for t, f in self.points:
            if t <= prev_t:
                raise ValueError(f"{self.name}: tokens must be positive and strictly increasing")
            if not (0.0 <= f <= 1.0) or f < prev_f:
                raise ValueError(f"{self.name}: F must be non-decreasing within [0, 1]")
            prev_t, prev_f = t, f
        if abs(self.points[-1][1] - 1.0) > 1e-9:
            raise ValueError(f"{self.name}: the last point must have F = 1 (got {prev_f})")

    @staticmethod
    def from_points(points: Sequence[Sequence[float]], name: str = "workload") -> LengthCdf:
        """From plain `[[tokens, F], ...]` data (a JSON document's `points`)."""
        return LengthCdf(tuple((int(t), float(f)) for t, f in points), name)

    @staticmethod
    def from_counts(
        upper_bounds: Sequence[int], counts: Sequence[int], name: str = "observed"
    ) -> LengthCdf:
        """From a histogram: counts[i] requests with upper_bounds[i-1] < L ≤ upper_bounds[i]."""
        if len(upper_bounds) != len(counts):
            raise ValueError("bucket bounds and counts differ in length")
        if any(c < 0 for c in counts):
            raise ValueError("bucket counts must be ≥ 0")
        total = sum(counts)
        if total <= 0:
            raise ValueError("the histogram is empty")
        points: list[tuple[int, float]] = []
        running = 0
        for bound, count in zip(upper_bounds, counts, strict=True):
            running += count
            points.append((int(bound), running / total))
        # Trailing empty buckets carry no information; the CDF ends at the last full one.
        while len(points) > 1 and points[-2][1] >= 1.0:
            points.pop()
        points[-1] = (points[-1][0], 1.0)
        return LengthCdf(tuple(points), name)

    @property
    def max_tokens(self) -> int:
        return self.points[-1][0]

    def breakpoints(self) -> tuple[int, ...]:
        return tuple(t for t, _ in self.points)

    def cdf(self, x: float, interpolation: Interpolation = "linear") -> float:
        """F(x): P(L_total ≤ x)."""
        if x <= 0:
            return 0.0
        prev_t, prev_f = 0, 0.0
        for t, f in self.points:
            if x <= t:
                if interpolation == "step":
                    return f if x == t else prev_f
                # The reference's arithmetic order, so F(B) matches it to the last bit.
                return prev_f + (f - prev_f) * (x - prev_t) / (t - prev_t)
            prev_t, prev_f = t, f
        return 1.0


@dataclass(frozen=True, slots=True)
class PoolDistribution:
    """Integer lengths in bins [lo_i, hi_i] (uniform within a bin), cum_i = P(bin ≤ i).

    `drawn[i]` is False for a bin whose length is fixed (a step-CDF point, or a bin beyond
    the pool's context clamped to it): the Monte Carlo sampler then draws no integer."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    cum: tuple[float, ...]
    drawn: tuple[bool, ...]

    def probabilities(self) -> tuple[float, ...]:
        prev = 0.0
        out = []
        for c in self.cum:
            out.append(max(0.0, c - prev))
            prev = max(prev, c)
        return tuple(out)

    @property
    def max_length(self) -> int:
        return max(self.hi)

    def quantile(self, q: float) -> int:
        """The smallest integer L with P(length ≤ L) ≥ q."""
        prev = 0.0
        for lo, hi, c in zip(self.lo, self.hi, self.cum, strict=True):
            if c >= q and c > prev:
                width = hi - lo + 1
                k = math.ceil((q - prev) / (c - prev) * width - 1e-9)
                return lo - 1 + min(max(k, 1), width)
            prev = max(prev, c)
        return self.hi[-1]


def _distribution(
    points: Sequence[tuple[int, float]],
    cum: Sequence[float],
    first_lo: int,
    max_ctx: int,
    interpolation: Interpolation,
) -> PoolDistribution:
    los: list[int] = []
    his: list[int] = []
    drawn: list[bool] = []
    prev = first_lo - 1
    for t, _ in points:
        if interpolation == "step":
            lo = hi = min(t, max_ctx)
            draw = False
        else:
            lo, hi, draw = prev + 1, min(t, max_ctx), True
            if lo > hi:  # a bin beyond the pool's context: its requests run at the context
                lo, hi, draw = max_ctx, max_ctx, False
        los.append(lo)
        his.append(hi)
        drawn.append(draw)
        prev = t
    return PoolDistribution(tuple(los), tuple(his), tuple(cum), tuple(drawn))


def whole(cdf: LengthCdf, max_ctx: int, interpolation: Interpolation) -> PoolDistribution:
    """The homogeneous pool: every request, lengths clamped to `max_ctx`."""
    return _distribution(cdf.points, [f for _, f in cdf.points], 1, max_ctx, interpolation)


def short_pool(
    cdf: LengthCdf, b_short: int, interpolation: Interpolation
) -> PoolDistribution | None:
    """F restricted to [1, B]; a B between breakpoints gets the partial bin (t_k, B]."""
    f_b = cdf.cdf(b_short, interpolation)
    if f_b <= 0.0:
        return None
    pts = [(t, f) for t, f in cdf.points if t <= b_short]
    if interpolation == "linear" and (not pts or pts[-1][0] < b_short):
        pts.append((b_short, f_b))
    if not pts:
        return None
    last = pts[-1][1]
    return _distribution(pts, [f / last for _, f in pts], 1, b_short, interpolation)


def long_pool(
    cdf: LengthCdf,
    lower: int,
    max_ctx: int,
    interpolation: Interpolation,
    edge: LongEdge,
) -> PoolDistribution | None:
    """F restricted to (lower, ∞) with lower = ⌊γB⌋, renormalised by 1 − F(lower)."""
    f_g = cdf.cdf(lower, interpolation)
    rest = 1.0 - f_g
    pts = [(t, f) for t, f in cdf.points if t > lower]
    if not pts or rest <= 1e-12:
        return None
    cum = [max(0.0, min(1.0, (f - f_g) / rest)) for _, f in pts]
    cum[-1] = 1.0
    first_lo = max(1, lower) if edge == "inclusive" else lower + 1
    return _distribution(pts, cum, first_lo, max_ctx, interpolation)


def band_pool(
    cdf: LengthCdf, lower: int, upper: int, max_ctx: int, interpolation: Interpolation
) -> PoolDistribution | None:
    """F restricted to (lower, upper]: the borderline band (B, ⌊γB⌋] whose requests the
    compressor could not shrink (a fraction 1 − p_c of them) and so still go long."""
    f_lo = cdf.cdf(lower, interpolation)
    f_hi = cdf.cdf(upper, interpolation)
    mass = f_hi - f_lo
    if upper <= lower or mass <= 1e-12:
        return None
    pts = [(t, f) for t, f in cdf.points if lower < t <= upper]
    if interpolation == "linear" and (not pts or pts[-1][0] < upper):
        pts.append((upper, f_hi))
    cum = [max(0.0, min(1.0, (f - f_lo) / mass)) for _, f in pts]
    cum[-1] = 1.0
    return _distribution(pts, cum, lower + 1, max_ctx, interpolation)
