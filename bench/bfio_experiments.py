"""The BF-IO paper's experiment (its §6 and Table 1) on the lockstep DP group simulator.

    nice -n 10 python bench/bfio_experiments.py --out out/bfio              # the protocol
    nice -n 10 python bench/bfio_experiments.py --quick --out out/bfio-q    # a small version

Protocol ("A Universal Load Balancing Principle and Its Application to LLM Serving"):
1. Table: G = 32 ranks, B = 72 slots, pool target R = 128, BurstGPT-like lengths
   (simulator/dp_lengths.py: the CSV when given with --burstgpt, else the documented
   synthetic fallback), 5 seeds, every policy on the same lengths per seed: FCFS (the
   paper's Algorithm 2), JSQ (count), least token load, BF-IO (H = 0), BF-IO (H = 20,
   oracle predictor), the same with the max-pool-wait guard rail at 2 s, BF-IO (H = 20,
   noisy oracle ε = 0.3). Average imbalance (tokens),
   barrier-idle fraction, throughput, TPOT, pool wait P50/P99.
2. Sweep over B ∈ {16, 32, 64, 128} and G ∈ {4, 8, 16, 32, 64}: FCFS vs BF-IO (H = 0),
   the imbalance-reduction factor against √(B·ln G) (the paper's theory).
Runs go through a process pool of at most 2 workers, each at nice 10. Writes rows.json and
tables.md to --out. Step model and its constants: simulator/dp_group.py (`StepModel`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.assign import make_assigner
from simulator.dp_group import GroupConfig, run_group
from simulator.dp_lengths import load_burstgpt_csv, synthetic_burstgpt

POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "FCFS": ("fcfs_maxfree", {}),
    "JSQ": ("jsq_count", {}),
    "LeastTokenLoad": ("least_token_load", {}),
    "BF-IO H=0": ("bfio", {}),
    "BF-IO H=20 oracle": ("bfio", {"lookahead_steps": 20, "predictor": "oracle"}),
    "BF-IO H=20 oracle wait<=2s": (
        "bfio",
        {"lookahead_steps": 20, "predictor": "oracle", "max_pool_wait_s": 2.0},
    ),
    "BF-IO H=20 noisy 0.3": (
        "bfio",
        {"lookahead_steps": 20, "predictor": "noisy_oracle", "noise_eps": 0.3},
    ),
}


def _nice() -> None:
    os.nice(10)


def one(job: dict[str, Any]) -> dict[str, Any]:
    name, params = POLICIES[job["policy"]]
    lengths = load_burstgpt_csv(job["burstgpt"]) if job.get("burstgpt") else synthetic_burstgpt()
    config = GroupConfig(
        ranks=job["G"],
        slots=job["B"],
        pool_target=job["R"],
        steps=job["steps"],
        warmup=job["warmup"],
        seed=job["seed"],
    )
    t0, c0 = time.perf_counter(), time.process_time()
    # a lookahead run warms up under BF-IO (H = 0): the warm-up only reaches steady state
    warm = make_assigner("bfio") if params.get("lookahead_steps") else None
    result = run_group(make_assigner(name, params), config, lengths, warmup_with=warm)
    return {
        **job,
        **result.row(),
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
    }


def mean(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def table(rows: list[dict[str, Any]]) -> str:
    base = [r for r in rows if r["policy"] == "FCFS"]
    lines = [
        "| Policy | AvgImb (tokens) | FCFS ÷ policy | idle % | Thpt (tok/s) | vs FCFS | TPOT (ms) | vs FCFS | pool wait P50 / P99 (s) | energy (kJ) | vs FCFS | J / token | seeds × steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for policy in POLICIES:
        rs = [r for r in rows if r["policy"] == policy]
        if not rs:
            continue
        imb, thr, tpot = mean(rs, "avg_imbalance"), mean(rs, "throughput"), mean(rs, "tpot")
        lines.append(
            f"| {policy} | {imb:,.0f} | {mean(base, 'avg_imbalance') / imb:.1f}× | "
            f"{100 * mean(rs, 'idle_fraction'):.1f} | {thr:,.0f} | "
            f"{100 * (thr / mean(base, 'throughput') - 1):+.1f} % | {1e3 * tpot:.2f} | "
            f"{100 * (tpot / mean(base, 'tpot') - 1):+.1f} % | "
            f"{mean(rs, 'pool_wait_p50'):.2f} / {mean(rs, 'pool_wait_p99'):.2f} | "
            f"{mean(rs, 'energy') / 1e3:,.0f} | "
            f"{100 * (mean(rs, 'energy') / mean(base, 'energy') - 1):+.1f} % | "
            f"{mean(rs, 'energy_per_token'):.3f} | "
            f"{len(rs)} × {rs[0]['steps']} |"
        )
    return "\n".join(lines)


def sweep_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| G | B | √(B ln G) | AvgImb FCFS | AvgImb BF-IO H=0 | FCFS ÷ BF-IO | mean gap BF-IO (tokens) | Thpt gain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["G"], r["B"]) for r in rows})
    for g, b in keys:
        f = [r for r in rows if (r["G"], r["B"]) == (g, b) and r["policy"] == "FCFS"]
        o = [r for r in rows if (r["G"], r["B"]) == (g, b) and r["policy"] == "BF-IO H=0"]
        if not f or not o:
            continue
        lines.append(
            f"| {g} | {b} | {math.sqrt(b * math.log(g)):.1f} | {mean(f, 'avg_imbalance'):,.0f} | "
            f"{mean(o, 'avg_imbalance'):,.0f} | "
            f"{mean(f, 'avg_imbalance') / mean(o, 'avg_imbalance'):.1f}× | "
            f"{mean(o, 'avg_gap'):,.0f} | "
            f"{100 * (mean(o, 'throughput') / mean(f, 'throughput') - 1):+.1f} % |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/bfio")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--steps-lookahead", type=int, default=None, help="steps for H = 20 runs")
    ap.add_argument("--warmup", type=int, default=1500)
    ap.add_argument("--sweep-steps", type=int, default=1500)
    ap.add_argument("--sweep-seeds", type=int, default=1)
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-table", action="store_true")
    ap.add_argument("--policies", default="FCFS,JSQ,LeastTokenLoad,BF-IO H=0,BF-IO H=20 oracle")
    ap.add_argument("--burstgpt", default=None, help="a BurstGPT CSV (else the synthetic fallback)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.steps, args.warmup, args.sweep_steps = 2, 400, 600, 300
    workers = min(2, args.workers)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    jobs = []
    if not args.no_table:
        for seed in range(args.seeds):
            for policy in args.policies.split(","):
                lookahead = POLICIES[policy][1].get("lookahead_steps", 0) > 0
                steps = args.steps_lookahead if lookahead and args.steps_lookahead else args.steps
                jobs.append(
                    {
                        "part": "table",
                        "policy": policy,
                        "G": 32,
                        "B": 72,
                        "R": 128,
                        "seed": seed,
                        "steps": steps,
                        "warmup": args.warmup,
                        "burstgpt": args.burstgpt,
                    }
                )
    if not args.no_sweep:
        jobs.extend(
            {
                "part": "sweep",
                "policy": policy,
                "G": g,
                "B": b,
                "R": max(128, 4 * g),
                "seed": 100 + seed,
                "steps": args.sweep_steps,
                "warmup": args.warmup,
                "burstgpt": args.burstgpt,
            }
            for g in (4, 8, 16, 32, 64)
            for b in (16, 32, 64, 128)
            for seed in range(args.sweep_seeds)
            for policy in ("FCFS", "BF-IO H=0")
        )
    # slowest first, so the two workers finish together
    jobs.sort(key=lambda j: -(j["G"] * j["B"] * j["steps"] * (8 if "H=20" in j["policy"] else 1)))
    t0 = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(workers, initializer=_nice) as pool:
        for row in pool.map(one, jobs):
            rows.append(row)
            (out / "rows.json").write_text(json.dumps(rows, indent=1))  # a kill keeps the rest
            print(
                f"{row['part']} {row['policy']} G={row['G']} B={row['B']} seed={row['seed']}: "
                f"imb {row['avg_imbalance']:,.0f} thpt {row['throughput']:,.0f} "
                f"({row['wall_s']:.0f} s)",
                flush=True,
            )
    wall = time.perf_counter() - t0
    (out / "rows.json").write_text(json.dumps(rows, indent=1))
    load = os.getloadavg()
    text = [
        "# BF-IO reproduction (simulator/dp_group.py)",
        "",
        f"Lengths: {'BurstGPT CSV ' + args.burstgpt if args.burstgpt else 'synthetic BurstGPT-like fallback'}; "
        f"warm-up {args.warmup} steps; {workers} workers; wall {wall:.0f} s, "
        f"CPU {sum(r['cpu_s'] for r in rows):.0f} s; load average at the end {load[0]:.1f}.",
        "",
        "## Table (G = 32, B = 72, R = 128)",
        "",
        table([r for r in rows if r["part"] == "table"]),
        "",
        "## Sweep over B and G (FCFS vs BF-IO H = 0)",
        "",
        sweep_table([r for r in rows if r["part"] == "sweep"]),
        "",
    ]
    (out / "tables.md").write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
