"""Algorithm 1's properties: argmin of the grid, recalibration, p_c, φ, SLO posture."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from policies.planner import EXACT, PAPER, FleetSpec, calibrate, plan, sweep
from policies.planner.erlang import Binding
from policies.planner.profile import A100_LLAMA3_70B, H100_LLAMA3_70B
from policies.planner.sweep import feasible_boundaries


def test_optimum_is_the_grid_argmin(cdfs: dict) -> None:
    cal = calibrate(cdfs["azure_2023"], options=EXACT)
    sw = sweep(cal, 1000.0, 0.5, 1.0)
    assert sw.cost_hr[sw.best] == sw.cost_hr[sw.slo_met].min()
    assert list(cal.b) == list(feasible_boundaries(cdfs["azure_2023"], FleetSpec()))


def test_sweep_is_reusable_across_rates(cdfs: dict) -> None:
    cal = calibrate(cdfs["agent_heavy"], (8192,), options=PAPER)
    a = sweep(cal, 500.0, 0.5, 0.75)
    b = sweep(cal, 2000.0, 0.5, 0.75)
    assert sweep(cal, 500.0, 0.5, 0.75).n_s.tolist() == a.n_s.tolist()
    # the ρ_max regime scales linearly with load (Table 6)
    assert np.all(np.abs(b.n_s + b.n_l - 4 * (a.n_s + a.n_l)) <= 8)


def test_without_compression_every_gamma_is_pool_routing(cdfs: dict) -> None:
    cal = calibrate(cdfs["azure_2023"], (4096,), options=PAPER)
    sw = sweep(cal, 1000.0, 0.5, p_c=0.0)
    assert np.all(sw.alpha == sw.alpha[0, 0])
    assert np.all(sw.n_s == sw.n_s[0, 0])
    # the long pool still loses its borderline *calibration* mass but not its traffic
    assert np.all(sw.lam_l == sw.lam_l[0, 0])


def test_skipping_recalibration_overestimates_savings(cdfs: dict) -> None:
    # §6: calibrating μ_l on the whole above-B distribution at every γ under-sizes the
    # long pool; the planner's recalibrated long pool is larger
    cdf = cdfs["azure_2023"]
    cal = calibrate(cdf, (4096,), options=EXACT)
    sw = sweep(cal, 1000.0, 0.5, 1.0)
    j = list(cal.gammas).index(1.5)
    naive_mu = float(sw.mu_l[0, 0])  # γ = 1 calibration reused
    naive_n = int(np.ceil(float(sw.lam_l[0, j]) / (naive_mu * 0.85)))
    assert sw.mu_l[0, j] < naive_mu
    assert sw.n_l[0, j] > naive_n


def test_phi_prices_the_long_pool(cdfs: dict) -> None:
    cal = calibrate(cdfs["lmsys_chat_1m"], (1536,), options=PAPER)
    cheap = sweep(cal, 1000.0, 0.5, 1.0, phi=1.0)
    dear = sweep(cal, 1000.0, 0.5, 1.0, phi=3.0)
    assert dear.price_l == 3 * dear.price_s
    assert dear.cost_hr[dear.best] >= cheap.cost_hr[cheap.best]
    # a dearer long pool never makes the optimum keep more long GPUs
    assert dear.n_l[dear.best] <= cheap.n_l[cheap.best]


def test_heterogeneous_profiles(cdfs: dict) -> None:
    spec = FleetSpec(short_profile=A100_LLAMA3_70B, long_profile=H100_LLAMA3_70B)
    p = plan(cdfs["azure_2023"], 1000.0, 0.5, 1.0, 4096, spec=spec, options=EXACT)
    assert p.sweep.price_l == H100_LLAMA3_70B.cost_per_hr
    assert p.pool_routing.long is not None
    assert p.pool_routing.long.n_slots == H100_LLAMA3_70B.n_slots(65536)


def test_slo_floor_posture(cdfs: dict) -> None:
    # agent-heavy's long pool: the P99 request's prefill alone exceeds 500 ms (Eq. 8)
    p = plan(cdfs["agent_heavy"], 1000.0, 0.5, 0.75, 8192, options=PAPER)
    assert p.pool_routing.long is not None
    assert p.pool_routing.long.binding == Binding.INFEASIBLE.name
    assert p.pool_routing.long.ttft_floor_s > 0.5
    # the reference simulator's check (wait only) accepts the same fleet
    q = plan(cdfs["agent_heavy"], 1000.0, 0.5, 0.75, 8192,
             options=replace(PAPER, slo_budget="wait_only"))  # fmt: skip
    assert q.fleetopt.slo_met
    assert (q.pool_routing.n_s, q.pool_routing.n_l) == (p.pool_routing.n_s, p.pool_routing.n_l)


def test_uncompressed_band_is_never_dropped(cdfs: dict) -> None:
    # B = 32K, γ = 2: nothing lies above ⌊γB⌋ = 64K, but 25 % of the band stays long
    cal = calibrate(cdfs["agent_heavy"], (32768,), options=EXACT)
    sw = sweep(cal, 1000.0, 0.5, 0.75)
    j = list(cal.gammas).index(2.0)
    assert sw.lam_l[0, j] > 0 and sw.n_l[0, j] > 0
    mixed = sweep(calibrate(cdfs["agent_heavy"], (8192,), options=replace(EXACT,
                  uncompressed_band="long")), 1000.0, 0.5, 0.75)  # fmt: skip
    plain = sweep(calibrate(cdfs["agent_heavy"], (8192,), options=EXACT), 1000.0, 0.5, 0.75)
    # shorter band requests in the mix make the long pool faster, never slower
    assert np.all(mixed.mu_l[0, 1:] >= plain.mu_l[0, 1:])


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        replace(PAPER, moments="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        replace(PAPER, rho_max=1.2)


def test_option_variants_run(cdfs: dict) -> None:
    cdf = cdfs["lmsys_chat_1m"]
    for opt in (
        replace(EXACT, interpolation="step"),
        replace(EXACT, h_scaling="none"),
        replace(EXACT, compressed_mass="at_boundary"),
        replace(EXACT, prefill_stat="mean", ttft_batch="full"),
        replace(EXACT, fixed_output_tokens=256),
        replace(EXACT, long_edge="exclusive"),
    ):
        p = plan(cdf, 1000.0, 0.5, 1.0, 1536, options=opt)
        assert p.fleetopt.cost_per_hr <= p.pool_routing.cost_per_hr <= p.homogeneous.cost_per_hr
