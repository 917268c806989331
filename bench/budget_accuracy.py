"""Token-budget accuracy: the per-category bytes/token EMA against the engine's count,
before and after warm-up (FleetOpt §2.1).

    python bench/budget_accuracy.py [--n 800] [--seed 3]

A stream of mixed requests (tests/corpus.py: prose, RAG, chat, code; completions and
chats; 300–14000 tokens, so the stream straddles B_short = 8192 and its borderline band)
arrives in random order. For each, the gateway's view: content category
(compressor/content.py), byte size, estimate L_in with the current ĉ_k
(policies/budget.py); then the engine's count — cl100k text plus one token per Llama-3
special token, the emulator's template (compressor/template.py; a completion: BOS + text) — is
fed back with `observe`, as the gateway does after each response.

Reported: |estimate − engine| / engine per request, over the first requests of each
category (cold: ĉ_k still at or near the 4.0 prior) and over the rest (warm), for the
EMA and for the fixed 4 bytes/token baseline; and how often the estimate puts L_total on
the same side of the pool boundaries (≤ B_short, borderline, > γ·B_short) as the exact
count.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compressor.content import classify
from policies.budget import (
    BudgetConfig,
    BudgetEstimator,
    estimate_chat,
    measure_chat,
    measure_prompt,
)
from policies.types import Category
from tests import corpus

B_SHORT = 8192
GAMMA = 1.5
WARM_AFTER = 20  # requests of a category before its estimate counts as warm


def region(total: int) -> str:
    if total <= B_SHORT:
        return "short"
    return "band" if total <= GAMMA * B_SHORT else "long"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] if s else float("nan")


def stream(n: int, seed: int) -> list[corpus.Sample]:
    rng = random.Random(seed)
    out = []
    makers = (
        lambda t: corpus.prose_prompt(rng, t),
        lambda t: corpus.rag_sample(rng, t),
        lambda t: corpus.chat_sample(rng, t),
        lambda t: corpus.code_sample(rng, t, as_chat=rng.random() < 0.3),
    )
    for _ in range(n):
        target = int(300 * (14000 / 300) ** rng.random())
        out.append(rng.choice(makers)(target))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=800)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    config = BudgetConfig()
    budget = BudgetEstimator(config)
    seen: Counter[Category] = Counter()
    errors: dict[tuple[str, str, str], list[float]] = {}
    same_region = Counter[str]()
    total_region = Counter[str]()
    samples = stream(args.n, args.seed)
    for s in samples:
        size = (
            measure_chat(s.messages) if s.messages is not None else measure_prompt(s.prompt or "")
        )
        category = classify(s.prompt, s.messages)
        engine = s.tokens()
        est = budget.estimate(size, category, s.max_tokens).prompt_tokens
        base = estimate_chat(size.content_bytes, size.n_messages, config)
        phase = "cold" if seen[category] < WARM_AFTER else "warm"
        for name, value in (("EMA", est), ("fixed 4.0", base)):
            err = abs(value - engine) / engine
            for cat in (category.value, "all"):
                errors.setdefault((name, phase, cat), []).append(err)
        if phase == "warm":
            total_region["EMA"] += 1
            total_region["fixed 4.0"] += 1
            same_region["EMA"] += region(est + s.max_tokens) == region(engine + s.max_tokens)
            same_region["fixed 4.0"] += region(base + s.max_tokens) == region(engine + s.max_tokens)
        budget.observe(size, category, engine)
        seen[category] += 1

    print(
        f"# Token-budget accuracy: {len(samples)} mixed requests, engine count = cl100k over the emulator's Llama-3 template"
    )
    print(
        f"# cold = a category's first {WARM_AFTER} requests, warm = the rest; |est − engine| / engine"
    )
    print()
    print("| estimator | phase | category |    n | mean err | p50 err | p90 err | p99 err |")
    print("|-----------|-------|----------|------|----------|---------|---------|---------|")
    for name in ("fixed 4.0", "EMA"):
        for phase in ("cold", "warm"):
            for cat in [*(c.value for c in Category), "all"]:
                v = errors.get((name, phase, cat))
                if not v:
                    continue
                print(
                    f"| {name:<9} | {phase:<5} | {cat:<8} | {len(v):4d} | {statistics.fmean(v):8.3%} "
                    f"| {pct(v, 0.5):7.2%} | {pct(v, 0.9):7.2%} | {pct(v, 0.99):7.2%} |"
                )
    print()
    print(
        "| learnt ĉ_k (bytes/token) | "
        + " | ".join(f"{c.value}: {budget.state.ratio(c):.3f}" for c in Category)
        + " |"
    )
    print()
    for name in ("fixed 4.0", "EMA"):
        share = same_region[name] / max(total_region[name], 1)
        print(
            f"# warm requests whose estimated L_total falls in the same region (short / band / long) "
            f"as the exact one, {name}: {share:.3%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
