"""Compressed requests in the short pool (PlannerOptions.compressed_mass).

Compression shortens the prompt, not the answer: a band request (B < L ≤ ⌊γB⌋) reaches the
short pool with its prompt cut to T_c = B − L_out (FleetOpt §5.1, Eq. 15) and its original
output, and holds a slot for prefill of T_c plus decode of that output. Algorithm 1 step 5
prices the short pool on F over [1, B] whatever γ ("restricted", the paper's tables);
"band" (the default) prices the rate-weighted mixture. The oracle below enumerates every
integer length with the paper's constants, not the planner's prefix sums.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from policies.planner import DEFAULT, EXACT, PAPER, calibrate, plan, sweep
from policies.planner import paper as ref
from policies.planner.workload import LengthCdf

W, H, CHUNK, C_CALIB = 0.008, 0.00065, 512, 8192  # FleetOpt §3.1, A100 + Llama-3-70B


def _f(points: tuple[tuple[int, float], ...], x: int) -> float:
    prev_t, prev_f = 0, 0.0
    for t, v in points:
        if x <= t:
            return prev_f + (v - prev_f) * (x - prev_t) / (t - prev_t)
        prev_t, prev_f = t, v
    return 1.0


def _oracle(
    cdf: LengthCdf, b: int, gamma: float, p_c: float, n_max: int, scaled: bool
) -> tuple[float, float]:
    """E[S], E[S²] of the short pool by enumeration: L ≤ B as is, B < L ≤ ⌊γB⌋ with its
    prompt cut to B − L_out, weights P(L) and P(L)·p_c."""
    weights, services = [], []
    for length in range(1, int(gamma * b) + 1):
        p = _f(cdf.points, length) - _f(cdf.points, length - 1)
        l_in = max(1, int(length * 0.8))
        l_out = max(1, length - l_in)
        if length > b:
            p *= p_c
            l_in = min(l_in, max(1, b - l_out))
        h = H * (l_in + l_out) / C_CALIB if scaled else H
        services.append((math.ceil(l_in / CHUNK) + l_out) * (W + h * n_max))
        weights.append(p)
    w = np.array(weights) / sum(weights)
    s = np.array(services)
    return float(w @ s), float(w @ (s * s))


@pytest.mark.parametrize("h_scaling", ["none", "request"])
@pytest.mark.parametrize(
    ("b", "gamma", "p_c"), [(4096, 2.0, 1.0), (4096, 1.5, 0.6), (2048, 1.3, 1.0)]
)
def test_short_pool_is_the_mixture(
    cdfs: dict, h_scaling: str, b: int, gamma: float, p_c: float
) -> None:
    cdf = cdfs["azure_2023"]
    opts = replace(EXACT, h_scaling=h_scaling)  # type: ignore[arg-type]
    sw = sweep(calibrate(cdf, (b,), (1.0, gamma), options=opts), 200.0, 0.5, p_c)
    n_max = 128 * C_CALIB // b  # §7.1: 128 slots at 8K, n_max ∝ 1/B
    m1, m2 = _oracle(cdf, b, gamma, p_c, n_max, h_scaling == "request")
    assert sw.short.slots[0, 1] == n_max
    assert sw.short.m1[0, 1] == pytest.approx(m1, rel=1e-9)
    assert sw.short.m2[0, 1] == pytest.approx(m2, rel=1e-9)
    # the paper's pricing is the short slice alone, the same at every γ
    literal = replace(opts, compressed_mass="restricted")
    paper = sweep(calibrate(cdf, (b,), (1.0, gamma), options=literal), 200.0, 0.5, p_c)
    slice_only = _oracle(cdf, b, 1.0, p_c, n_max, h_scaling == "request")[0]
    assert paper.short.m1[0, 1] == paper.short.m1[0, 0]
    assert paper.short.m1[0, 1] == pytest.approx(slice_only, rel=1e-9)
    assert sw.short.m1[0, 1] > paper.short.m1[0, 1]  # band requests decode longer answers


def test_without_compressed_traffic_the_options_agree(cdfs: dict) -> None:
    """γ = 1 (no band) and p_c = 0 (nothing compressed): bit for bit the paper's pricing."""
    for workload, b in (("azure_2023", 4096), ("lmsys_chat_1m", 1536), ("agent_heavy", 8192)):
        band = calibrate(cdfs[workload], (b,), options=EXACT)
        literal = replace(EXACT, compressed_mass="restricted")
        restricted = calibrate(cdfs[workload], (b,), options=literal)
        for p_c in (0.0, 1.0):
            a, r = sweep(band, 1000.0, 0.5, p_c), sweep(restricted, 1000.0, 0.5, p_c)
            cols = slice(None) if p_c == 0.0 else slice(0, 1)
            for name in ("m1", "m2", "floor", "k", "ks"):
                assert np.array_equal(
                    getattr(a.short, name)[:, cols], getattr(r.short, name)[:, cols]
                )
            assert np.array_equal(a.n_s[:, cols], r.n_s[:, cols])


