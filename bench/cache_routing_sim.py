"""A first look at the cache-aware routers in the simulator (issue 27; not its experiments):
engine prefix-hit rate and TTFT per router on a many-prefix workload.

    python bench/cache_routing_sim.py [--requests 1500] [--rate 8] [--seed 1]

The workload is tests/unit/simulator/test_cache_routing.py's: 120 shared templates of
1–3k tokens (Zipf 0.6) plus a unique suffix, over 4 workers whose KV caches (2,048 blocks
of 16 tokens) hold ~16 templates each, Poisson arrivals. Each router runs the real
pipeline core with its `hooks()` attached by the composition root (policies/build.py), so the
prefix index and active blocks follow the core's dispatch and completion events. Virtual
time: the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.routing import make_router
from simulator.run import run
from tests.unit.simulator.test_cache_routing import many_prefixes

ROUTERS: list[tuple[str, dict[str, float]]] = [
    ("least_loaded", {}),
    ("power_of_two", {}),
    ("prefix_overlap", {}),
    ("kv_cost", {}),
    ("kv_cost", {"temperature": 0.7}),
    ("kv_cost", {"overlap_weight": 2.0}),
    ("kv_cost", {"overlap_weight": 4.0}),
    ("kv_cost", {"overlap_weight": 8.0}),
    ("regime_adaptive", {}),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--rate", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    scenario = many_prefixes(a.requests, a.rate)
    print(f"# {a.requests} requests at {a.rate} req/s, seed {a.seed}")
    print("| router | params | prefix hit rate | TTFT p50 s | TTFT p99 s |")
    print("|---|---|---|---|---|")
    for name, params in ROUTERS:
        router = make_router(name, params)
        result = run(scenario, seed=a.seed, routers={"short": router})  # hooks: build_core
        ttft = sorted(r.first_token - r.arrival for r in result.records if r.first_token)
        hit = result.engine_stats["short"]["prefix_hit_rate"]
        p50, p99 = ttft[len(ttft) // 2], ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))]
        print(f"| {name} | {params or ''} | {hit:.3f} | {p50:.3f} | {p99:.3f} |")


if __name__ == "__main__":
    main()
