"""BF-IO's ablations on the lockstep DP group simulator (docs/BFIO.md, "Ablations").

    nice -n 10 python bench/bfio_ablations.py --out out/bfio-ablations
    nice -n 10 python bench/bfio_ablations.py --seeds 1 --steps 300 --warmup 300   # a look

The paper's setting (G = 32, B = 72, R = 128, the synthetic BurstGPT-like lengths of
simulator/dp_lengths.py), every run on the same lengths per seed (the table's seeds 0..):
- the central pool against instant dispatch (the paper's §7.3 interface, which it leaves
  untreated): each request bound to a rank the moment it is revealed, waiting in that
  rank's FIFO queue, by count (fewest running + queued) or by tokens (least running load +
  queued prompts); `least_token_load` over the central pool is NOT instant dispatch: it
  binds the oldest pooled request to the lightest rank only when a slot is free;
- JSQ (count) and `least_token_load` over the central pool, so that these runs give the
  energy (eq. 58, simulator/dp_group.py's EnergyModel) of the docs' main table's FCFS, JSQ,
  least-token-load and BF-IO (H = 0, H = 20 oracle) rows too;
- BF-IO (H = 20) with the oracle, the noisy oracle at ε = 0.1, and the `max_tokens_bound`
  predictor with clients whose max_tokens is the true length × (1 + slack·u), u ~ U(0, 1)
  (BurstGPT records no max_tokens: an assumption, at slack 0.25 and 1).
H = 20 runs warm up under BF-IO (H = 0), as in bench/bfio_experiments.py. At most 2 worker
processes at nice 10. Writes rows.json and tables.md to --out. Nothing asserts here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from policies.assign import make_assigner
from simulator.dp_group import GroupConfig, run_group

H20 = {"lookahead_steps": 20}
# name: (assigner, params, instant dispatch, clients' max_tokens slack)
RUNS: dict[str, tuple[str, dict[str, Any], str | None, float | None]] = {
    "FCFS (central pool)": ("fcfs_maxfree", {}, None, None),
    "JSQ (central pool)": ("jsq_count", {}, None, None),
    "least token load (central pool)": ("least_token_load", {}, None, None),
    "instant dispatch, count": ("fcfs_maxfree", {}, "count", None),
    "instant dispatch, tokens": ("fcfs_maxfree", {}, "tokens", None),
    "BF-IO H=0": ("bfio", {}, None, None),
    "BF-IO H=20 oracle": ("bfio", {**H20, "predictor": "oracle"}, None, None),
    "BF-IO H=20 noisy 0.1": (
        "bfio",
        {**H20, "predictor": "noisy_oracle", "noise_eps": 0.1},
        None,
        None,
    ),
    "BF-IO H=20 max_tokens, slack 0.25": (
        "bfio",
        {**H20, "predictor": "max_tokens_bound"},
        None,
        0.25,
    ),
    "BF-IO H=20 max_tokens, slack 1": (
        "bfio",
        {**H20, "predictor": "max_tokens_bound"},
        None,
        1.0,
    ),
}


def one(job: dict[str, Any]) -> dict[str, Any]:
    name, params, dispatch, slack = RUNS[job["run"]]
    config = GroupConfig(
        ranks=32,
        slots=72,
        pool_target=128,
        steps=job["steps"],
        warmup=job["warmup"],
        seed=job["seed"],
        instant_dispatch=dispatch,
        max_tokens_slack=slack,
    )
    c0 = time.process_time()
    warm = make_assigner("bfio") if params.get("lookahead_steps") else None
    result = run_group(make_assigner(name, params), config, warmup_with=warm)
    return {**job, **result.row(), "cpu_s": time.process_time() - c0}


def table(rows: list[dict[str, Any]]) -> str:
    def mean(rs: list[dict[str, Any]], key: str) -> float:
        return statistics.fmean(r[key] for r in rs)

    base = [r for r in rows if r["run"] == "FCFS (central pool)"]
    lines = [
        "| Run | AvgImb (tokens) | FCFS ÷ run | barrier idle | Thpt vs FCFS | TPOT vs FCFS |"
        " energy (kJ) | vs FCFS | J / token | pool wait P50 / P99 (s) | seeds × steps |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in RUNS:
        rs = [r for r in rows if r["run"] == run]
        if not rs:
            continue
        imb, thr, tpot = mean(rs, "avg_imbalance"), mean(rs, "throughput"), mean(rs, "tpot")
        lines.append(
            f"| {run} | {imb:,.0f} | {mean(base, 'avg_imbalance') / imb:.1f}× | "
            f"{100 * mean(rs, 'idle_fraction'):.1f} % | "
            f"{100 * (thr / mean(base, 'throughput') - 1):+.1f} % | "
            f"{100 * (tpot / mean(base, 'tpot') - 1):+.1f} % | "
            f"{mean(rs, 'energy') / 1e3:,.0f} | "
            f"{100 * (mean(rs, 'energy') / mean(base, 'energy') - 1):+.1f} % | "
            f"{mean(rs, 'energy_per_token'):.3f} | "
            f"{mean(rs, 'pool_wait_p50'):.2f} / {mean(rs, 'pool_wait_p99'):.2f} | "
            f"{len(rs)} × {rs[0]['steps']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/bfio-ablations")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=1500)
    ap.add_argument("--runs", default=";".join(RUNS), help="names separated by ;")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [
        {"run": run, "seed": seed, "steps": args.steps, "warmup": args.warmup}
        for seed in range(args.seeds)
        for run in args.runs.split(";")
    ]
    jobs.sort(key=lambda j: "H=20" not in j["run"])  # the costly ones first
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(min(2, args.workers), initializer=os.nice, initargs=(10,)) as pool:
        for row in pool.map(one, jobs):
            rows.append(row)
            (out / "rows.json").write_text(json.dumps(rows, indent=1))  # a kill keeps the rest
            print(
                f"{row['run']} seed={row['seed']}: imb {row['avg_imbalance']:,.0f} "
                f"thpt {row['throughput']:,.0f} ({row['cpu_s']:.0f} s CPU)",
                flush=True,
            )
    text = (
        f"# BF-IO ablations (G = 32, B = 72, R = 128; warm-up {args.warmup} steps; wall "
        f"{time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f})\n\n"
        f"{table(rows)}\n"
    )
    (out / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
