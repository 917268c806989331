"""The figure for docs/QUARTZ_PAPER.md's closed-loop QUARTZ statement: per-class TTFT distributions
(CDFs, chat and RAG) of FIFO-LL (gateway queue), FIFO-LL forwarding on arrival and QUARTZ
(the paper's key) at a client count per engine model, one seed, closed-loop load — and the
same methods under open-loop Poisson load at the open-loop protocol's knee (docs/QUARTZ_PAPER.md: 20 req/s
on the default engine, 15 req/s on the compute-bound one).

    python bench/quartz_closed_loop_fig.py --fleetopt 320 --compute 192 --out docs/quartz_closed_loop.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.quartz_protocol import ENGINES, NOMINAL, scenario_for, trace

from bench.quartz_closed_loop import CLJob, sequences, shape_for
from bench.quartz_experiments import BY_NAME, DISPATCH, FORWARD_LL
from simulator.closed_loop import simulate
from simulator.records import RequestRecord
from simulator.run import run

METHODS = (("FIFO-LL", "tab:blue"), (FORWARD_LL, "tab:green"), ("QUARTZ", "tab:red"))


def ttfts(records: list[RequestRecord], cls: str) -> np.ndarray:
    xs = [
        (r.first_token - r.arrival) if r.first_token is not None else np.inf
        for r in records
        if r.slo_class == cls
    ]
    return np.sort(np.array(xs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleetopt", type=int, default=320)
    ap.add_argument("--compute", type=int, default=192)
    ap.add_argument("--fleetopt-rate", type=float, default=20.0)
    ap.add_argument("--compute-rate", type=float, default=15.0)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--open-requests", type=int, default=3000, help="the open-loop protocol's")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("docs/quartz_closed_loop.png"))
    a = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharey=True)
    for col, (engine, clients) in enumerate((("fleetopt", a.fleetopt), ("compute", a.compute))):
        rate = a.fleetopt_rate if engine == "fleetopt" else a.compute_rate
        for name, colour in METHODS:
            job = CLJob(name, NOMINAL.name, clients, a.seed, a.requests, engine)
            sc = scenario_for(BY_NAME[name], NOMINAL, 10.0, a.requests, DISPATCH, ENGINES[engine])
            res, _ = simulate(
                sc, shape_for(job), sequences(NOMINAL.name, clients, a.requests, a.seed)
            )
            n = a.open_requests
            osc = scenario_for(BY_NAME[name], NOMINAL, rate, n, DISPATCH, ENGINES[engine])
            ores = run(osc, seed=a.seed, specs=trace(NOMINAL, rate, n, a.seed))
            for row, recs, load in (
                (0, res.records, f"{clients} clients"),
                (1, ores.records, f"Poisson {rate} req/s"),
            ):
                ax = axes[row][col]
                for cls, style in (("interactive", "-"), ("long", "--")):
                    xs = ttfts(recs, cls)
                    ax.plot(
                        xs,
                        np.arange(1, len(xs) + 1) / len(xs),
                        style,
                        color=colour,
                        label=f"{name} · {'chat' if cls == 'interactive' else 'RAG'}",
                    )
                ax.set_title(f"engine `{engine}`, {load}", fontsize=10)
                ax.set_xscale("log")
                ax.axvline(2.0, color="grey", lw=0.5)
                ax.axvline(4.0, color="grey", lw=0.5, ls="--")
                ax.set_xlabel("TTFT s (SLO: chat 2 s, RAG 4 s)")
    for ax in axes[:, 0]:
        ax.set_ylabel("share of requests")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle("QUARTZ vs FIFO-LL: per-class TTFT CDFs, closed-loop (top) vs open-loop (bottom)")
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=80)
    print(a.out, a.out.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
