"""Compress-and-Route in the simulator beside the planner: the planner sizes the two-pool
fleet for Azure at (B_short 4096, γ 2.0); the simulator runs that fleet with the gateway's
own Intake (budget, C&R placement) and a compression model, and its per-pool busy-slot
fraction is printed next to the planner's ρ (full batch) and ρ_load (batch-accurate).

    python bench/sim_compress_and_route.py [--rate 200] [--warmup 150] [--window 150]

Method as bench/planner_sim.py (Table 5): planner with the engine's own iteration law
(`h_scaling=none`, exact moments); the simulator's default batch-accurate engine, so the
comparison is with ρ_load; least-loaded routing, Poisson arrivals, the Azure CDF with an
80/20 input/output split. The planner assumes every band request compresses (p_c = 1);
the compression model here makes nearly every one shortenable enough (mean 0.8 of a
prompt's tokens), and the run prints the p_c it observed. `--gamma 1` runs plain pool
routing the same way, as the control.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetgate.plan import load_workload
from policies.planner import EXACT
from policies.planner.fleet import FleetRow, cell_row
from policies.planner.sweep import calibrate, sweep
from simulator.run import run
from simulator.scenario import parse

ENGINE_OPTIONS = replace(EXACT, h_scaling="none")
B_SHORT, GAMMA = 4096, 2.0
SHORTENABLE = 0.8  # the planner assumes p_c = 1: (nearly) every band request compresses


def planned(rate: float, slo_s: float) -> FleetRow:
    cdf = load_workload("azure")[0]
    cal = calibrate(cdf, (B_SHORT,), (1.0, GAMMA), None, ENGINE_OPTIONS)
    sw = sweep(cal, rate, slo_s, 1.0)
    i, j = sw.index(B_SHORT, GAMMA)
    return cell_row(sw, i, j, "compress_and_route")


def scenario(row: FleetRow, rate: float, requests: int) -> dict[str, Any]:
    assert row.short is not None and row.long is not None

    def engine(n_slots: int) -> dict[str, Any]:
        return {"max_num_seqs": n_slots, "num_kv_blocks": 65536, "enable_prefix_caching": False}

    return {
        "name": "azure-compress-and-route",
        "seed": 7,
        "fleet": {
            "pools": [
                {
                    "name": "short",
                    "workers": row.short.n,
                    "max_model_len": B_SHORT,
                    "engine": engine(row.short.n_slots),
                },
                {
                    "name": "long",
                    "workers": row.long.n,
                    "max_model_len": 65536,
                    "engine": engine(row.long.n_slots),
                },
            ]
        },
        "policy": {
            "placement": {
                "policy": "compress_and_route",
                "short_pool": "short",
                "b_short": B_SHORT,
                "gamma": GAMMA,
            },
            "routing": {"policy": "least_loaded"},
            "compression": {"shortenable": {"chat": {"mean": SHORTENABLE, "sd": 0.02}}},
        },
        "workload": {
            "requests": requests,
            "arrivals": {"kind": "poisson", "rate": rate},
            "components": [{"family": "cdf", "cdf": "azure_2023", "input_fraction": 0.8}],
        },
        "report": {"sample_interval": 1.0, "plots": False},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--slo-ms", type=float, default=500.0)
    ap.add_argument("--warmup", type=float, default=150.0)
    ap.add_argument("--window", type=float, default=150.0)
    ap.add_argument("--gamma", type=float, default=GAMMA)
    args = ap.parse_args()
    globals()["GAMMA"] = args.gamma
    row = planned(args.rate, args.slo_ms / 1000)
    end = args.warmup + args.window
    t0 = time.perf_counter()
    res = run(parse(scenario(row, args.rate, int(args.rate * end))))
    cpu = time.perf_counter() - t0
    recs = [r for r in res.records if args.warmup < r.arrival <= end]
    band = [r for r in recs if B_SHORT < r.prompt_tokens + r.output_tokens <= GAMMA * B_SHORT]
    compressed = sum(1 for r in band if r.compressed_to is not None)
    print(f"Azure, λ {args.rate:g}/s, B_short {B_SHORT}, γ {GAMMA}: planner n_s {row.short.n}, "
          f"n_l {row.long.n}; simulated {len(res.records)} requests in {cpu:.0f} s")  # fmt: skip
    print(f"band requests {len(band)} ({len(band) / max(len(recs), 1):.1%} of the window), "
          f"compressed onto the short pool: {compressed} (p_c {compressed / max(len(band), 1):.2f})")  # fmt: skip
    print(
        "| pool | n | slots | planner ρ | planner ρ_load | simulated busy slots | error vs ρ_load |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, pool in (("short", row.short), ("long", row.long)):
        series = res.series.pools[name]
        util = statistics.mean(
            u for t, u in zip(res.series.t, series.utilisation, strict=True)
            if args.warmup < t <= end
        )  # fmt: skip
        err = util / pool.rho_load - 1 if pool.rho_load else float("nan")
        print(f"| {name} | {pool.n} | {pool.n_slots} | {pool.rho:.3f} | {pool.rho_load:.3f} "
              f"| {util:.3f} | {err:+.1%} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
