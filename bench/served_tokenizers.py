"""How often compressed requests overflow B_short on a non-cl100k engine, how exact the
quick count is, and what counting with the served model's tokenizer costs.

    python bench/served_tokenizers.py [--n 150] [--repeat 3] [--speed-only] [--cpu 0]

Borderline chats of tests/corpus.py (B_short = 8192, T_c = B_short − max_tokens); models
Qwen3 and Llama-3 with Llama-3.1's template (tests/served_models.py).

1. Overflow: compress counting (a) with cl100k (the default) and (b) with the served
   model's tokenizer and template; count the result as the engine does (full render +
   encode with the real tokenizer); the fraction over T_c and the median excess.
2. Quick count error (compressor/hf_template.py): |quick − full encode| over every
   original chat and every compressed one, and how many `fit_request` calls needed a
   full encode to settle a count near the target (compressor/compress.py).
3. Speed: warm wall time of `fit_request` (what the gateway calls) per request,
   p50/p95/p99, for cl100k and Qwen3: "compress" = a borderline placement
   (may_compress), "count" = the exact count a request just under B_short gets
   (may_compress false: count, never change). `--speed-only` prints only this table
   (it runs on older checkouts too, for before/after figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compressor.compress import fit_request
from compressor.hf_template import HFTemplate
from tests.corpus import borderline_set
from tests.served_models import llama31_dir, qwen3_dir

B_SHORT = 8192


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def overflow(corpus: list[Any], models: dict[str, Path]) -> None:
    print(f"{len(corpus)} borderline chats, B_short {B_SHORT}")
    print("| served model | counted with | compressed | over T_c | median excess |")
    print("|---|---|---|---|---|")
    for name, folder in models.items():
        served = HFTemplate(folder)
        for label, template in (("cl100k", None), (name, served)):
            over: list[int] = []
            done = 0
            for s in corpus:
                target = B_SHORT - s.max_tokens
                r = fit_request(target, messages=s.messages, template=template)
                if r.fits and r.changed:
                    done += 1
                    excess = served.chat_tokens(r.messages or []) - target
                    if excess > 0:
                        over.append(excess)
            med = statistics.median(over) if over else 0
            print(f"| {name} | {label} | {done} | {len(over) / max(done, 1):.2f} | +{med:.0f} |")
    print()


def quick_error(corpus: list[Any], models: dict[str, Path]) -> None:
    print(
        "| served model | chats counted | max abs(quick − full) | fit_request calls | with a full encode |"
    )
    print("|---|---|---|---|---|")
    for name, folder in models.items():
        served = HFTemplate(folder)
        exact = served.chat_tokens
        encodes: list[int] = []
        served.chat_tokens = _counting(exact, encodes)  # type: ignore[method-assign]
        errors: list[int] = []
        full = 0
        for s in corpus:
            encodes.clear()
            r = fit_request(B_SHORT - s.max_tokens, messages=s.messages, template=served)
            full += bool(encodes)
            errors += [
                abs(served.quick_chat_tokens(m) - exact(m)) for m in (s.messages, r.messages)
            ]
        calls = len(corpus)
        print(f"| {name} | {len(errors)} | {max(errors)} | {calls} | {full} |")
    print()


def _counting(exact: Callable[..., int], calls: list[int]) -> Callable[..., int]:
    """`exact` that records each call in `calls`."""

    def wrapped(messages: Any, tools: Any = ()) -> int:
        calls.append(1)
        return exact(messages, tools)

    return wrapped


def speed(corpus: list[Any], repeat: int) -> None:
    qwen = HFTemplate(qwen3_dir())
    print(f"Warm fit_request wall ms, {len(corpus)} borderline chats × {repeat} passes")
    print("| tokenizer | path | p50 | p95 | p99 | mean |")
    print("|---|---|---|---|---|---|")
    for label, template in (("cl100k", None), ("hf: Qwen3", qwen)):
        for path, may in (("compress", True), ("count", False)):

            def call(s: Any, template: Any = template, may: bool = may) -> object:
                return fit_request(
                    B_SHORT - s.max_tokens, messages=s.messages, may_compress=may, template=template
                )

            ms = timed(corpus, call, repeat)
            print(
                f"| {label} | {path} | {pct(ms, 0.5):.2f} | {pct(ms, 0.95):.2f} | "
                f"{pct(ms, 0.99):.2f} | {statistics.fmean(ms):.2f} |"
            )
    print(f"(load average {os.getloadavg()[0]:.2f})")


def timed(corpus: list[Any], call: Callable[[Any], object], repeat: int) -> list[float]:
    for s in corpus:  # warm the memo
        call(s)
    out: list[float] = []
    for _ in range(repeat):
        for s in corpus:
            t0 = time.perf_counter()
            call(s)
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=150, help="borderline requests (chats are used)")
    ap.add_argument("--repeat", type=int, default=3, help="warm passes for the speed table")
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    corpus = [s for s in borderline_set(n=args.n, seed=11) if s.messages is not None]
    if not args.speed_only:
        models = {"qwen3": qwen3_dir(), "llama3.1": llama31_dir(Path(tempfile.mkdtemp()))}
        overflow(corpus, models)
        quick_error(corpus, models)
    speed(corpus, args.repeat)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
