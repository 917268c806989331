"""The compressor's speed before and after a change, measured in one run, interleaved.

    python bench/compressor_ab.py [--base REV] [--per-shape 20] [--repeat 3] [--cpu 0]

On a shared machine two runs minutes apart differ by more than most changes do, so this
runs both in one process: `--base` (a git revision, default HEAD) is exported with
`git archive` into a temporary folder and its `compressor/` imported as `compressor_base`
beside the working tree's `compressor/`; every request of tests/shapes.py's borderline
set (B_short = 8192, T_c = B_short − max_tokens, `fit_request` as the gateway calls it)
is then compressed by both, alternating which goes first, each with its own process-wide
memo. CPU time of the calling thread (`time.thread_time`), ms. Passes, per request:

- cold: the first sight of each request (new words: tiktoken encodes them); then one
  unmeasured pass of every kind of call;
- warm: the per-text cache emptied first (words known, text new: the goal's case), split
  by outcome — compressed, or not (`detail`: "nothing editable" is known before any
  analysis, only counted; "nothing to shorten" and "the units kept whole exceed the
  target" after it) — and by shape;
- repeat: right after the warm call (texts cached: a chat resending its history);
- count only: `may_compress` false (the exact count a request just under B_short gets).

`--hf qwen3` (or `llama3.1`) counts with that served model's tokenizer and chat template
(tests/served_models.py; chats only); `--less 6000` aims far under T_c, so most requests
cannot fit (the cost of that answer). Also prints how many results differ between the two (they should not: a speed change
keeps outputs byte-identical, bench/compressor_identity.py checks it on more requests).
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compressor import compress as new_compress
from tests import shapes

ROOT = Path(__file__).resolve().parents[1]
B_SHORT = 8192


def export_base(rev: str, into: Path) -> ModuleType:
    """`rev`'s compressor/ as the package `compressor_base` (imports renamed)."""
    blob = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "compressor"], check=True, capture_output=True
    ).stdout
    pkg = into / "compressor_base"
    pkg.mkdir()
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(".py"):
                source = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
                source = re.sub(r"\bcompressor\.", "compressor_base.", source)
                (pkg / Path(member.name).name).write_text(source)
    sys.path.insert(0, str(into))
    import compressor_base.compress as base_compress

    return base_compress


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def outcome(r: Any, texts_editable: bool) -> str:
    if r.changed:
        return "compressed"
    if not texts_editable:
        return "not compressed: nothing editable (count only)"
    return f"not compressed: {r.detail or 'fits as given'}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD", help="git revision to compare with")
    ap.add_argument("--per-shape", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="warm passes")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    ap.add_argument(
        "--hf", choices=("qwen3", "llama3.1"), default=None,
        help="count with that served model's tokenizer and template (chats only)",
    )  # fmt: skip
    ap.add_argument(
        "--less", type=int, default=0,
        help="aim this many tokens under T_c (large: requests that cannot fit)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    samples = shapes.shape_set(args.per_shape, seed=args.seed, b_short=B_SHORT)
    if args.hf:
        samples = [s for s in samples if s.messages is not None]
    with tempfile.TemporaryDirectory() as tmp:
        base = export_base(args.base, Path(tmp))
        mods = {"base": base, "new": new_compress}
        templates: dict[str, Any] = {"base": None, "new": None}
        if args.hf:
            from tests.served_models import llama31_dir, qwen3_dir

            folder = qwen3_dir() if args.hf == "qwen3" else llama31_dir(Path(tmp))
            for k, pkg in (("base", "compressor_base"), ("new", "compressor")):
                hf = importlib.import_module(f"{pkg}.hf_template")
                templates[k] = hf.HFTemplate(folder)
        times: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
        differ = 0

        def call(k: str, s: Any, may: bool = True) -> tuple[float, Any]:
            t0 = time.thread_time()
            r = mods[k].fit_request(
                B_SHORT - s.max_tokens - args.less, prompt=s.prompt, messages=s.messages,
                may_compress=may, template=templates[k],
            )  # fmt: skip
            return (time.thread_time() - t0) * 1e3, r

        def analyzer_of(k: str) -> Any:
            if templates[k] is None:
                return mods[k].default_analyzer()
            return mods[k].analyzer_for(templates[k])

        def add(k: str, name: str, ms: float) -> None:
            times[k].setdefault(name, []).append(ms)

        analyses: dict[int, bool] = {}
        for i, s in enumerate(samples):
            got = {}
            for k in ("base", "new") if i % 2 == 0 else ("new", "base"):
                ms, got[k] = call(k, s)
                add(k, "cold", ms)
            a, b = got["base"], got["new"]
            same = (a.prompt, a.messages, a.tokens_before, a.tokens_after, a.units, a.detail)
            differ += same != (b.prompt, b.messages, b.tokens_before, b.tokens_after, b.units, b.detail)  # fmt: skip
            analyses[i] = b.units > 0  # 0 units: no analysis ran (nothing editable)
        for s in samples:  # unmeasured: each counter's memo meets the texts as a whole too
            for k in ("base", "new"):
                analyzer_of(k).forget_texts()
                call(k, s)
                call(k, s, may=False)
        for rep in range(args.repeat):
            for i, s in enumerate(samples):
                for k in ("base", "new") if (i + rep) % 2 == 0 else ("new", "base"):
                    analyzer = analyzer_of(k)
                    analyzer.forget_texts()
                    ms, r = call(k, s)
                    add(k, "warm (text new)", ms)
                    add(k, f"warm, {outcome(r, analyses[i])}", ms)
                    add(k, f"warm, {s.meta.get('shape')}", ms)
                    ms, _ = call(k, s)
                    add(k, "repeat (texts cached)", ms)
                    analyzer.forget_texts()
                    ms, _ = call(k, s, may=False)
                    add(k, "count only (may_compress false)", ms)
    print(
        f"# {len(samples)} borderline requests (tests/shapes.py), base {args.base} vs working "
        f"tree, counted with {args.hf or 'cl100k'}; results differ: {differ}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print("# CPU ms per request (thread time), one core")
    print()
    print("| pass | base p50 | p95 | p99 | new p50 | p95 | p99 | n |")
    print("|---|---|---|---|---|---|---|---|")
    names = sorted(times["new"], key=lambda n: (not n.startswith(("cold", "warm (")), n))
    for name in names:
        o, n = times["base"][name], times["new"][name]
        print(
            f"| {name} | {pct(o, 0.5):.2f} | {pct(o, 0.95):.2f} | {pct(o, 0.99):.2f} | "
            f"{pct(n, 0.5):.2f} | {pct(n, 0.95):.2f} | {pct(n, 0.99):.2f} | {len(n)} |"
        )
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
