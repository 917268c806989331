"""Per-rank load over time for each policy (the issue's plot; docs/BFIO.md, "Per-rank load
over time").

    nice -n 10 python bench/bfio_plots.py                       # docs/bfio_rank_load.png
    nice -n 10 python bench/bfio_plots.py --steps 200 --out /tmp/x.png

The lockstep DP group simulator (simulator/dp_group.py) at the paper's setting — G = 32
ranks, B = 72 slots, pool target R = 128, the synthetic BurstGPT-like lengths, one seed —
run for FCFS, JSQ, BF-IO H = 0 and BF-IO H = 20 with the oracle predictor (its warm-up
under H = 0, as in bench/bfio_experiments.py). Every policy sees the same lengths. After
`--warmup` steps, `--steps` measured steps go to a recorder (`run_group(recorder=...)`),
and one figure is drawn: per policy the 32 ranks' loads L_g over the steps (thin lines; the
mean in black), then on shared axes the per-step imbalance G·max L − Σ L (log scale), the
per-step barrier-idle fraction, and the pool wait's complementary CDF (reveal → admission).
Prints each policy's means over the plotted steps.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from PIL import Image

from policies.assign import make_assigner
from simulator.dp_group import GroupConfig, StepRecord, run_group

POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "FCFS": ("fcfs_maxfree", {}),
    "JSQ": ("jsq_count", {}),
    "BF-IO H = 0": ("bfio", {}),
    "BF-IO H = 20, oracle": ("bfio", {"lookahead_steps": 20, "predictor": "oracle"}),
}
COLORS = {"FCFS": "C3", "JSQ": "C1", "BF-IO H = 0": "C0", "BF-IO H = 20, oracle": "C2"}


class Trace:
    """What the recorder keeps of a run: loads [steps, G], imbalance, idle, pool waits."""

    def __init__(self) -> None:
        self.loads: list[np.ndarray[Any, Any]] = []
        self.imbalance: list[float] = []
        self.idle: list[float] = []
        self.waits: list[float] = []

    def __call__(self, rec: StepRecord) -> None:
        self.loads.append(rec.loads.copy())
        self.imbalance.append(rec.imbalance)
        self.idle.append(rec.idle)
        self.waits.extend(rec.waits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=400, help="measured steps")
    ap.add_argument("--warmup", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("docs/bfio_rank_load.png"))
    args = ap.parse_args()

    traces: dict[str, Trace] = {}
    for name, (policy, params) in POLICIES.items():
        trace = Trace()
        warm = make_assigner("bfio") if params.get("lookahead_steps") else None
        t0 = time.process_time()
        run_group(
            make_assigner(policy, params),
            GroupConfig(steps=args.steps, warmup=args.warmup, seed=args.seed),
            warmup_with=warm,
            recorder=trace,
        )
        traces[name] = trace
        wait = np.array(trace.waits) if trace.waits else np.zeros(1)
        print(
            f"{name:22s} imbalance {np.mean(trace.imbalance):10,.0f} tokens"
            f"  idle {100 * np.mean(trace.idle):5.1f} %"
            f"  pool wait P50/P99 {np.percentile(wait, 50):.2f}/{np.percentile(wait, 99):.2f} s"
            f"  ({time.process_time() - t0:.1f} s CPU)",
            flush=True,
        )

    fig = plt.figure(figsize=(16, 9.5), dpi=100)
    grid = fig.add_gridspec(2, 12, height_ratios=[1.15, 1], hspace=0.32, wspace=1.6)
    top = max(float(np.max(t.loads)) for t in traces.values()) / 1000 * 1.03
    bottom = min(float(np.min(t.loads)) for t in traces.values()) / 1000 * 0.95
    steps = np.arange(args.steps)
    for i, (name, trace) in enumerate(traces.items()):
        ax = fig.add_subplot(grid[0, 3 * i : 3 * i + 3])
        loads = np.array(trace.loads) / 1000  # [steps, G], thousands of tokens
        ax.plot(steps, loads, lw=0.5, alpha=0.55)
        ax.plot(steps, loads.mean(axis=1), color="black", lw=1.2, label="mean")
        ax.set_ylim(bottom, top)
        ax.set_title(f"{name}\nmax − min gap {np.mean(np.ptp(loads, axis=1)):.1f}k", fontsize=10)
        ax.set_xlabel("measured step")
        if i == 0:
            ax.set_ylabel("rank load L_g (thousand tokens)")
            ax.legend(loc="lower left", fontsize=8)
        else:
            ax.tick_params(labelleft=False)
    ax_imb = fig.add_subplot(grid[1, 0:4])
    ax_idle = fig.add_subplot(grid[1, 4:8])
    ax_wait = fig.add_subplot(grid[1, 8:12])
    for name, trace in traces.items():
        c = COLORS[name]
        ax_imb.plot(steps, np.array(trace.imbalance) / 1000, color=c, lw=0.8, label=name)
        ax_idle.plot(steps, 100 * np.array(trace.idle), color=c, lw=0.8, label=name)
        w = np.sort(np.array(trace.waits))
        ax_wait.step(w, 1 - np.arange(len(w)) / len(w), where="post", color=c, label=name)
    ax_imb.set_yscale("log")
    ax_imb.set_title("per-step imbalance G·max L − Σ L", fontsize=10)
    ax_imb.set_ylabel("thousand tokens")
    ax_imb.set_xlabel("measured step")
    ax_idle.set_title("per-step barrier idle Σ(max t − t_g) / (G·t_step)", fontsize=10)
    ax_idle.set_ylabel("% of rank time")
    ax_idle.set_xlabel("measured step")
    ax_wait.set_yscale("log")
    ax_wait.set_title("pool wait (reveal → admission), CCDF", fontsize=10)
    ax_wait.set_xlabel("seconds")
    ax_wait.set_ylabel("share of admissions waiting longer")
    ax_imb.legend(fontsize=8, loc="upper right")
    fig.suptitle(
        f"Lockstep DP group simulator, G = 32, B = 72, R = 128, seed {args.seed}:"
        f" {args.steps} steps after {args.warmup} warm-up steps",
        fontsize=11,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, dpi=100, bbox_inches="tight")
    # 256 colours: the thin translucent lines make a true-colour PNG too large for the repo
    Image.open(buf).convert("RGB").quantize(256).save(args.out, optimize=True)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
