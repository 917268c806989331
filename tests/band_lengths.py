"""Request lengths for the borderline benchmark (tests/shapes.py): L_total and max_tokens
drawn from a real workload CDF restricted to the band (B_short, γ·B_short], or uniformly.

Modes (`--lengths`):

| mode    | L_total in the band                                             | max_tokens (default)  |
|---------|-----------------------------------------------------------------|-----------------------|
| uniform | uniform (the corpus before; also what the LMSYS file's linear   | 256/512/512/1024      |
|         | interpolation gives, since (8192, 12288] is one of its bins)    |                       |
| lmsys   | LMSYS-Chat-1M CDF (simulator/data/lmsys_chat_1m.json, source of | Azure 2023 measured   |
|         | FleetOpt Table 7) restricted to the band, Pareto-interpolated   | output lengths        |
| azure   | Azure 2023 raw-trace ECDF (azure_2023_trace_fine.json,          | the same, scaled      |
|         | all_total) in Azure's own paper band (4096, 6144], scaled by    | like L_total          |
|         | B_short/4096 (it has no request in (8192, 12288])               |                       |

Why Pareto interpolation for LMSYS. The file has 18 breakpoints and the band (8192, 12288] is
one bin, so its documented linear interpolation makes the band uniform. The CDF's own tail
says otherwise: the mean density falls 3.5× from the bin below (6144, 8192] to the band and
3.3× again to the bin above, a power-law tail (1 − F(x) ∝ x^−2.2 across 8K–16K). Pareto
interpolation — log-log linear survival S = 1 − F between consecutive breakpoints, the
standard reading of binned heavy-tailed data — keeps F exact at every breakpoint (the band's
mass and every bin's are unchanged) and gives the band a density ∝ x^−(a+1) with
a = ln(S(lo)/S(hi)) / ln(hi/lo) (2.30 for LMSYS at 8192..12288). The paper states no
output lengths for Table 7; the LMSYS file gives totals only, so max_tokens comes from the
one measured split here, the Azure 2023 trace's GeneratedTokens (`all_output`, mean 154,
p99 581; LMSYS-Chat-1M's own paper reports responses of the same order, ~215 tokens).
`split` is the paper's planner assumption instead (L_out = L − ⌊0.8·L⌋, FleetOpt §7.1; not
measured, data README), and `mix` the old 256/512/512/1024. Together, LMSYS + Azure outputs
need a mean reduction 1 − (B_short − L_out)/(L_total − L_out) of 15.5 % (p50 14.8 %), which
is Table 7's 15.4 % (p50 14.2 %); uniform lengths need ~19–20 %.

Everything is drawn from a caller's `random.Random`, so a seed fixes the corpus.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Literal

from simulator.lengths import load_cdf

LENGTHS = ("uniform", "lmsys", "azure")
MAX_TOKENS = ("mix", "azure-output", "split")
LengthsMode = Literal["uniform", "lmsys", "azure"]
AZURE_PAPER_B_SHORT = 4096  # FleetOpt Table 2: Azure's band is (4096, 6144] at γ = 1.5


@dataclass(frozen=True, slots=True)
class BandCDF:
    """A CDF conditioned on the band (lo, hi]: knots x_0 = lo < … < x_k = hi with
    G(x_i) = (F(x_i) − F(lo)) / (F(hi) − F(lo)); between knots `pareto` (log-log linear
    survival of the full CDF) or `linear`."""

    knots: tuple[float, ...]
    survival: tuple[float, ...]  # S(x_i) = 1 − F(x_i) of the full CDF
    pareto: bool

    def cdf(self, x: float) -> float:
        """G(x): the fraction of the band's requests with L_total ≤ x."""
        lo, hi = self.knots[0], self.knots[-1]
        if x <= lo:
            return 0.0
        if x >= hi:
            return 1.0
        i = bisect.bisect_right(self.knots, x) - 1
        return (self.survival[0] - self._survival(i, x)) / (self.survival[0] - self.survival[-1])

    def inverse(self, u: float) -> float:
        """The x with G(x) = u (u in [0, 1])."""
        s_target = self.survival[0] - u * (self.survival[0] - self.survival[-1])
        i = 0
        while i < len(self.knots) - 2 and self.survival[i + 1] > s_target:
            i += 1
        (x0, x1), (s0, s1) = self.knots[i : i + 2], self.survival[i : i + 2]
        if s0 == s1:
            return x0
        if self.pareto and s1 > 0:
            a = math.log(s0 / s1) / math.log(x1 / x0)
            return x0 * float((s_target / s0) ** (-1 / a))
        return x0 + (x1 - x0) * (s0 - s_target) / (s0 - s1)

    def _survival(self, i: int, x: float) -> float:
        (x0, x1), (s0, s1) = self.knots[i : i + 2], self.survival[i : i + 2]
        if self.pareto and s1 > 0 and s0 > s1:
            return s0 * float((x / x0) ** (-math.log(s0 / s1) / math.log(x1 / x0)))
        return s0 + (s1 - s0) * (x - x0) / (x1 - x0)


