"""`fleetgate simulate SCENARIO [--seed N] [--out DIR] [--requests N]`.

Runs a scenario (a YAML path, or the name of one in simulator/scenarios/), prints the
report table, and writes ``report.json`` and the PNG figures into ``--out``
(default ``out/sim/<scenario>``). Exit status 2 for a scenario that does not load.
At a terminal a progress bar shows the virtual time reached, the requests arrived and an
ETA (fleetgate/progress.py: off when stdout or stderr is not a terminal, or --no-progress).
"""

from __future__ import annotations

import argparse
import bisect
import sys
import time
from pathlib import Path
from typing import Any

from simulator import report as rep
from simulator import scenario as scn
from simulator.run import Probe, build_workload, run


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetgate simulate", description="run a simulation scenario")
    p.add_argument("scenario", nargs="?", help="a scenario YAML file, or a shipped scenario's name")
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument(
        "--out", type=Path, default=None, help="output directory (default out/sim/<name>)"
    )
    p.add_argument(
        "--requests", type=int, default=None, help="override the workload's request count"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    p.add_argument("--list", action="store_true", help="list the shipped scenarios and exit")
    p.add_argument(
        "--no-progress", action="store_true", help="no progress bar (off anyway off a terminal)"
    )
    return p


def _progress_probe(bar: Any, arrivals: list[float]) -> Probe:  # bar: a tqdm (untyped)
    """A sampling probe that moves `bar` to the virtual time reached (the bar's total is
    the last arrival; the drain after it is the bar's last step)."""
    total = len(arrivals)

    def probe(_core: object, now: float) -> None:
        bar.update(min(now, bar.total) - bar.n)
        bar.set_postfix_str(
            f"{bisect.bisect_right(arrivals, now):,}/{total:,} requests arrived", refresh=False
        )

    return probe


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        for path in sorted(scn.SCENARIO_DIR.glob("*.yaml")):
            print(f"{path.stem:<24} {scn.load(str(path)).description}")
        return 0
    if args.scenario is None:
        parser.print_usage(sys.stderr)
        return 2
    try:
        scenario = scn.load(args.scenario)
    except scn.ScenarioError as exc:
        print(f"fleetgate simulate: {exc}", file=sys.stderr)
        return 2
    if args.requests is not None and args.requests < 1:
        print("fleetgate simulate: --requests must be ≥ 1", file=sys.stderr)
        return 2
    out = args.out or Path("out") / "sim" / scenario.name
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    seed = scenario.seed if args.seed is None else args.seed
    specs = build_workload(scenario, seed, args.requests)  # what run() would build
    arrivals = sorted(s.arrival for s in specs)
    from simulator import progress

    on = progress.enabled() and not args.no_progress
    with progress.bar(
        round(arrivals[-1], 1) if arrivals else 0.0,
        f"simulate {scenario.name}",
        "s virtual",
        on=on,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:,.0f}/{total:,.0f} s virtual "
        "[{elapsed}<{remaining}]{postfix}",
    ) as bar:
        probe = _progress_probe(bar, arrivals) if on else None
        result = run(scenario, seed=seed, specs=specs, probe=probe)
    wall = time.perf_counter() - started
    report = rep.build(result)
    print(rep.table(report))
    rep.write_json(report, out / "report.json")
    written = [out / "report.json"]
    if scenario.report.plots and not args.no_plots:
        from simulator import plots

        written += plots.plot(result, report, out)
    print(
        f"\nwall {wall:.2f} s, {result.events / wall:,.0f} events/s; wrote {', '.join(str(p) for p in written)}"
    )
    return 0
