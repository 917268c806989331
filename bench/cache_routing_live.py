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
    ap.add_argument("--think-s", type=float, default=d.think_s)
    ap.add_argument("--ramp-s", type=float, default=d.ramp_s)
    ap.add_argument("--prefill-token-s", type=float, default=d.prefill_token_s)
    ap.add_argument("--seeds", default="", help="comma-separated seeds (default 1..reps)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--routers", default=",".join(ROUTERS), help=", ".join(ROUTERS))
    a = ap.parse_args()
    print(
        "| router | seed | requests | hit rate | client TTFT P50 / P90 / P99 / mean s "
        "| engine TTFT P50 / P90 / P99 / mean s | req/s | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else range(1, a.reps + 1)
    for seed in seeds:
        setup = dataclasses.replace(
            d, clients=a.clients, conversations=a.conversations, workers=a.workers,
            scale=a.scale, think_s=a.think_s, ramp_s=a.ramp_s, prefill_token_s=a.prefill_token_s, seed=seed,
        )  # fmt: skip
        for routing in a.routers.split(","):
            with procs() as ps:
                r = run_router(ps, setup, routing)
            print(
                f"| {routing} | {seed} | {r['requests']} | {r['hit']:.3f} | "
                f"{r['ttft_p50']:.3f} / {r['ttft_p90']:.3f} / {r['ttft_p99']:.3f} / "
                f"{r['ttft_mean']:.3f} | {r['engine_ttft_p50']:.3f} / "
                f"{r['engine_ttft_p90']:.3f} / {r['engine_ttft_p99']:.3f} / "
                f"{r['engine_ttft_mean']:.3f} | {r['rps']:.2f} | {r['wall_s']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