def band_cdf(name: str, lo: int, hi: int, *, pareto: bool, series: str | None = None) -> BandCDF:
    """The workload CDF `name` (simulator.lengths.load_cdf) restricted to (lo, hi]."""
    full = load_cdf(name, series)
    inside = [t for t in full.tokens if lo < t < hi]
    knots = (lo, *inside, hi)
    survival = tuple(1.0 - full.cdf(x) for x in knots)
    if survival[0] - survival[-1] <= 0:
        raise ValueError(f"{full.name}: no mass in ({lo}, {hi}]")
    return BandCDF(tuple(float(k) for k in knots), survival, pareto)


@dataclass(frozen=True, slots=True)
class BandLengths:
    """Draws (L_total, max_tokens) for one borderline request of the band (lo, hi]."""

    mode: LengthsMode
    max_tokens_source: str
    lo: int  # B_short (exclusive)
    hi: int  # ⌊γ·B_short⌋ (inclusive)
    band: BandCDF | None  # None for uniform
    scale: float  # azure: B_short / 4096, else 1

    def draw_total(self, rng: random.Random) -> int:
        if self.band is None:
            return rng.randint(self.lo + 1, self.hi)
        x = self.band.inverse(rng.random()) * self.scale
        return min(self.hi, max(self.lo + 1, math.ceil(x)))

    def draw_max_tokens(self, rng: random.Random, l_total: int) -> int:
        if self.max_tokens_source == "mix":
            return rng.choice((256, 512, 512, 1024))
        if self.max_tokens_source == "split":
            return max(1, l_total - int(0.8 * l_total))
        out = load_cdf("azure_2023_trace_fine", "all_output")
        u = rng.random()
        k = min(bisect.bisect_left(out.probs, u), len(out.tokens) - 1)
        t0, f0 = (out.tokens[k - 1], out.probs[k - 1]) if k else (0, 0.0)
        frac = (u - f0) / (out.probs[k] - f0) if out.probs[k] > f0 else 1.0
        return max(1, round((t0 + (out.tokens[k] - t0) * frac) * self.scale))


def band_lengths(
    mode: str, b_short: int, gamma: float = 1.5, max_tokens: str | None = None
) -> BandLengths:
    """The length model of `mode` for the band (b_short, ⌊γ·b_short⌋]."""
    lo, hi = b_short, int(gamma * b_short)
    source = max_tokens or ("mix" if mode == "uniform" else "azure-output")
    if source not in MAX_TOKENS:
        raise ValueError(f"max_tokens source {source!r}: one of {', '.join(MAX_TOKENS)}")
    if mode == "uniform":
        return BandLengths("uniform", source, lo, hi, None, 1.0)
    if mode == "lmsys":
        return BandLengths("lmsys", source, lo, hi, band_cdf("lmsys_chat_1m", lo, hi, pareto=True), 1.0)  # fmt: skip
    if mode == "azure":
        a_lo, a_hi = AZURE_PAPER_B_SHORT, int(gamma * AZURE_PAPER_B_SHORT)
        band = band_cdf("azure_2023_trace_fine", a_lo, a_hi, pareto=False, series="all_total")
        return BandLengths("azure", source, lo, hi, band, b_short / AZURE_PAPER_B_SHORT)
    raise ValueError(f"lengths {mode!r}: one of {', '.join(LENGTHS)}")
