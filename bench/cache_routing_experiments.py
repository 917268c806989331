"""Issue 27's simulator experiments (tests/experiments/cache_routing.py; the tables in
docs/CACHE_ROUTING.md): the Price-of-Anarchy paper's protocol on an ordinary pool — the C
sweep, the 4×4 (τ, ω) grid, the 32 → 128 → 32 spike with 3 seeds — and the workload it
never ran (multi-turn sessions over 128 shared system prompts).

    python bench/cache_routing_experiments.py [--quick] [--only sweep,grid,spike,hetero,hold,...]

Virtual time: the figures do not depend on the machine (a full run takes a few minutes).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.experiments import cache_routing as cr


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def table(rows: Sequence[dict[str, Any]], cols: Sequence[str]) -> str:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


METRICS = ("hit", "ttft_p50", "ttft_p99", "itl_p99", "latency", "rps", "concurrency", "poa")


def sweep(quick: bool) -> None:
    cs = (1, 16, 64, 128, 256) if quick else cr.C_SWEEP
    hold = 30.0 if quick else 120.0
    rows = cr.c_sweep(cs=cs, hold_s=hold)
    print(f"## C sweep: the paper's workload, kv_cost (τ 0, ω 1), hold {hold:.0f} s\n")
    print(table(rows, ("C", *METRICS)))
    print(f"\nknee (first C with TTFT P99 ≥ 10× C=1's, and the ratio): {cr.knee(rows)}\n")


def grid(quick: bool, gateway_queue: bool = True) -> None:
    hold = 30.0 if quick else 120.0
    where = "gateway queue" if gateway_queue else "engine queues (forward at arrival)"
    for c in (64, 128):
        rows = cr.grid(c, hold_s=hold, gateway_queue=gateway_queue)
        spreads = []
        for k in ("ttft_p99", "latency", "rps", "poa"):
            xs = [r[k] for r in rows]
            spreads.append(f"{k} {(max(xs) - min(xs)) / min(xs):.1%}")
        print(
            f"## (τ, ω) grid at C = {c}, {where}, hold {hold:.0f} s: spread {', '.join(spreads)}\n"
        )
        print(table(rows, ("tau", "omega", *METRICS)))
        print()


def spike(quick: bool, gateway_queue: bool = True) -> None:
    seeds = (1,) if quick else (1, 2, 3)
    where = "gateway queue" if gateway_queue else "engine queues (forward at arrival)"
    print(f"## Spike C = 32 → 128 → 32 (40 / 60 / 40 s), {where}, mean ± sd over seeds\n")
    print(
        "| strategy | phase | TTFT P50 | TTFT P99 | ITL P99 | mean latency | rps | eff. C | PoA^ |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    switches: dict[str, list[Any]] = {}
    for router in (cr.KV_COST, cr.ADAPTIVE):
        runs = [cr.spike(router, s, gateway_queue=gateway_queue) for s in seeds]
        switches[router.label] = [r["switch_s"] for r in runs]
        for phase in ("below", "saturated", "recovery"):
            cells = []
            for k in ("ttft_p50", "ttft_p99", "itl_p99", "latency", "rps", "concurrency", "poa"):
                xs = [r[phase][k] for r in runs]
                sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
                cells.append(f"{statistics.mean(xs):.3f} ± {sd:.3f}")
            print(f"| {router.label} | {phase} | " + " | ".join(cells) + " |")
    print(f"\nregime left Below this many seconds after the spike began: {switches}\n")


def hetero(quick: bool) -> None:
    hold = 30.0 if quick else 60.0
    for c in (128, 256):
        rows = cr.heterogeneous(c, hold_s=hold)
        print(
            f"## Sessions workload at C = {c} (4 workers, think {cr.THINK_S} s), hold {hold:.0f} s\n"
        )
        print(table(rows, ("router", *METRICS)))
        print()
    rows = cr.hetero_sweeps(256, hold_s=hold)
    print(f"## Sessions workload at C = 256 (the knee): kv_cost ω and τ, hold {hold:.0f} s\n")
    print(table(rows, ("tau", "omega", *METRICS)))
    print()


def engine_queues(quick: bool) -> None:
    """The grid and the spike again, requests forwarded at arrival: the router then
    chooses among every worker at saturation, not only the one with a free slot."""
    grid(quick, gateway_queue=False)
    spike(quick, gateway_queue=False)


def plateau(quick: bool) -> None:
    """PoA^'s below-knee plateau with 2 and 5 workers (the paper's 1P/2D against 1P/5D)."""
    hold = 30.0 if quick else 120.0
    print(f"## PoA^ plateau, 2 against 5 workers, kv_cost, hold {hold:.0f} s\n")
    rows = []
    for workers in (2, 5):
        for c in (16, 32, 64):
            pool = {**cr.PAPER_POOL, "workers": workers}
            m, _ = cr.run_one(cr.KV_COST, c, 1, cr.PAPER, hold_s=hold, poa_every_s=5.0, **pool)
            rows.append({"workers": workers, "C": c, **m})
    print(table(rows, ("workers", "C", *METRICS)))
    print()


def hold(quick: bool) -> None:
    """The detector's false alarms: regime_adaptive held 30 minutes at 0.5·C* (C* ≈ 96,
    the sweep's knee), 3 seeds; it should never leave Below."""
    hold_s = 120.0 if quick else 1800.0
    print(f"## regime_adaptive held at C = 48 (0.5·C*), {hold_s:.0f} s, seeds 1–3\n")
    rows = [cr.quiet_hold(48, hold_s, seed) for seed in (1, 2, 3)]
    cols = ("seed", "regime_changes", "max_regime", "baseline", "theta1", "smoothed_median")
    print(table(rows, (*cols, "smoothed_max", "ttft_p99", "rps", "n")))
    print()


PARTS = {
    "sweep": sweep,
    "grid": grid,
    "spike": spike,
    "hetero": hetero,
    "engine_queues": engine_queues,
    "plateau": plateau,
    "hold": hold,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer points, shorter holds")
    ap.add_argument("--only", default=",".join(PARTS), help=", ".join(PARTS))
    a = ap.parse_args()
    for name in a.only.split(","):
        PARTS[name](a.quick)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
