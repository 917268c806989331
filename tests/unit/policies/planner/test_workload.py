"""Workload CDFs: interpolation, restriction to a pool, quantiles, histograms."""

from __future__ import annotations

import pytest

from policies.planner import LengthCdf
from policies.planner.workload import band_pool, long_pool, short_pool, whole

TOY = LengthCdf(((10, 0.5), (20, 0.75), (40, 1.0)), "toy")


@pytest.mark.parametrize(
    ("name", "b", "alpha", "beta"),
    [("azure_2023", 4096, 0.898, 0.078), ("lmsys_chat_1m", 1536, 0.909, 0.046),
     ("agent_heavy", 8192, 0.740, 0.112)],
)  # fmt: skip
def test_table2_alpha_beta(cdfs: dict, name: str, b: int, alpha: float, beta: float) -> None:
    cdf = cdfs[name]
    assert cdf.cdf(b) == pytest.approx(alpha, abs=6e-4)
    assert cdf.cdf(int(1.5 * b)) - cdf.cdf(b) == pytest.approx(beta, abs=6e-4)


def test_linear_and_step_interpolation() -> None:
    assert TOY.cdf(0) == 0.0
    assert TOY.cdf(5) == pytest.approx(0.25)  # from the implicit origin
    assert TOY.cdf(15) == pytest.approx(0.625)
    assert TOY.cdf(1000) == 1.0
    assert TOY.cdf(15, "step") == 0.5
    assert TOY.cdf(20, "step") == 0.75
    assert TOY.cdf(9, "step") == 0.0


def test_invalid_cdfs_are_rejected() -> None:
    for pts in (((10, 0.5), (5, 1.0)), ((10, 0.6), (20, 0.5), (30, 1.0)), ((10, 0.5),)):
        with pytest.raises(ValueError):
            LengthCdf(pts)


def test_restrictions_partition_the_mass() -> None:
    s = short_pool(TOY, 20, "linear")
    assert s is not None
    assert s.lo == (1, 11) and s.hi == (10, 20)
    assert s.cum[-1] == 1.0 and s.probabilities()[0] == pytest.approx(0.5 / 0.75)
    # a boundary between breakpoints gets the partial bin, consistent with α = F(B)
    s15 = short_pool(TOY, 15, "linear")
    assert s15 is not None and s15.hi == (10, 15)
    assert s15.probabilities()[1] == pytest.approx((0.625 - 0.5) / 0.625)
    g = long_pool(TOY, 25, 40, "linear", "inclusive")
    assert g is not None and g.lo == (25,) and g.hi == (40,)
    assert long_pool(TOY, 25, 40, "linear", "exclusive").lo == (26,)  # type: ignore[union-attr]
    assert long_pool(TOY, 40, 64, "linear", "inclusive") is None
    band = band_pool(TOY, 10, 30, 64, "linear")
    assert band is not None and band.lo == (11, 21) and band.hi == (20, 30)
    assert band.probabilities()[0] == pytest.approx(0.25 / (0.875 - 0.5))


def test_context_clamp() -> None:
    d = whole(TOY, 30, "linear")
    assert d.hi == (10, 20, 30) and d.drawn == (True, True, True)
    d = whole(LengthCdf(((10, 0.5), (20, 0.75), (40, 1.0))), 15, "linear")
    assert d.lo[-1] == d.hi[-1] == 15 and not d.drawn[-1]


def test_quantile_of_bins() -> None:
    d = whole(TOY, 40, "linear")
    assert d.quantile(0.5) == 10
    assert d.quantile(0.05) == 1
    # brute force: the smallest L with P(≤ L) ≥ q
    probs = {}
    for lo, hi, p in zip(d.lo, d.hi, d.probabilities(), strict=True):
        for length in range(lo, hi + 1):
            probs[length] = p / (hi - lo + 1)
    for q in (0.1, 0.33, 0.6, 0.9, 0.97, 0.99):
        acc = 0.0
        for length in sorted(probs):
            acc += probs[length]
            if acc >= q - 1e-12:
                assert d.quantile(q) == length
                break


def test_histogram_counts_to_cdf() -> None:
    cdf = LengthCdf.from_counts([64, 128, 256, 512], [10, 30, 60, 0])
    assert cdf.points == ((64, 0.1), (128, 0.4), (256, 1.0))
    with pytest.raises(ValueError):
        LengthCdf.from_counts([64], [0])
    with pytest.raises(ValueError):
        LengthCdf.from_counts([64, 128], [1])
