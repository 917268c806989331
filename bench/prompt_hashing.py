#!/usr/bin/env python3
"""What hashing a prompt costs the gateway per request (docs/CACHE_ROUTING.md): the byte
chunks every cache-aware router reads by default (`prompt_hashes`), against the token-id
chains of a pool whose engines publish KV events (`token_hasher`: render, encode, chain).
Thread CPU time, best of --reps, for chat prompts of a system message of 1–64 KiB of
prose-like words; then a conversation's turns (a 6 KiB system prompt, user messages of
~300 bytes and answers of ~1 KiB appended turn by turn), hashed as token-id chains with a
fresh hasher per measurement (nothing cached: every message encoded, as before the
cache) and with a hasher that has hashed the earlier turns (its `MessageIdsCache`
encodes only the turn's new messages: the user's, and the previous answer).

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
    print(
        "| system prompt | byte chunks µs | token-id chain, first time µs "
        "| again (cached) µs | token blocks |"
    )
    print("|---|---|---|---|---|")
    cache_routing.token_hasher(None, 16)(parse(prompt(1, seed=9), "chat"))  # the tokenizer
    for kib in (1, 4, 16, 64):
        parsed = parse(prompt(kib), "chat")
        b = best(cache_routing.prompt_hashes, parsed, a.reps)
        cold = min(best(cache_routing.token_hasher(None, 16), parsed, 1) for _ in range(a.reps))
        tokens = cache_routing.token_hasher(None, 16)
        tokens(parsed)
        t = best(tokens, parsed, a.reps)
        print(
            f"| {kib} KiB | {b * 1e6:.0f} | {cold * 1e6:.0f} | {t * 1e6:.0f} "
            f"| {len(tokens(parsed))} |"
        )
    print()
    print(
        "| turn | prompt KiB | token blocks | byte chunks µs | token ids, nothing cached µs "
        "| after the earlier turns µs |"
    )
    print("|---|---|---|---|---|---|")
    rng = random.Random(3)
    messages = json.loads(prompt(6))["messages"][:1]
    earlier: list[ParsedRequest] = []
    for turn in range(1, 9):
        messages.append({"role": "user", "content": words(60, rng)})
        body = json.dumps({"model": "m", "messages": messages}).encode()
        parsed = parse(body, "chat")
        b = best(cache_routing.prompt_hashes, parsed, a.reps)
        cold = min(best(cache_routing.token_hasher(None, 16), parsed, 1) for _ in range(a.reps))
        warm = []
        for _ in range(a.reps):  # a gateway that hashed the earlier turns: their messages
            hasher = cache_routing.token_hasher(None, 16)  # are cached, this turn's new
            for p in earlier:  # user message and the last answer are not
                hasher(p)
            warm.append(best(hasher, parsed, 1))
        earlier.append(parsed)
        print(
            f"| {turn} | {len(body) / 1024:.1f} | {len(hasher(parsed))} | {b * 1e6:.0f} | "
            f"{cold * 1e6:.0f} | {min(warm) * 1e6:.0f} |"
        )
        messages.append({"role": "assistant", "content": words(200, rng)})


def words(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


if __name__ == "__main__":
    main()
