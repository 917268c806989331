"""How fast the simulator runs: wall time and events/s for a 30,000-request scenario over
100 workers (the shipped `scale-100` scenario: Azure 2023 CDF, Poisson at 300 req/s,
least-loaded routing, fresh telemetry), plus any other sizes asked for.

    python bench/simulator_scale.py                      # 30k requests × 100 workers
    python bench/simulator_scale.py --workers 10 100 --requests 30000 --routing power_of_two

An event is one kernel callback: a worker step, an arrival, a metric sample. Not a
pass/fail test (timings depend on the machine); it prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import report
from simulator.run import build_workload, run
from simulator.scenario import load


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--scenario", default="scale-100")
    p.add_argument("--workers", type=int, nargs="*", default=[100])
    p.add_argument("--requests", type=int, default=30000)
    p.add_argument("--routing", default=None, help="override the scenario's router")
    p.add_argument(
        "--scale-rate", action="store_true", help="scale the arrival rate with the worker count"
    )
    args = p.parse_args()
    base = load(args.scenario)
    header = f"{'requests':>9} {'workers':>8} {'routing':>14} {'events':>10} {'steps':>10} {'virtual s':>10} {'wall s':>8} {'events/s':>10} {'req/s (wall)':>13} {'util':>6}"
    print(header)
    print("-" * len(header))
    for workers in args.workers:
        pool = base.fleet.pools[0].model_copy(update={"workers": workers})
        fleet = base.fleet.model_copy(update={"pools": [pool]})
        sc = base.model_copy(update={"fleet": fleet})
        if args.routing:
            routing = sc.policy.routing.model_copy(update={"policy": args.routing})
            sc = sc.model_copy(update={"policy": sc.policy.model_copy(update={"routing": routing})})
        if args.scale_rate and sc.workload.arrivals is not None:
            arrivals = sc.workload.arrivals.model_copy(
                update={"rate": sc.workload.arrivals.rate * workers / 100}
            )
            sc = sc.model_copy(
                update={"workload": sc.workload.model_copy(update={"arrivals": arrivals})}
            )
        specs = build_workload(sc, requests=args.requests)  # not timed: the workload is input
        t0 = time.perf_counter()
        res = run(sc, specs=specs)
        wall = time.perf_counter() - t0
        rep = report.build(res, include_series=False)
        steps = sum(p.steps for p in res.pools.values())
        util = rep["pools"][pool.name]["utilisation"]
        print(
            f"{len(specs):>9} {workers:>8} {sc.policy.routing.policy:>14} {res.events:>10,} {steps:>10,}"
            f" {rep['virtual_seconds']:>10.1f} {wall:>8.2f} {res.events / wall:>10,.0f} {len(specs) / wall:>13,.0f} {util:>6.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
