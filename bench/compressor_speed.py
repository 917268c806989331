"""Compressor latency on borderline prompts, and the per-request cost C&R adds to requests
that are not compressed (FleetOpt §7.3, Table 4).

    python bench/compressor_speed.py [--corpus shapes|borderline] [--per-shape 20]
                                     [--n 150] [--repeat 5] [--cpu 0]

`--corpus shapes` (the default) times tests/shapes.py's borderline requests in the shapes
users send (issue 13), with rows for the requests compressed and those not (nothing to
shorten, or the units kept whole exceed T_c) and per shape; `borderline` the older set.

Prompts: tests/corpus.py's borderline set at the Agent-heavy configuration (B_short =
8192, γ = 1.5: L_total in (8192, 12288], prompts of ~7.9K–12K tokens): prose, RAG
(completion and tool-message chats) and multi-turn chats built from the Python and NumPy
documentation. Each is compressed to T_c = B_short − L_out with `fit_request`, the call
the gateway makes. "cold" is each prompt's first compression in a fresh process (every
distinct word is new to the memo); "warm" repeats the same prompts, as a long-running
gateway sees a vocabulary it has met before, with the analyzer's per-text cache emptied
before each call (the text itself is new: only its words are known); "repeat" compresses
each prompt right after itself, as the next turn of a chat resends its history or a
client retries (the texts are in that cache). Latency = wall time (perf_counter) and CPU
time (process_time) of the call on one core (`--cpu` pins the process). On a shared
machine, compare two versions with bench/compressor_ab.py (both in one run, interleaved).

The hot-path table times what every request pays before dispatch — category
(compressor/content.py), byte size, EMA estimate, placement — for the baseline
(ShortLongPlacement with a fixed 4 bytes/token) and for C&R, on requests that are not
compressed. Prints tables; exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compressor.compress import default_analyzer, fit_request
from compressor.content import classify
from policies.budget import (
    BudgetConfig,
    BudgetEstimator,
    estimate_chat,
    measure_chat,
    measure_prompt,
)
from policies.pools import CompressAndRoute, ShortLongPlacement
from policies.types import PoolSpec, RequestInfo
from tests import corpus, shapes

B_SHORT = 8192
POOLS = [PoolSpec("short", B_SHORT), PoolSpec("long", 65536)]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def row(name: str, values_ms: list[float]) -> str:
    return (
        f"| {name:<26} | {pct(values_ms, 0.5):7.2f} | {pct(values_ms, 0.95):7.2f} | "
        f"{pct(values_ms, 0.99):7.2f} | {statistics.fmean(values_ms):7.2f} | {len(values_ms):5d} |"
    )


def compress_once(s: corpus.Sample) -> tuple[float, float, bool, int, int]:
    target = B_SHORT - s.max_tokens
    w0, c0 = time.perf_counter(), time.process_time()
    r = fit_request(target, prompt=s.prompt, messages=s.messages)
    c1, w1 = time.process_time(), time.perf_counter()
    return (w1 - w0) * 1e3, (c1 - c0) * 1e3, r.fits, r.tokens_before, r.tokens_after


def kind_of(s: corpus.Sample) -> str:
    return str(s.meta.get("shape") or s.label.value)


def hot_path(samples: list[corpus.Sample], repeat: int) -> list[tuple[str, float, float]]:
    """µs per request for the baseline and the C&R pre-dispatch steps."""
    cfg = BudgetConfig()
    budget = BudgetEstimator(cfg)
    baseline = ShortLongPlacement(b_short=B_SHORT)
    cr = CompressAndRoute(b_short=B_SHORT)

    def base(s: corpus.Sample) -> object:
        size = (
            measure_chat(s.messages) if s.messages is not None else measure_prompt(s.prompt or "")
        )
        prompt = estimate_chat(size.content_bytes, size.n_messages, cfg)
        info = RequestInfo("r", "m", 0.0, prompt, s.max_tokens)
        return baseline.place(info, POOLS)

    def with_cr(s: corpus.Sample) -> object:
        size = (
            measure_chat(s.messages) if s.messages is not None else measure_prompt(s.prompt or "")
        )
        category = classify(s.prompt, s.messages)
        est = budget.estimate(size, category, s.max_tokens)
        info = RequestInfo("r", "m", 0.0, est.prompt_tokens, est.max_tokens, category=category)
        return cr.place(info, POOLS)

    def timed(fn: Callable[[corpus.Sample], object]) -> tuple[float, float]:
        best = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for s in samples:
                fn(s)
            best.append((time.perf_counter() - t0) / len(samples) * 1e6)
        return min(best), statistics.median(best)

    out = []
    for name, fn in (
        ("baseline: size+estimate+place", base),
        ("C&R: +category, EMA, band", with_cr),
    ):
        lo, med = timed(fn)
        out.append((name, lo, med))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=150, help="borderline prompts")
    ap.add_argument("--repeat", type=int, default=5, help="warm passes over the prompts")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--corpus", choices=("shapes", "borderline"), default="shapes")
    ap.add_argument("--per-shape", type=int, default=20)
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.corpus == "shapes":
        samples = shapes.shape_set(args.per_shape, seed=args.seed + 12, b_short=B_SHORT)
    else:
        samples = corpus.borderline_set(args.n, seed=args.seed, b_short=B_SHORT)
    sizes = [s.meta["l_total"] - s.max_tokens for s in samples]

    cold_w, cold_c, warm_w, warm_c = [], [], [], []
    fits = 0
    removed = []
    by_kind: dict[str, list[float]] = {}
    by_outcome: dict[str, list[float]] = {}
    for s in samples:
        w, c, ok, before, after = compress_once(s)
        cold_w.append(w)
        cold_c.append(c)
        fits += ok
        removed.append(before - after)
        outcome = "compressed" if ok else "not compressed"
        by_outcome.setdefault(f"cold wall, {outcome}", []).append(w)
    analyzer = default_analyzer()
    repeat_w, repeat_c = [], []
    for _ in range(args.repeat):
        for s in samples:
            analyzer.forget_texts()  # warm vocabulary, unseen text
            w, c, ok, *_ = compress_once(s)
            warm_w.append(w)
            warm_c.append(c)
            by_kind.setdefault(kind_of(s), []).append(c)
            outcome = "compressed" if ok else "not compressed"
            by_outcome.setdefault(f"warm wall, {outcome}", []).append(w)
            by_outcome.setdefault(f"warm CPU, {outcome}", []).append(c)
            w, c, ok, *_ = compress_once(s)  # the same texts again: the per-text cache
            repeat_w.append(w)
            repeat_c.append(c)

    print(
        f"# Compressor latency: {len(samples)} borderline prompts, {min(sizes)}–{max(sizes)} prompt tokens"
    )
    print(
        f"# (B_short={B_SHORT}, γ=1.5, T_c = B_short − L_out); fit within T_c: {fits}/{len(samples)};"
    )
    print(
        f"# mean tokens removed {statistics.fmean(removed):.0f}; load average {os.getloadavg()[0]:.2f}"
    )
    print()
    print("| pass                       |  p50 ms |  p95 ms |  p99 ms | mean ms |     n |")
    print("|----------------------------|---------|---------|---------|---------|-------|")
    print(row("cold, wall", cold_w))
    print(row("cold, CPU", cold_c))
    print(row("warm, wall", warm_w))
    print(row("warm, CPU", warm_c))
    print(row("repeat wall (texts cached)", repeat_w))
    print(row("repeat CPU (texts cached)", repeat_c))
    for name, values in sorted(by_outcome.items()):
        print(row(name, values))
    for kind, values in sorted(by_kind.items()):
        print(row(f"warm CPU, {kind}", values))
    print("| paper Table 4 (Agent-heavy) |    3.4  |    6.2  |    7.8  |         |       |")
    print()

    small = [corpus.chat_sample(corpus.random.Random(i), 600) for i in range(100)]
    medium = [corpus.prose_prompt(corpus.random.Random(i), 4000) for i in range(40)]
    print("# Pre-dispatch cost per request that is not compressed (µs; min and median of passes)")
    print()
    print(
        "| requests                          | path                            | min µs | median µs |"
    )
    print(
        "|-----------------------------------|---------------------------------|--------|-----------|"
    )
    for label, group in (("100 chats, ~600 tokens", small), ("40 prompts, ~4000 tokens", medium)):
        for name, lo, med in hot_path(group, max(args.repeat, 3)):
            print(f"| {label:<33} | {name:<31} | {lo:6.1f} | {med:9.1f} |")
    print()
    beta = 0.112
    print(
        f"# Mean overhead per request at β = {beta} (Agent-heavy): β × p50 warm wall = {beta * pct(warm_w, 0.5):.2f} ms "
        f"(paper: 0.39 ms)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
