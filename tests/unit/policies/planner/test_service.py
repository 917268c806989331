"""The iteration model (Eq. 3–4) and the per-pool moments, Monte Carlo and exact."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from policies.planner import A100_LLAMA3_70B, EXACT, PAPER, LengthCdf
from policies.planner.service import (
    LengthTable,
    exact_moments,
    monte_carlo_moments,
    service_time,
    split,
    ttft_floor,
)
from policies.planner.workload import long_pool, short_pool, whole

P = A100_LLAMA3_70B


def test_split_80_20_and_fixed_output() -> None:
    lengths = np.array([1, 2, 5, 10, 4096])
    l_in, l_out = split(lengths, PAPER)
    assert l_in.tolist() == [1, 1, 4, 8, 3276]
    assert l_out.tolist() == [1, 1, 1, 2, 820]
    l_in, l_out = split(lengths, replace(PAPER, fixed_output_tokens=256))
    assert l_out.tolist() == [1, 1, 4, 9, 256]
    assert (l_in + l_out)[2:].tolist() == [5, 10, 4096]


def test_service_time_by_hand() -> None:
    # L = 4096 in the 4K pool (256 slots): L_in 3276 → 7 chunks, L_out 820;
    # t_iter = 8 ms + 0.65 ms · (4096/8192) · 256
    t_iter = 0.008 + 0.00065 * (4096 / 8192) * 256
    s = service_time(np.array([4096]), 256, P, PAPER)[0]
    assert s == pytest.approx((7 + 820) * t_iter, rel=1e-12)
    # Eq. 3 as printed: H is not scaled by the context
    s_flat = service_time(np.array([4096]), 256, P, replace(PAPER, h_scaling="none"))[0]
    assert s_flat == pytest.approx((7 + 820) * (0.008 + 0.00065 * 256), rel=1e-12)
    # TTFT floor: 7 prefill iterations + 1 decode iteration, alone in the batch
    solo = 0.008 + 0.00065 * (4096 / 8192)
    assert ttft_floor(np.array([4096]), 256, P, PAPER)[0] == pytest.approx(8 * solo)


def _brute(dist, table):  # type: ignore[no-untyped-def]
    m1 = m2 = 0.0
    for lo, hi, p in zip(dist.lo, dist.hi, dist.probabilities(), strict=True):
        s = table.s[lo : hi + 1]
        m1 += p * float(s.mean())
        m2 += p * float((s * s).mean())
    return m1, m2


def test_exact_moments_equal_enumeration(cdfs: dict) -> None:
    cdf = cdfs["azure_2023"]
    table = LengthTable.build(4096, 256, P, EXACT)
    dist = short_pool(cdf, 4096, "linear")
    assert dist is not None
    m = exact_moments(dist, table, EXACT)
    m1, m2 = _brute(dist, table)
    assert m.mean_s == pytest.approx(m1, rel=1e-9)
    assert m.mean_s2 == pytest.approx(m2, rel=1e-9)
    assert m.mu_gpu == pytest.approx(256 / m1)


def test_monte_carlo_converges_to_exact() -> None:
    cdf = LengthCdf(((512, 0.3), (2048, 0.8), (8192, 1.0)), "toy")
    table = LengthTable.build(65536, 16, P, PAPER)
    dist = whole(cdf, 65536, "linear")
    exact = exact_moments(dist, table, PAPER)
    mc = monte_carlo_moments(dist, table, replace(PAPER, mc_draws=40_000))
    # 40k draws: the standard error of the mean is ~0.6 % for this spread
    assert mc.mean_s == pytest.approx(exact.mean_s, rel=0.02)
    assert mc.cv2 == pytest.approx(exact.cv2, rel=0.05)


def test_monte_carlo_is_seeded_and_draw_for_draw() -> None:
    cdf = LengthCdf(((100, 0.5), (200, 1.0)), "toy")
    table = LengthTable.build(200, P.n_slots(200), P, PAPER)
    dist = whole(cdf, 200, "linear")
    a = monte_carlo_moments(dist, table, replace(PAPER, mc_draws=50))
    assert a == monte_carlo_moments(dist, table, replace(PAPER, mc_draws=50))
    # the draw sequence: random() picks the bin, randint the length, from Random(42)
    import random

    rng = random.Random(42)
    total = 0.0
    for _ in range(50):
        u = rng.random()
        length = rng.randint(1, 100) if u <= 0.5 else rng.randint(101, 200)
        total += float(table.s[length])
    assert a.mean_s == total / 50


def test_long_pool_hardens_with_gamma(cdfs: dict) -> None:
    # §6 "Critical: μ_l recalibration": the post-compression long pool is longer on average
    cdf = cdfs["azure_2023"]
    table = LengthTable.build(65536, 16, P, EXACT)
    means = []
    for gamma in (1.0, 1.5, 2.0):
        d = long_pool(cdf, int(gamma * 4096), 65536, "linear", "inclusive")
        assert d is not None
        means.append(exact_moments(d, table, EXACT).mean_s)
    assert means == sorted(means) and means[-1] > 2 * means[0]
    assert all(math.isfinite(m) for m in means)
