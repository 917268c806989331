"""How fast the FleetOpt planner re-plans (§6: "the sweep completes in under 1 ms").

    python bench/planner_speed.py [--data-dir DIR] [--reps 300]

For each paper workload and both moment methods, prints:
- calibration: per-pool service moments for every (B, γ) cell (λ-, SLO- and p_c-free);
- sweep: Algorithm 1 over the calibrated grid (α', λ_s, λ_l, Erlang-C/ρ_max sizing of both
  pools in every cell, the homogeneous pool, the argmin) — median and p90 of `reps` runs;
- end to end: calibration + sweep + the Table 3 rows (`plan()`);
for B fixed at the paper's boundary (11 cells) and for the full feasible set (~170 cells).
Also the exact log-space Erlang-C at c = 50,000 and the O(1) bound that usually replaces it.
Wall-clock on a shared machine: read the medians, not single runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetgate.plan import load_workload
from policies.planner import EXACT, PAPER, calibrate, plan, sweep
from policies.planner import paper as ref
from policies.planner.erlang import log_erlang_c, log_erlang_c_bound


def _times(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    print(f"{'workload':<13} {'moments':<11} {'B set':<6} {'cells':>5} {'calibrate ms':>13} "
          f"{'sweep µs med':>13} {'sweep µs p90':>13} {'plan() ms':>10}")  # fmt: skip
    for case in ref.TABLE3:
        cdf = load_workload(case.workload, args.data_dir)[0]
        for opts in (PAPER, EXACT):
            for label, cands in (("paper", (case.b_short,)), ("all", None)):
                pc = case.p_c
                b = case.b_short if cands else None

                def _cal(w=cdf, c=cands, o=opts):  # type: ignore[no-untyped-def]
                    return calibrate(w, c, options=o)

                def _plan(w=cdf, b=b, o=opts, pc=pc):  # type: ignore[no-untyped-def]
                    return plan(w, ref.RATE, ref.SLO_S, pc, b, options=o)

                cal_med, _ = _times(_cal, 3)
                cal = calibrate(cdf, cands, options=opts)
                sweep(cal, ref.RATE, ref.SLO_S, pc)  # warm
                med, p90 = _times(lambda c=cal, pc=pc: sweep(c, ref.RATE, ref.SLO_S, pc), args.reps)
                e2e, _ = _times(_plan, 3)
                cells = cal.f_g.size
                print(f"{case.workload:<13} {opts.moments:<11} {label:<6} {cells:>5} "
                      f"{1e3 * cal_med:>13.1f} {1e6 * med:>13.0f} {1e6 * p90:>13.0f} "
                      f"{1e3 * e2e:>10.1f}")  # fmt: skip
    print()
    c = 50_000
    for rho in (0.85, 0.99):
        a = rho * c
        exact, _ = _times(lambda a=a: log_erlang_c(c, a), 20)
        bound, _ = _times(lambda a=a: log_erlang_c_bound(c, a), 1000)
        print(f"Erlang-C at c = {c:,}, ρ = {rho}: ln C = {log_erlang_c(c, a):.1f} "
              f"(bound {log_erlang_c_bound(c, a):.1f}); exact {1e6 * exact:.0f} µs, "
              f"O(1) bound {1e6 * bound:.2f} µs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
