"""The live harness's setting (bench/bfio_live.py) in the lockstep DP simulator: does a
lookahead help when the answers are short?

    nice -n 10 python bench/bfio_live_sim.py [--seeds 3] [--steps 4000]

G = 4 ranks of B = 8 slots, a pool of 16 (the live backlog of G·B + 16 clients), the live
step constants (K = 2.5 µs a context token), prompts clipped to 4,096 and outputs scaled
by 0.25 as the live load draws them (mean ≈ 70 tokens) — and, beside it, the same group
with unscaled outputs (mean 280, the simulation's). FCFS, BF-IO H = 0, and H = 5 and 20
with the oracle. A lookahead's objective does not refill the slots that free inside its
window, so a window that is a large share of an answer's life optimises a future that will
not happen. Prints one line per run (means over the seeds; per-seed imbalances).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.assign import make_assigner
from simulator.dp_group import GroupConfig, GroupResult, StepModel, run_group
from simulator.dp_lengths import Lengths, synthetic_burstgpt

RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "FCFS": ("fcfs_maxfree", {}),
    "BF-IO H=0": ("bfio", {}),
    "BF-IO H=5 oracle": ("bfio", {"lookahead_steps": 5, "predictor": "oracle"}),
    "BF-IO H=20 oracle": ("bfio", {"lookahead_steps": 20, "predictor": "oracle"}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--warmup", type=int, default=1000)
    args = ap.parse_args()
    prompts, outputs = synthetic_burstgpt().draw(np.random.default_rng(123), 200_000)
    live = Lengths(
        np.minimum(prompts, 4096), np.maximum(2, np.round(outputs * 0.25)).astype(np.int64)
    )
    for label, lengths in (("outputs x0.25 (live)", live), ("outputs x1", None)):
        results: dict[str, list[GroupResult]] = {}
        for name, (policy, params) in RUNS.items():
            warm = make_assigner("bfio") if params.get("lookahead_steps") else None
            results[name] = [
                run_group(
                    make_assigner(policy, params),
                    GroupConfig(
                        ranks=4,
                        slots=8,
                        pool_target=16,
                        steps=args.steps,
                        warmup=args.warmup,
                        seed=seed,
                        step_model=StepModel(k=2.5e-6),
                    ),
                    lengths,
                    warmup_with=warm,
                )
                for seed in range(args.seeds)
            ]
            rs, base = results[name], results["FCFS"]
            imb = statistics.fmean(r.avg_imbalance for r in rs)
            gain = statistics.fmean(r.throughput for r in rs) / statistics.fmean(
                r.throughput for r in base
            )
            print(
                f"{label:22s} {name:18s} imbalance {imb:8,.0f}  FCFS ÷ "
                f"{statistics.fmean(r.avg_imbalance for r in base) / imb:5.2f}  throughput "
                f"{100 * (gain - 1):+5.1f} %  per seed {[round(r.avg_imbalance) for r in rs]}",
                flush=True,
            )


if __name__ == "__main__":
    main()
