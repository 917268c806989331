"""Compress-and-Route in the simulator beside the planner: the planner sizes the two-pool
fleet for Azure at (B_short 4096, γ 2.0); the simulator runs that fleet with the gateway's
own Intake (budget, C&R placement) and a compression model, and its per-pool busy-slot
fraction is printed next to the planner's ρ (full batch) and ρ_load (batch-accurate).

    python bench/sim_compress_and_route.py [--rate 200] [--warmup 150] [--window 150]
                                           [--gamma 2] [--compressed-mass band|restricted]

Method as bench/planner_sim.py (Table 5): planner with the engine's own iteration law
(`h_scaling=none`, exact moments); the simulator's default batch-accurate engine, so the
comparison is with ρ_load; least-loaded routing, Poisson arrivals, the Azure CDF with an
80/20 input/output split. The planner assumes every band request compresses (p_c = 1);
the compression model here makes nearly every one shortenable enough (mean 0.8 of a
prompt's tokens), and the run prints the p_c it observed. `--gamma 1` runs plain pool
routing the same way, as the control. `--compressed-mass` is the planner's pricing of
compressed requests in the short pool: "band" (default) as C&R serves them — prompt cut to
T_c = B − L_out, original output — or "restricted", Algorithm 1 step 5's F over [1, B]
(the paper's; it sizes a short pool that is unstable here: its band requests decode
answers about 5× a short request's).
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
from policies.planner.options import CHOICES
from policies.planner.sweep import calibrate, sweep
from simulator.run import run
from simulator.scenario import parse

ENGINE_OPTIONS = replace(EXACT, h_scaling="none")
B_SHORT, GAMMA = 4096, 2.0
SHORTENABLE = 0.8  # the planner assumes p_c = 1: (nearly) every band request compresses


def planned(rate: float, slo_s: float, compressed_mass: str = "band") -> FleetRow:
    cdf = load_workload("azure")[0]
    opts = replace(ENGINE_OPTIONS, compressed_mass=compressed_mass)  # type: ignore[arg-type]
    cal = calibrate(cdf, (B_SHORT,), (1.0, GAMMA), None, opts)
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
    ap.add_argument("--compressed-mass", choices=CHOICES["compressed_mass"], default="band")
    args = ap.parse_args()
    globals()["GAMMA"] = args.gamma
    row = planned(args.rate, args.slo_ms / 1000, args.compressed_mass)
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
    print(f"planner ({args.compressed_mass}): short pool E[S] {row.short.n_slots / row.short.mu_gpu:.1f} s, "
          f"cv² {row.short.cv2:.3f}, μ_gpu {row.short.mu_gpu:.2f}/s")  # fmt: skip
    print("| pool | n | slots | planner ρ | planner ρ_load | simulated busy slots "
          "| 1st / 2nd half of window | error vs ρ_load |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    mid = args.warmup + args.window / 2
    for name, pool in (("short", row.short), ("long", row.long)):
        samples = list(zip(res.series.t, res.series.pools[name].utilisation, strict=True))
        util = statistics.mean(u for t, u in samples if args.warmup < t <= end)
        first = statistics.mean(u for t, u in samples if args.warmup < t <= mid)
        second = statistics.mean(u for t, u in samples if mid < t <= end)
        err = util / pool.rho_load - 1 if pool.rho_load else float("nan")
        print(f"| {name} | {pool.n} | {pool.n_slots} | {pool.rho:.3f} | {pool.rho_load:.3f} "
              f"| {util:.3f} | {first:.3f} / {second:.3f} | {err:+.1%} |")  # fmt: skip
    done = [r for r in recs if r.finish is not None]
    for label, group in (
        (
            "short (uncompressed)",
            [r for r in done if r.pool == "short" and r.compressed_to is None],
        ),
        ("compressed", [r for r in done if r.compressed_to is not None]),
        ("long", [r for r in done if r.pool == "long"]),
    ):
        if group:
            lat = statistics.mean(r.finish - r.arrival for r in group if r.finish is not None)
            out = statistics.mean(r.output_tokens for r in group)
            print(f"{label}: {len(group)} done, mean latency {lat:.1f} s, mean output {out:.0f}")
    unfinished = sum(1 for r in recs if r.finish is None)
    print(f"requests of the window not finished at the end: {unfinished}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
