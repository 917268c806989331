"""Table 5: the simulator runs the planned pool-routing fleets and measures each pool's
busy-slot fraction; it must agree with the planner's analytical utilisation within 3 %.

The planner is run with the simulator engine's iteration law (h_scaling="none": a step
costs W + H per request, no L/8192 factor) and exact moments; the engine charges every
step at the full batch (w = W + H·n_max, h = 0), the assumption behind ρ_ana = λ/(n μ_gpu)
(see bench/planner_sim.py for the batch-accurate engine, where ρ_ana does not hold and the
planner's ρ_load is the counterpart). Scaled to λ = 50 req/s so it runs in seconds; the
fleet is the one planned for that rate. Warm-up 200 s (longer than the longest service
time, ~145 s), window 500 s (~25,000 requests). The analytical value is evaluated at the
run's realised per-pool arrival rate, so the comparison tests the model (E[S] per pool, the
split, the step count) rather than the Poisson noise of one finite run.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import pytest

from policies.planner import EXACT, plan
from policies.planner.fleet import PoolReport
from simulator.run import run
from simulator.scenario import parse

RATE, WARMUP, END = 50.0, 200.0, 700.0


def _engine(pool: PoolReport) -> dict[str, Any]:
    return {"max_num_seqs": pool.n_slots, "num_kv_blocks": 65536, "enable_prefix_caching": False,
            "w": 0.008 + 0.00065 * pool.n_slots, "h": 0.0}  # fmt: skip


@pytest.mark.slow
# Azure only: LMSYS's and agent-heavy's long pools are heavy-tailed (services up to ~240 s),
# which a seconds-long run cannot sample; bench/planner_sim.py runs all three at scale.
@pytest.mark.parametrize(("workload", "b_short"), [("azure_2023", 4096)])
def test_des_utilisation_matches_analysis(cdfs: dict, workload: str, b_short: int) -> None:
    p = plan(cdfs[workload], RATE, 0.5, 1.0, b_short, options=replace(EXACT, h_scaling="none"))
    pr = p.pool_routing
    assert pr.short is not None and pr.long is not None
    doc = {
        "name": "table5", "seed": 7,
        "fleet": {"pools": [
            {"name": "short", "workers": pr.short.n, "max_model_len": b_short,
             "engine": _engine(pr.short)},
            {"name": "long", "workers": pr.long.n, "max_model_len": 65536,
             "engine": _engine(pr.long)}]},
        "policy": {"placement": {"short_pool": "short", "b_short": b_short},
                   "routing": {"policy": "least_loaded"}},
        "workload": {"requests": int(RATE * END), "arrivals": {"kind": "poisson", "rate": RATE},
                     "components": [{"family": "cdf", "cdf": workload, "input_fraction": 0.8}]},
        "report": {"sample_interval": 1.0, "plots": False},
    }  # fmt: skip
    res = run(parse(doc))
    for name, pool in (("short", pr.short), ("long", pr.long)):
        series = res.series.pools[name].utilisation
        measured = statistics.mean(
            u for t, u in zip(res.series.t, series, strict=True) if WARMUP < t <= END
        )
        arrivals = sum(1 for r in res.records if r.pool == name and WARMUP < r.arrival <= END)
        realised = arrivals / (END - WARMUP)
        analytical = pool.rho * realised / pool.rate
        assert measured == pytest.approx(analytical, rel=0.03), (name, measured, analytical)
        assert realised == pytest.approx(pool.rate, rel=0.05)  # the split α' holds too
