"""How fast the pure engine model steps: prints tables, asserts nothing.

1. Saturated engine at several batch sizes (max_num_seqs): steps/s, requests/s and
   request-steps/s (one request advanced by one step) of `Engine.step()`.
2. The simulator's shape: 100 engines sharing 30,000 requests (Poisson arrivals, the
   engines stepped in virtual time by a heap), wall time end to end.

    PYTHONPATH=. /work/venv/bin/python bench/engine_step.py [--quick]
"""

from __future__ import annotations

import heapq
import random
import sys
import time

from emulator.engine import Engine, EngineConfig, EngineRequest
from policies.clock import ManualClock


def workload(n: int, seed: int, prefixes: int = 20) -> list[EngineRequest]:
    """Chat-like requests: lognormal prompts (median ~700), outputs (median ~150)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = min(6000, max(1, int(rng.lognormvariate(6.5, 0.9))))
        gen = min(1500, max(1, int(rng.lognormvariate(5.0, 0.8))))
        p = rng.randrange(prefixes)  # a shared system prompt of 20 blocks
        full = prompt // 16
        hashes = tuple(p * 1000 + b for b in range(min(20, full))) + tuple(
            hash((i, b)) for b in range(20, full)
        )
        out.append(EngineRequest(f"r{i}", prompt, gen + 64, gen, hashes))
    return out


def saturated(batch: int, n_requests: int) -> tuple[float, float, float, float]:
    clock = ManualClock()
    engine = Engine(EngineConfig(max_num_seqs=batch, num_kv_blocks=1 << 16), clock)
    for r in workload(n_requests, seed=batch):
        engine.submit(r)
    steps = request_steps = 0
    t0 = time.perf_counter()
    while engine.has_work():
        r = engine.step()
        clock.advance(r.duration)
        steps += 1
        request_steps += r.batch_size
    wall = time.perf_counter() - t0
    return steps / wall, n_requests / wall, request_steps / wall, request_steps / steps


def fleet(n_engines: int, n_requests: int, rate: float) -> tuple[float, int, int]:
    """Virtual-time fleet: one heap of (time, kind, engine) events, round-robin routing."""
    clocks = [ManualClock() for _ in range(n_engines)]
    engines = [Engine(EngineConfig(), c) for c in clocks]
    rng = random.Random(7)
    reqs = workload(n_requests, seed=1)
    t = 0.0
    events: list[tuple[float, int, int, int]] = []  # (time, 0=arrival/1=step, seq, engine)
    for i in range(n_requests):
        t += rng.expovariate(rate)
        events.append((t, 0, i, i % n_engines))
    heapq.heapify(events)
    stepping = [False] * n_engines
    steps = finished = 0
    t0 = time.perf_counter()
    while events:
        now, kind, i, e = heapq.heappop(events)
        clocks[e].set(max(now, clocks[e].t))
        if kind == 0:
            engines[e].submit(reqs[i])
            if stepping[e]:
                continue
        if engines[e].has_work():
            r = engines[e].step()
            steps += 1
            finished += len(r.finished)
            stepping[e] = True
            heapq.heappush(events, (now + r.duration, 1, -1, e))
        else:
            stepping[e] = False
    return time.perf_counter() - t0, steps, finished


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    n = 1000 if quick else 4000
    print("1. saturated engine (all requests queued at t=0, 65,536 KV blocks)")
    print(
        f"{'max_num_seqs':>12} {'mean batch':>10} {'steps/s':>10} {'req/s':>10} {'req-steps/s':>12}"
    )
    for batch in (1, 8, 32, 128, 256):
        count = min(n, 200) if batch == 1 else n
        sps, rps, rsps, mean_b = saturated(batch, count)
        print(f"{batch:>12} {mean_b:>10.1f} {sps:>10,.0f} {rps:>10,.0f} {rsps:>12,.0f}")
    total = 6000 if quick else 30_000
    wall, steps, finished = fleet(100, total, rate=25.0 * 100 / 8)
    print(f"\n2. fleet: 100 engines, {total:,} requests, Poisson arrivals, default config")
    print(f"{'wall s':>8} {'steps':>10} {'finished':>10} {'req/s':>10} {'steps/s':>10}")
    print(
        f"{wall:>8.2f} {steps:>10,} {finished:>10,} {finished / wall:>10,.0f} {steps / wall:>10,.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
