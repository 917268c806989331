"""Issue 27's live run (tests/experiments/cache_routing_live.py; docs/CACHE_ROUTING.md):
gateway + emulators with prefix caching, multi-turn chats through the openai SDK; hit rate,
TTFT and throughput per router against least-loaded.

    python bench/cache_routing_live.py [--clients 24] [--conversations 3] [--reps 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.experiments.cache_routing_live import ROUTERS, Setup, run_router
from tests.procs import procs


def main() -> None:
    d = Setup()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=d.clients)
    ap.add_argument("--conversations", type=int, default=d.conversations)
    ap.add_argument("--workers", type=int, default=d.workers)
    ap.add_argument("--scale", type=float, default=d.scale)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--routers", default=",".join(ROUTERS), help=", ".join(ROUTERS))
    a = ap.parse_args()
    print("| router | rep | requests | hit rate | TTFT P50 s | TTFT P99 s | req/s | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for rep in range(a.reps):
        setup = dataclasses.replace(
            d, clients=a.clients, conversations=a.conversations, workers=a.workers,
            scale=a.scale, seed=rep + 1,
        )  # fmt: skip
        for routing in a.routers.split(","):
            with procs() as ps:
                r = run_router(ps, setup, routing)
            print(
                f"| {routing} | {rep + 1} | {r['requests']} | {r['hit']:.3f} | "
                f"{r['ttft_p50']:.3f} | {r['ttft_p99']:.3f} | {r['rps']:.2f} | {r['wall_s']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
