"""Eq. 1–3 of the token-pools paper against hand-computed values, including the paper's own
numbers from §5.3 (Experiment 2)."""

from __future__ import annotations

import pytest

from policies.tenancy.capacity import KvGeometry, max_concurrency
from policies.tenancy.classes import ServiceClass
from policies.tenancy.control import priorities
from policies.tenancy.entitlement import Entitlement
from policies.tenancy.priority import (
    PriorityConfig,
    burst_excess,
    ewma,
    pool_mean_slo,
    priority,
    service_gap,
)

CFG = PriorityConfig()
E = ServiceClass.ELASTIC


def test_eq1_reproduces_the_papers_experiment_2_weights():
    # §5.3: copilot 500 ms, synth 30 s; ℓ̄* = 15,250 ms; w ≈ 93.8 and ≈ 20.3
    mean = pool_mean_slo([0.5, 30.0])
    assert mean == 15.25
    copilot = priority(E, 0.5, mean, 0.0, 0.0, CFG)
    synth = priority(E, 30.0, mean, 0.0, 0.0, CFG)
    assert copilot == pytest.approx(100 / (1 + 2 * 0.5 / 15.25))  # 93.846…
    assert round(copilot, 1) == 93.8 and round(synth, 1) == 20.3
    assert copilot / synth == pytest.approx(4.6, abs=0.05)  # "a 4.6× priority difference"


def test_eq1_debt_term_matches_the_papers_peak():
    # §5.3: "synth's priority rises from 20.3 to approximately 20.3 × (1 + 4.0 × 0.775) = 83.2"
    # (the paper multiplies the rounded 20.3; the unrounded 20.266 gives 83.09)
    synth = priority(E, 30.0, 15.25, 0.0, 0.775, CFG)
    assert synth == pytest.approx(100 / (1 + 2 * 30 / 15.25) * (1 + 4.0 * 0.775))
    assert synth == pytest.approx(83.2, abs=0.15)
    # the gap narrows from 4.6× to 3.9× (copilot at its own peak debt 0.607)
    copilot = priority(E, 0.5, 15.25, 0.0, 0.607, CFG)
    assert copilot / synth == pytest.approx(3.9, abs=0.05)


def test_eq1_class_and_burst_terms():
    # no SLO: the neutral term 1/(1 + α_slo) = 1/3
    assert priority(ServiceClass.GUARANTEED, None, None, 0.0, 0.0, CFG) == pytest.approx(1000 / 3)
    assert priority(ServiceClass.SPOT, None, None, 0.0, 0.0, CFG) == pytest.approx(1 / 3)
    assert priority(ServiceClass.PREEMPTIBLE, None, None, 0.0, 0.0, CFG) == pytest.approx(0.1 / 3)
    # b_e = 1: halves (1/(1 + 1·1)); negative debt lowers, floored at 0
    assert priority(E, None, None, 1.0, 0.0, CFG) == pytest.approx(100 / 3 / 2)
    assert priority(E, None, None, 0.0, -0.1, CFG) == pytest.approx(100 / 3 * 0.6)
    assert priority(E, None, None, 0.0, -1.0, CFG) == 0.0


def test_eq2_debt_ewma_by_hand():
    # γ_d = 0.7: g = 0.5 for three intervals: 0.15, 0.255, 0.3285
    d = 0.0
    for expected in (0.15, 0.255, 0.3285):
        d = ewma(d, 0.5, CFG.gamma_debt)
        assert d == pytest.approx(expected)
    # recovery: g = 0 decays by 0.7 an interval; ~50 s of 1 s steps → 0.7^50 ≈ 1.8e-8
    for _ in range(50):
        d = ewma(d, 0.0, CFG.gamma_debt)
    assert d == pytest.approx(0.3285 * 0.7**50)


def test_service_gap_counts_unmet_demand_only():
    assert service_gap(100.0, 40.0, 100.0) == pytest.approx(0.6)  # wanted ≥ baseline, got 40
    assert service_gap(100.0, 40.0, 20.0) == pytest.approx(0.2)  # wanted 60, got 40
    assert service_gap(100.0, 40.0, 0.0) == 0.0  # idle, not underserved
    assert service_gap(100.0, 150.0, 0.0) == pytest.approx(-0.5)  # bursting: credit
    assert service_gap(0.0, 10.0, 10.0) == 0.0  # no baseline (spot)


def test_eq3_burst_excess_by_hand():
    # 150 tokens/s on 100, 3 GB KV on 2 GB, 4 slots on 4: 0.5 + 0.5 + 0
    assert burst_excess(150.0, 3e9, 4, (100.0, 2e9, 4)) == pytest.approx(1.0)
    assert burst_excess(50.0, 1e9, 1, (100.0, 2e9, 4)) == 0.0
    assert burst_excess(50.0, 1e9, 9, (0.0, 0.0, 0.0)) == 0.0  # no baselines: nothing to exceed


def test_priorities_average_slo_over_bound_entitlements():
    ents = [
        Entitlement("copilot", "p", E, 100.0, 10, 5, 0.5),
        Entitlement("synth", "p", E, 100.0, 10, 5, 30.0),
    ]
    w = priorities(ents, {"synth": (0.775, 0.0)}, CFG)
    assert round(w["copilot"], 1) == 93.8 and w["synth"] == pytest.approx(83.2, abs=0.15)


def test_kv_bytes_per_token():
    # Llama-3-8B: 32 layers, 8 KV heads of 128, bf16 → 2·32·8·128·2 = 131,072 bytes (128 KiB)
    c = KvGeometry(32, 8, 128, 2).bytes_per_token
    assert c == 131_072
    # Qwen3-8B: 36 layers, 8 KV heads of 128 → 147,456; fp8 halves it
    assert KvGeometry(36, 8, 128, 2).bytes_per_token == 147_456
    assert KvGeometry(36, 8, 128, 1).bytes_per_token == 73_728
    # r_max = ⌊χ_gpu / (S·c)⌋: 16 GiB of KV, 4096-token sequences → 32
    assert max_concurrency(16 * 2**30, 4096, c) == 32
