"""The token-pools paper's experiments in the simulator (§5.2–5.3): the qualitative claims.

The shipped scenarios run in about a second each (a few hundred requests), so they run
whole; bench/token_pools_experiments.py prints the figures beside the paper's and plots.
"""

from __future__ import annotations

from collections import Counter

import pytest

from simulator.run import run
from simulator.scenario import load
from tests.experiments.token_pools_experiments import LedgerTrace, run_exp1, run_exp2


@pytest.fixture(scope="module")
def exp1() -> tuple[dict, dict]:
    _, on = run_exp1(load("token-pools-exp1"))
    _, off = run_exp1(load("token-pools-exp1-off"))
    return on, off


def test_exp1_guaranteed_latency_stays_bounded_while_spot_is_refused(exp1) -> None:
    on, _ = exp1
    assert on["guaranteed_p99_ttft_s"] < 1.2  # the paper's bound
    assert on["max_queue"] <= 3  # the engine's queue stays (nearly) empty
    spot = on["refused"]["spot-b"]
    assert spot.get("pool_contention", 0) >= 20 and set(spot) == {"pool_contention"}
    for name in ("guaranteed-a", "guaranteed-c"):
        # a guaranteed request is never refused for contention, only beyond its own r_e
        assert set(on["refused"].get(name, {})) <= {"concurrency"}


def test_exp1_without_admission_the_queue_and_latency_grow(exp1) -> None:
    on, off = exp1
    assert off["refused"] == {}
    assert off["max_queue"] >= 30  # paper: 34
    assert off["latency_end_phase2_s"] > 3 * on["guaranteed_p99_latency_s"]
    assert off["guaranteed_p99_ttft_s"] > 5.0


def test_exp2_copilot_has_no_low_priority_denials_and_synth_absorbs_them() -> None:
    result, trace, figures = run_exp2(load("token-pools-exp2"))
    assert isinstance(trace, LedgerTrace)
    copilot, synth = figures["copilot"], figures["synth"]
    assert copilot["low_priority_denials"] == 0
    assert synth["low_priority_denials"] >= 50
    # Eq. 1 before reports binds: the pool-average SLO is (0.5 + 30)/2 = 15.25 s
    assert copilot["priority_at_start"] == pytest.approx(93.8, abs=0.05)
    assert synth["priority_at_start"] == pytest.approx(20.3, abs=0.05)
    # both accrue debt in the outage, synth more; both fall back after recovery
    assert synth["peak_debt"] > copilot["peak_debt"] > 0.1
    t = trace.t
    late = [d for ti, d in zip(t, trace.debt["synth"], strict=True) if 170 <= ti <= 210]
    assert max(abs(d) for d in late) < 0.2
    # the pool's capacity followed the fleet: 8 slots in the outage, 16 outside it
    slots = dict(zip(t, trace.slots, strict=True))
    assert slots[min(t, key=lambda x: abs(x - 60))] == 8
    assert slots[min(t, key=lambda x: abs(x - 150))] == 16
    # reports' entitlement binds at 210 s: none of its requests come earlier
    assert min(r.arrival for r in result.records if r.client == "reports") >= 210
    statuses = Counter(r.status for r in result.records)
    assert set(statuses) <= {"ok", "rejected_429"}


def test_exp1_with_preemptible_tenant_b_evicts_it_for_guaranteed_c() -> None:
    """Experiment 1 with spot-b made preemptible: when guaranteed-c joins into a full pool,
    its grants name b's requests, which the simulator driver cancels on the engine and
    records as evicted (code `preempted`); a guaranteed request is never evicted or refused
    for contention, and nothing is held once the run ends."""
    scenario = load("token-pools-exp1")
    params = scenario.policy.admission.params
    params["entitlements"]["spot-b"]["class"] = "preemptible"
    result = run(scenario)
    evicted = [r for r in result.records if r.status == "evicted"]
    assert evicted and {r.client for r in evicted} == {"spot-b"}
    assert {r.refusal for r in evicted} == {"preempted"}
    # evictions happen where demand exceeds the pool: while guaranteed-c is bound
    assert all(30.0 <= r.finish <= 61.0 for r in evicted)  # type: ignore[operator]
    for r in result.records:
        if r.client.startswith("guaranteed"):
            assert r.status in ("ok", "rejected_429")
            assert r.status == "ok" or r.refusal == "concurrency"
    assert result.core is not None
    ledger = result.core.admitter.ledger  # type: ignore[attr-defined]
    pool = ledger.pools["qwen3-8b"]
    assert pool.in_flight == 0 and not pool.holds and pool.named_slots == 0
