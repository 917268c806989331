"""PNG figures of a run (matplotlib, Agg backend: no display needed).

- ``timeseries.png``: TTFT of each request against its arrival time (per SLO class, with
  the class targets), output-token throughput, per-pool utilisation (slot-time busy
  fraction per sampling window), requests waiting in the engines and in flight, and
  token-load imbalance across each pool's workers.
- ``ttft_cdf.png``: the empirical CDF of TTFT per SLO class with its target.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from simulator.run import RunResult


def _ttft_by_class(result: RunResult) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for r in result.records:
        if r.status == "ok" and r.first_token is not None:
            xs, ys = out[r.slo_class]
            xs.append(r.arrival)
            ys.append(r.first_token - r.arrival)
    return dict(sorted(out.items()))


def plot(result: RunResult, report: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    s = result.series
    targets = result.scenario.slo
    classes = _ttft_by_class(result)
    fig, axes = plt.subplots(5, 1, figsize=(10, 14), sharex=True)
    ax = axes[0]
    for cls, (xs, ys) in classes.items():
        ax.scatter(xs, ys, s=2, alpha=0.4, label=cls)
        if cls in targets:
            ax.axhline(
                targets[cls],
                linestyle="--",
                linewidth=0.8,
                color=ax.collections[-1].get_facecolor()[0],
            )
    ax.set_ylabel("TTFT (s)")
    ax.set_yscale("log")
    ax.legend(loc="upper left", markerscale=4)
    ax.set_title(f"{report['scenario']} (seed {report['seed']})")
    axes[1].plot(s.t, s.tokens_per_s, linewidth=0.8)
    axes[1].set_ylabel("output tok/s")
    for name, p in s.pools.items():
        axes[2].plot(s.t, p.utilisation, linewidth=0.8, label=name)
        axes[3].plot(s.t, p.waiting, linewidth=0.8, label=f"{name} waiting (engine)")
        axes[3].plot(s.t, p.in_flight, linewidth=0.8, linestyle=":", label=f"{name} in flight")
        imb = [np.nan if x is None else x for x in p.imbalance]
        axes[4].plot(s.t, imb, linewidth=0.8, label=name)
    axes[2].set_ylabel("slot utilisation")
    axes[2].legend(loc="upper left")
    axes[3].set_ylabel("requests")
    axes[3].legend(loc="upper left")
    axes[4].set_ylabel("imbalance 1−mean/max")
    axes[4].set_xlabel("virtual time (s)")
    axes[4].legend(loc="upper left")
    fig.tight_layout()
    paths = [out_dir / "timeseries.png"]
    fig.savefig(paths[0], dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for cls, (_, ys) in classes.items():
        v = np.sort(np.asarray(ys))
        line = ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=cls)[0]
        if cls in targets:
            ax.axvline(targets[cls], linestyle="--", linewidth=0.8, color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    paths.append(out_dir / "ttft_cdf.png")
    fig.savefig(paths[1], dpi=90)
    plt.close(fig)
    return paths
