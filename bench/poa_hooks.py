#!/usr/bin/env python3
"""What the PoA diagnostics' hooks cost a request (docs/CACHE_ROUTING.md, "Benchmarks"):
the gateway's `PoaMonitor` hooks driven as the core drives its hooks — for every request
on_arrival, on_dispatch, on_first_token, on_complete, each over every hook — with 16
requests in flight over 4 workers of the first pool, prefix hashes of 8 blocks. Thread CPU
time per request, best of --reps rounds of --requests; "none" is the same loop with no
hooks (the loop's own cost, to subtract). Then the every-interval part: a full window
(512 completions over 4 workers, a prefix index holding their chains) snapshotted on the
loop, and both estimates on the monitor's thread.

    python bench/poa_hooks.py [--requests 20000] [--reps 7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.poa_gauges import PoaMonitor, estimate
from policies.prefix_index import PrefixIndex
from policies.types import Outcome, RequestInfo, Status

OK = Outcome(Status.OK)


def run(hooks: tuple[object, ...], requests: list[RequestInfo], workers: list[str]) -> float:
    """CPU seconds per request of the four events over `hooks`, 16 requests in flight."""
    hs: tuple[object, ...] = hooks
    t0 = time.thread_time()
    now = 0.0
    for i, r in enumerate(requests):
        now += 0.001
        for h in hs:
            h.on_arrival(r, now)  # type: ignore[attr-defined]
        w = workers[i % len(workers)]
        for h in hs:
            h.on_dispatch(r, w, now)  # type: ignore[attr-defined]
        for h in hs:
            h.on_first_token(r, now)  # type: ignore[attr-defined]
        if i >= 16:
            done = requests[i - 16]
            for h in hs:
                h.on_complete(done, OK, now)  # type: ignore[attr-defined]
    return (time.thread_time() - t0) / len(requests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    hashes = tuple(range(8))
    print("| cache-aware pools | hooks | µs per request (best) | minus no hooks µs |")
    print("|---|---|---|---|")
    for pools in (["short"], ["short", "long"]):
        fleet = {f"{p}-w{k}": SimpleNamespace(pool=p) for p in pools for k in range(4)}
        workers = [w for w in fleet if w.startswith(pools[0])]
        results = {}
        for name in ("none", "poa"):
            best = float("inf")
            for rep in range(a.reps):
                monitor = PoaMonitor(
                    pools,
                    {},
                    lambda pool, f=fleet: [w for w in f if w.startswith(pool)],  # type: ignore[misc]
                    lambda worker, f=fleet: getattr(f.get(worker), "pool", None),  # type: ignore[misc]
                )
                hooks = monitor.hooks() if name == "poa" else ()
                reqs = [
                    RequestInfo(f"r{rep}-{i}", "m", 0.0, 100, 10, prefix_hashes=hashes)
                    for i in range(a.requests)
                ]
                best = min(best, run(hooks, reqs, workers))
            results[name] = best
            print(
                f"| {len(pools)} | {name} ({len(hooks)}) | {best * 1e6:.2f} | "
                f"{(best - results['none']) * 1e6:.2f} |"
            )

    print()
    print("| every interval | CPU ms (best) |")
    print("|---|---|")
    fleet = {f"short-w{k}": SimpleNamespace(pool="short") for k in range(4)}
    workers = list(fleet)
    index = PrefixIndex()
    state = SimpleNamespace(index=index)
    monitor = PoaMonitor(
        ["short"],
        {"short": SimpleNamespace(state=state)},  # type: ignore[dict-item]
        lambda pool: workers,
        lambda worker: getattr(fleet.get(worker), "pool", None),
    )
    reqs = []
    for i in range(600):
        hashes = tuple(range(i % 50 * 100, i % 50 * 100 + 8))
        index.record(workers[i % 4], hashes, 0.0)
        reqs.append(RequestInfo(f"e{i}", "m", 0.0, 100, 10, prefix_hashes=hashes))
    run(monitor.hooks(), reqs, workers)
    snap_s, est_s = float("inf"), float("inf")
    for _ in range(a.reps):
        t0 = time.thread_time()
        (snap,) = monitor.snapshots(1.0)
        t1 = time.thread_time()
        estimate(snap)
        snap_s, est_s = min(snap_s, t1 - t0), min(est_s, time.thread_time() - t1)
    print(f"| snapshot on the loop ({len(snap.done)} completions) | {snap_s * 1e3:.3f} |")
    print(f"| both estimates on the thread | {est_s * 1e3:.1f} |")


if __name__ == "__main__":
    main()
