"""Decision cost of BF-IO's live solver (greedy_swap): p50 / p99 per decision.

    nice -n 10 python bench/bfio_decision.py [--decisions 200] [--lookahead 20]

The instances are real decisions, not made-up ones: the lockstep DP group simulator
(simulator/dp_group.py) runs at the paper's setting (G = 32, B = 72, pool R = 128,
BurstGPT-like lengths) under BF-IO (H = 0) past its warm-up, and every step's state is
captured with the oracle lookahead's loads over H + 1 steps; each captured decision is then
timed alone with `greedy_swap` (a few repeats, the best kept, so scheduler noise on a
shared machine inflates less), in wall time and in the process's CPU time (which leaves out
the waits for a core that other processes cause: close to an idle core's wall time). U (the
free slots filled) is reported beside the times, as the cost grows with it. A benchmark, not a test: the figures depend on the machine and its
load, which the report prints.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.assign import Assigner, Instance, Predictor, make_assigner
from policies.assign.greedy_swap import greedy_swap
from simulator.dp_group import GroupConfig, run_group


def capture(decisions: int, lookahead: int, seed: int) -> list[Instance]:
    h0 = make_assigner("bfio")
    seen: list[Instance] = []

    def decide(inst: Instance) -> list[tuple[int, int]]:
        seen.append(inst)
        return h0.decide(
            Instance(inst.base[:, :1].copy(), inst.free, inst.count, inst.sizes, inst.waited)
        )

    recorder = Assigner("capture", decide, lookahead, Predictor("oracle"))
    config = GroupConfig(
        ranks=32, slots=72, pool_target=128, steps=decisions, warmup=1200, seed=seed
    )
    run_group(recorder, config)
    return [i for i in seen[-decisions:] if i.fillable > 0]


def timed(inst: Instance, repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        greedy_swap(inst)
        best = min(best, clock() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decisions", type=int, default=200)
    ap.add_argument("--lookahead", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    instances = capture(args.decisions, args.lookahead, args.seed)
    load_before = os.getloadavg()[0]
    rows = []
    for h in sorted({0, args.lookahead}):
        cut = [
            Instance(i.base[:, : h + 1].copy(), i.free, i.count, i.sizes, i.waited)
            for i in instances
        ]
        times = np.array([timed(i, args.repeats) for i in cut]) * 1e3
        # CPU time: what the decision costs this process, without the waits for a core
        # that other processes cause on a shared host (≈ an idle core's wall time)
        cpu = np.array([timed(i, args.repeats, time.process_time) for i in cut]) * 1e3
        rows.append((h, times, cpu))
    us = [i.fillable for i in instances]
    print(
        f"greedy_swap decision cost, G = 32, B = 72, pool = {len(instances[0].sizes)}, "
        f"{len(instances)} captured decisions; U (slots filled) median {statistics.median(us):.0f}, "
        f"max {max(us)}; best of {args.repeats}; load average {load_before:.1f} → "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    for h, t, cpu in rows:
        for what, x in (("wall", t), ("CPU", cpu)):
            print(
                f"  lookahead {h:>2}, {what:>4}: p50 {np.percentile(x, 50):.2f} ms,"
                f" p99 {np.percentile(x, 99):.2f} ms, max {x.max():.2f} ms"
            )


if __name__ == "__main__":
    main()
