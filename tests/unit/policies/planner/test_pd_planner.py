"""The P/D planner (policies/planner/pd.py, `fleetgate plan --pd`): its per-role
capacities against the simulator's engines saturated (an independent implementation: the
engine model's step loop, the core's pair flow, a closed loop), its split against the
simulated sweep's best, its refusals."""

from __future__ import annotations

import json

import pytest

from fleetgate.plan import main
from policies.planner.pd import PdWorkload, RoleEngine, decode_batch, size, split
from tests.experiments.pd_experiments import (
    DECODE_H,
    OUTPUT,
    PREFILL_BUDGET,
    PREFILL_SEQS,
    PREFILL_TOKEN_S,
    PROMPT,
    run_point,
)

# the harness's requests: answers uniform in [192, 256] (mean 224)
WORKLOAD = PdWorkload(PROMPT, (OUTPUT * 3 // 4 + OUTPUT) / 2)
PREFILL = RoleEngine(
    prefill_token_s=PREFILL_TOKEN_S,
    max_num_batched_tokens=PREFILL_BUDGET,
    max_num_seqs=PREFILL_SEQS,
)
DECODE = RoleEngine(h=DECODE_H)


def test_prefill_capacity_is_the_simulated_prefill_ceiling():
    plan = split(WORKLOAD, 3, PREFILL, DECODE)
    row = run_point("1P/2D", 192, 2.0, 20.0)  # far past the knee: the prefill saturated
    assert row.prefill_busy > 0.9 and row.decode_busy < 0.3
    assert row.rps == pytest.approx(plan.mu_prefill, rel=0.03)


def test_decode_capacity_is_the_simulated_decode_ceiling():
    plan = split(WORKLOAD, 6, PREFILL, DECODE)
    row = run_point("5P/1D", 512, 2.0, 20.0)  # five prefills feed one decode past its batch
    assert row.decode_busy > 0.85
    assert row.rps == pytest.approx(plan.mu_decode, rel=0.03)


def test_the_split_of_six_is_the_simulated_sweeps_best_and_says_which_side_binds():
    plan = split(WORKLOAD, 6, PREFILL, DECODE)
    assert (plan.best.prefill, plan.best.decode) == (4, 2)  # docs/PD.md: 117.7 rps at C = 256
    bound = {(s.prefill, s.decode): s.bound for s in plan.splits}
    assert bound[(1, 5)] == bound[(4, 2)] == "prefill" and bound[(5, 1)] == "decode"
    assert 0.5 < plan.balanced_prefill_share < 1.0  # this engine model's decode is cheap


def test_size_serves_the_rate_under_the_cap():
    plan = size(WORKLOAD, 100.0, PREFILL, DECODE, rho=0.8)
    s = plan.best
    assert s.prefill_rps * 0.8 >= 100.0 and s.decode_rps * 0.8 >= 100.0
    assert (s.prefill - 1) * plan.mu_prefill * 0.8 < 100.0  # the fewest
    assert (s.decode - 1) * plan.mu_decode * 0.8 < 100.0 or s.decode == 1


def test_an_itl_target_caps_the_decode_batch():
    assert decode_batch(DECODE) == 256
    assert decode_batch(RoleEngine(w=0.008, h=0.0001), itl_s=0.010) == 20
    with pytest.raises(ValueError, match="itl_s"):
        decode_batch(RoleEngine(w=0.008, h=0.0001), itl_s=0.005)


def test_cli(capsys: pytest.CaptureFixture[str]):
    assert main(["--pd", "--gpus", "6", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"] == {"prefill": 4, "decode": 2} and len(doc["splits"]) == 5
    assert main(["--pd", "--gpus", "6"]) == 0
    assert "4P/2D ←" in capsys.readouterr().out
    assert main(["--pd", "--gpus", "1"]) == 2
    assert main(["--pd", "--prompt-tokens", "0"]) == 2