def test_a_compressed_request_keeps_its_output(cdfs: dict) -> None:
    """With a fixed output budget k every compressed request is prefill of B − k tokens
    plus k decode steps: E[k-iterations] of the band is exactly ⌈(B − k)/C⌉ + k."""
    cdf = cdfs["azure_2023"]
    opts = replace(EXACT, fixed_output_tokens=700)
    cal = calibrate(cdf, (4096,), (1.0, 2.0), options=opts)
    band = cal.compressed[0][1]
    assert band is not None
    assert band.mean_k == pytest.approx(math.ceil((4096 - 700) / CHUNK) + 700, rel=1e-12)
    assert band.mean_s2 == pytest.approx(band.mean_s**2, rel=1e-9)  # one service time
    # ... and its TTFT floor is a request at L = B (Eq. 15), the compressed class's
    assert band.ttft_floor_s == cal.edge[0].ttft_floor_s


def test_mixture_is_continuous_and_grows_with_gamma(cdfs: dict) -> None:
    cdf = cdfs["azure_2023"]
    gammas = tuple(round(1.0 + 0.05 * k, 2) for k in range(21))
    sw = sweep(calibrate(cdf, (4096,), gammas, options=EXACT), 1000.0, 0.5, 1.0)
    es = sw.short.m1[0]
    assert np.all(np.diff(es) > 0)
    assert np.all(np.abs(np.diff(es)) / es[:-1] < 0.12)


# ── what the default changes at the paper's points ─────────────────────────────────


def test_paper_options_still_reproduce_table3() -> None:
    assert PAPER.compressed_mass == "restricted" and DEFAULT.compressed_mass == "band"
    assert replace(PAPER, compressed_mass="band") == DEFAULT


@pytest.mark.parametrize(
    ("workload", "pr_cr", "fleetopt", "gamma"),
    [
        ("azure_2023", (77, 45), (91, 2), 2.0),  # paper (47, 45), (48, 2)
        ("lmsys_chat_1m", (10, 65), (11, 52), 2.0),  # paper (7, 65), (7, 52)
        # paper (255, 1981), (255, 1981) at γ 1.5: with p_c 0.75 and Algorithm 1's tail-only
        # long pool, C&R no longer pays once its requests are priced as served
        ("agent_heavy", (374, 1981), (229, 2037), 1.0),
    ],
)
def test_table3_under_the_default(
    cdfs: dict, workload: str, pr_cr: tuple[int, int], fleetopt: tuple[int, int], gamma: float
) -> None:
    """Regression figures: the short pool grows where compressed traffic joins it; the
    homogeneous and pool-routing fleets (no compression) are the paper's."""
    case = next(c for c in ref.TABLE3 if c.workload == workload)
    p = plan(cdfs[workload], ref.RATE, ref.SLO_S, case.p_c, case.b_short, options=DEFAULT)
    assert p.homogeneous.total == case.homogeneous
    assert (p.pool_routing.n_s, p.pool_routing.n_l) == case.pool_routing
    assert (p.pr_cr.n_s, p.pr_cr.n_l) == pr_cr
    assert (p.fleetopt.n_s, p.fleetopt.n_l) == fleetopt and p.fleetopt.gamma == gamma
    # the long pool is what the paper sizes; only the short pool pays for the answers
    assert p.pr_cr.n_l == case.pr_cr[1]
    assert p.fleetopt.cost_per_hr <= min(p.pr_cr.cost_per_hr, p.pool_routing.cost_per_hr)


def test_check_points_under_the_default(cdfs: dict) -> None:
    """test_check_points.py's points (the paper's pricing there, to compare with the
    authors' planner) as the default prices them: the same (B, γ), 2–6 more short GPUs."""
    cdf = cdfs["lmsys_chat_1m"]
    a = plan(cdf, 600.0, 0.25, 1.0, 1536)
    assert (a.fleetopt.n_s, a.fleetopt.n_l, a.fleetopt.gamma) == (7, 31, 2.0)  # paper's: 5, 31
    b = plan(cdf, 1000.0, 0.5, 1.0)
    assert (b.fleetopt.b_short, b.fleetopt.gamma) == (3072, 2.0)
    assert (b.fleetopt.n_s, b.fleetopt.n_l) == (19, 35)  # paper's: 14, 35
