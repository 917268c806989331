"""tests/band_lengths.py: the CDF modes draw L_total inside the borderline band and follow
the workload CDF restricted to it (a one-sample Kolmogorov–Smirnov check on seeded draws
against a reference written here from the data file's points, not from the code under
test); uniform stays uniform; max_tokens sources are the documented ones."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.band_lengths import band_lengths

B_SHORT, HI = 8192, 12288
N = 400
KS_CRITICAL = 1.63 / math.sqrt(N)  # α = 0.01
DATA = Path(__file__).resolve().parents[3] / "simulator" / "data"


def points(name: str, series: str | None = None) -> list[tuple[float, float]]:
    doc = json.loads((DATA / f"{name}.json").read_text())
    if series is not None:
        doc = next(s for s in doc["series"] if s["name"] == series)
    return [(0.0, 0.0)] + [(float(t), float(f)) for t, f in doc["points"]]


def linear_f(pts: list[tuple[float, float]], x: float) -> float:
    for (t0, f0), (t1, f1) in itertools.pairwise(pts):
        if x <= t1:
            return f0 + (f1 - f0) * (x - t0) / (t1 - t0)
    return 1.0


def ks(sample: list[int], reference: Callable[[float], float]) -> float:
    xs = sorted(sample)
    n = len(xs)
    return max(
        max(abs(reference(x) - (i + 1) / n), abs(reference(x) - i / n)) for i, x in enumerate(xs)
    )


def lmsys_band_reference() -> Callable[[float], float]:
    """LMSYS F restricted to (8192, 12288]: one bin of the file, Pareto-interpolated:
    S(x) = S(8192)·(x/8192)^−a, a from the bin's two ends."""
    pts = dict(points("lmsys_chat_1m"))
    s_lo, s_hi = 1 - pts[8192.0], 1 - pts[12288.0]
    a = math.log(s_lo / s_hi) / math.log(HI / B_SHORT)
    return lambda x: (s_lo - s_lo * (x / B_SHORT) ** -a) / (s_lo - s_hi)


def test_lmsys_lengths_stay_in_the_band_and_follow_the_cdf() -> None:
    model = band_lengths("lmsys", B_SHORT)
    rng = random.Random(2024)
    totals = [model.draw_total(rng) for _ in range(N)]
    assert all(B_SHORT < t <= HI for t in totals)
    assert ks(totals, lmsys_band_reference()) < KS_CRITICAL
    # and it is not the uniform corpus: the band's density falls with length
    assert ks(totals, lambda x: (x - B_SHORT) / (HI - B_SHORT)) > 2 * KS_CRITICAL


def test_azure_lengths_follow_the_trace_in_its_own_band_scaled() -> None:
    pts = points("azure_2023_trace_fine", "all_total")
    f_lo, f_hi = linear_f(pts, 4096), linear_f(pts, 6144)
    assert linear_f(points("azure_2023"), HI) == linear_f(points("azure_2023"), B_SHORT)

    def reference(x: float) -> float:
        return (linear_f(pts, x / 2) - f_lo) / (f_hi - f_lo)

    model = band_lengths("azure", B_SHORT)
    rng = random.Random(7)
    totals = [model.draw_total(rng) for _ in range(N)]
    assert all(B_SHORT < t <= HI for t in totals)
    assert ks(totals, reference) < KS_CRITICAL


def test_uniform_mode_is_uniform() -> None:
    model = band_lengths("uniform", B_SHORT)
    rng = random.Random(3)
    totals = [model.draw_total(rng) for _ in range(N)]
    assert all(B_SHORT < t <= HI for t in totals)
    assert ks(totals, lambda x: (x - B_SHORT) / (HI - B_SHORT)) < KS_CRITICAL


def test_max_tokens_sources() -> None:
    rng = random.Random(5)
    assert band_lengths("uniform", B_SHORT).draw_max_tokens(rng, 9000) in (256, 512, 1024)
    assert band_lengths("lmsys", B_SHORT, max_tokens="split").draw_max_tokens(rng, 10001) == 2001
    out = points("azure_2023_trace_fine", "all_output")
    model = band_lengths("lmsys", B_SHORT)
    drawn = [model.draw_max_tokens(rng, 9000) for _ in range(N)]
    assert all(1 <= d <= 1899 for d in drawn)
    assert ks(drawn, lambda x: linear_f(out, x)) < KS_CRITICAL
    with pytest.raises(ValueError):
        band_lengths("lmsys", B_SHORT, max_tokens="forever")
    with pytest.raises(ValueError):
        band_lengths("gaussian", B_SHORT)
