#!/usr/bin/env python3
"""What hashing a prompt costs the gateway per request (docs/CACHE_ROUTING.md): the byte
chunks every cache-aware router reads by default (`prompt_hashes`), against the token-id
chains of a pool whose engines publish KV events (`token_hasher`: render, encode, chain).
Thread CPU time, best of --reps, for chat prompts of a system message of 1–64 KiB of
prose-like words.

    python bench/prompt_hashing.py [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway import cache_routing
from gateway.openai_request import ParsedRequest, parse

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "at",
    "this",
    "from",
    "or",
    "an",
    "are",
]


def prompt(kib: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    text = []
    size = 0
    while size < kib * 1024:
        w = rng.choice(WORDS) if rng.random() < 0.7 else f"w{rng.randrange(50_000)}"
        text.append(w)
        size += len(w) + 1
    messages = [
        {"role": "system", "content": " ".join(text)},
        {"role": "user", "content": "What does it say?"},
    ]
    return json.dumps({"model": "m", "messages": messages}).encode()


def best(fn: Callable[[ParsedRequest], object], parsed: ParsedRequest, reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn(parsed)
        out.append(time.thread_time() - t0)
    return min(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    tokens = cache_routing.token_hasher(None, 16)
    print("| system prompt | byte chunks µs | token-id chain µs | token blocks |")
    print("|---|---|---|---|")
    for kib in (1, 4, 16, 64):
        parsed = parse(prompt(kib), "chat")
        tokens(parsed)  # warm the tokenizer
        b = best(cache_routing.prompt_hashes, parsed, a.reps)
        t = best(tokens, parsed, a.reps)
        print(f"| {kib} KiB | {b * 1e6:.0f} | {t * 1e6:.0f} | {len(tokens(parsed))} |")


if __name__ == "__main__":
    main()
