"""Decision cost of BF-IO's live solver (greedy_swap): p50 / p99 per decision.

    nice -n 10 python bench/bfio_decision.py [--decisions 200] [--lookahead 20] [--paths compiled,numpy]

The instances are real decisions, not made-up ones: the lockstep DP group simulator
(simulator/dp_group.py) runs at the paper's setting (G = 32, B = 72, pool R = 128,
BurstGPT-like lengths) under BF-IO (H = 0) past its warm-up, and every step's state is
captured with the oracle lookahead's loads over H + 1 steps; each captured decision is then
timed alone with `greedy_swap` (a few repeats, the best kept, so scheduler noise on a
shared machine inflates less), in wall time and in the process's CPU time (which leaves out
the waits for a core that other processes cause: close to an idle core's wall time). U (the
free slots filled) is reported beside the times, as the cost grows with it. A benchmark, not a test: the figures depend on the machine and its
load, which the report prints. `--paths` times the compiled path (policies/assign/_greedy.c)
and the numpy path interleaved instance by instance (so a change of load hits both alike)
and checks that they take the same decisions on every captured instance.
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
from policies.assign.greedy_swap import greedy_swap_compiled, greedy_swap_numpy
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


PATHS = {"compiled": greedy_swap_compiled, "numpy": greedy_swap_numpy}


def timed(
    solve: Callable[[Instance], object],
    inst: Instance,
    repeats: int,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        solve(inst)
        best = min(best, clock() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decisions", type=int, default=200)
    ap.add_argument("--lookahead", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--paths", default="compiled,numpy", help="of: compiled, numpy")
    args = ap.parse_args()
    paths = args.paths.split(",")
    instances = capture(args.decisions, args.lookahead, args.seed)
    load_before = os.getloadavg()[0]
    rows: list[tuple[int, str, np.ndarray, np.ndarray]] = []
    for h in sorted({0, args.lookahead}):
        cut = [
            Instance(i.base[:, : h + 1].copy(), i.free, i.count, i.sizes, i.waited)
            for i in instances
        ]
        if len(paths) > 1:
            differ = sum(len({str(PATHS[p](i)) for p in paths}) > 1 for i in cut)
            print(f"lookahead {h}: {differ} of {len(cut)} decisions differ between {paths}")
        wall: dict[str, list[float]] = {p: [] for p in paths}
        cpu: dict[str, list[float]] = {p: [] for p in paths}
        for i in cut:  # interleaved: every path times the same instance back to back
            for p in paths:
                wall[p].append(timed(PATHS[p], i, args.repeats) * 1e3)
                # CPU time: what the decision costs this process, without the waits for a
                # core that other processes cause on a shared host (≈ an idle core's wall)
                cpu[p].append(timed(PATHS[p], i, args.repeats, time.process_time) * 1e3)
        rows.extend((h, p, np.array(wall[p]), np.array(cpu[p])) for p in paths)
    us = [i.fillable for i in instances]
    print(
        f"greedy_swap decision cost, G = 32, B = 72, pool = {len(instances[0].sizes)}, "
        f"{len(instances)} captured decisions; U (slots filled) median {statistics.median(us):.0f}, "
        f"max {max(us)}; best of {args.repeats}; load average {load_before:.1f} → "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    for h, p, t, c in rows:
        for what, x in (("wall", t), ("CPU", c)):
            print(
                f"  lookahead {h:>2}, {p:>8}, {what:>4}: p50 {np.percentile(x, 50):.3f} ms,"
                f" p99 {np.percentile(x, 99):.3f} ms, max {x.max():.3f} ms"
            )


if __name__ == "__main__":
    main()
