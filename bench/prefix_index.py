"""The cache-aware routers' prefix index at scale: memory and lookup time at 1M distinct
prompts (issue 27), and the kv_cost routing decision with the index that full.

    python bench/prefix_index.py [--prompts 1000000] [--workers 8] [--max-blocks 1000000]

The workload: every prompt is distinct — one of 100 shared prefixes (system prompts / RAG
documents, `--shared` blocks) followed by `--unique` blocks of its own — sent to a worker
chosen at random; one record per prompt, at 1 ms intervals of virtual time (TTL 120 s, so
entries older than 120,000 prompts expire). Hash chains are stand-ins (Python's hash of
(prefix, i) / (prompt, i)): the index only ever compares them.

Reports, per phase: record time per prompt (p50/p99, the CPU time of this thread around
each call, `time.thread_time_ns`, so other processes taking the core do not count; on a
shared machine wall-clock p99s are ~10 ms scheduler slices, not the code), the index's entries and the process's resident memory growth (/proc/self/statm:
the dictionaries, their int keys, nothing else is allocated meanwhile); then, with the
index full, `overlap` per (worker, prompt) lookup and one `kv_cost` decision over all
workers (filters, the cost of each, the softmax picker at τ = 0 and τ = 0.7, the record).
Not a test: the machine is shared — quote `uptime`'s load with any figure.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.prefix_index import PrefixIndex
from policies.routing.kv_cost import KvCostConfig, kv_cost
from policies.types import RequestInfo, WorkerView


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def pct(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000.0  # ns → µs


def chain(prefix: int, prompt: int, shared: int, unique: int) -> tuple[int, ...]:
    return tuple(hash((prefix, i)) for i in range(shared)) + tuple(
        hash((prefix, prompt, i)) for i in range(unique)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--max-blocks", type=int, default=1_000_000)
    ap.add_argument("--shared", type=int, default=8, help="blocks of the shared prefix")
    ap.add_argument("--unique", type=int, default=8, help="blocks of each prompt's own")
    ap.add_argument("--lookups", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    workers = [f"w{i}" for i in range(a.workers)]
    ix = PrefixIndex(block_tokens=16, ttl_s=120.0, max_blocks=a.max_blocks)
    base = rss_mb()
    record_ns: list[int] = []
    clock = time.thread_time_ns
    print(
        f"# prefix index: {a.prompts:,} distinct prompts of {a.shared}+{a.unique} blocks, "
        f"{a.workers} workers, max_blocks {a.max_blocks:,}; load {os.getloadavg()[0]:.2f}"
    )
    print("| prompts | entries | RSS growth MB | bytes/entry | record p50 µs | record p99 µs |")
    print("|---|---|---|---|---|---|")
    step = max(1, a.prompts // 5)
    for n in range(a.prompts):
        hashes = chain(n % 100, n, a.shared, a.unique)
        w = workers[rng.randrange(a.workers)]
        t0 = clock()
        ix.record(w, hashes, n * 0.001)
        record_ns.append(clock() - t0)
        if (n + 1) % step == 0:
            grown = rss_mb() - base
            print(
                f"| {n + 1:,} | {len(ix):,} | {grown:.0f} | {grown * 2**20 / max(1, len(ix)):.0f} "
                f"| {pct(record_ns, 0.5):.2f} | {pct(record_ns, 0.99):.2f} |"
            )
            record_ns.clear()
    now = a.prompts * 0.001
    # lookups: half recent prompts (hits, full or shared-prefix), half new prompts
    look_ns: list[int] = []
    hits = 0
    for _ in range(a.lookups):
        if rng.random() < 0.5:
            n = a.prompts - 1 - rng.randrange(min(a.prompts, 50_000))
        else:
            n = a.prompts + rng.randrange(10**9)
        hashes = chain(n % 100, n, a.shared, a.unique)
        w = workers[rng.randrange(a.workers)]
        t0 = clock()
        m = ix.overlap(w, hashes, now)
        look_ns.append(clock() - t0)
        hits += m > 0
    print(
        f"\noverlap(worker, chain of {a.shared + a.unique}): p50 {pct(look_ns, 0.5):.2f} µs, "
        f"p99 {pct(look_ns, 0.99):.2f} µs over {a.lookups:,} lookups ({hits:,} matched ≥ 1 block)"
    )
    for tau in (0.0, 0.7):
        router = kv_cost(KvCostConfig(temperature=tau, max_blocks=a.max_blocks))
        router.state.index = ix  # the full index, shared (the router records its choices)
        router.bind_kv_state(router.state)
        views = [
            WorkerView(
                w, "p", 32768, running=rng.randrange(30), outstanding_tokens=rng.randrange(10**5)
            )
            for w in workers
        ]
        dec_ns: list[int] = []
        for k in range(a.lookups):
            n = a.prompts + k if k % 2 else a.prompts - 1 - rng.randrange(50_000)
            hashes = chain(n % 100, n, a.shared, a.unique)
            req = RequestInfo(str(k), "m", now, 16 * len(hashes) + 7, 256, prefix_hashes=hashes)
            t0 = clock()
            router.choose(req, views)
            dec_ns.append(clock() - t0)
        print(
            f"kv_cost decision, {a.workers} workers, τ = {tau}: p50 {pct(dec_ns, 0.5):.1f} µs, "
            f"p99 {pct(dec_ns, 0.99):.1f} µs, mean {statistics.fmean(dec_ns) / 1000:.1f} µs"
        )
    print(f"\nfinal: {len(ix):,} entries, RSS growth {rss_mb() - base:.0f} MB")


if __name__ == "__main__":
    main()
