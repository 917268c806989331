"""The bytes-per-token intervals that policies/uncertainty.py starts from (issue 24).

    python bench/byte_bounds.py [--per-shape 60]

Content bytes per token of whole requests (the texts a template renders, over their
tokens without the template's) on the shapes corpus (bench/shapes.py, with the Chinese
and Japanese documents) under cl100k, Llama-3.1 and Qwen3 (tests/served_models.py: the
real tokenizer.json files), keyed as the gateway keys them: the classifier's category
(compressor/content.py) and the script (compressor/script.py). Prints min / p50 / max
per key and tokenizer, and the interval over all three tokenizers; the priors in
policies/uncertainty.py are those widened by 10 % each way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compressor.content import classify
from compressor.counting import default_counter
from compressor.script import script_of
from compressor.template import call_json, content_text, tool_calls
from tests.served_models import llama31_dir, qwen3_dir
from tests.shapes import CJK_SHAPES, SHAPES, shape_set


def texts_of(sample: object) -> list[str]:
    msgs = getattr(sample, "messages", None)
    if msgs is None:
        return [getattr(sample, "prompt", "") or ""]
    out = [content_text(m.get("content")) for m in msgs]
    out += [call_json(c) for m in msgs for c in tool_calls(m)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-shape", type=int, default=60)
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    where = Path(tempfile.mkdtemp())
    hf = {
        "llama3.1": Tokenizer.from_file(str(llama31_dir(where) / "tokenizer.json")),
        "qwen3": Tokenizer.from_file(str(qwen3_dir() / "tokenizer.json")),
    }
    cl = default_counter()

    def hf_count(tok: Tokenizer) -> Callable[[str], int]:
        return lambda s: len(tok.encode(s, add_special_tokens=False).ids)

    counters = {"cl100k": cl.count} | {n: hf_count(t) for n, t in hf.items()}
    corpus = shape_set(per_shape=args.per_shape, shapes=SHAPES + CJK_SHAPES)
    ratios: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in corpus:
        texts = [t for t in texts_of(s) if t]
        key = (
            classify(prompt=s.prompt, messages=s.messages).value,
            script_of(texts, all(t.isascii() for t in texts)).value,
        )
        n_bytes = sum(len(t.encode()) for t in texts)
        for name, count in counters.items():
            ratios[key][name].append(n_bytes / sum(count(t) for t in texts))
    print(f"{len(corpus)} requests; content bytes per token: min / p50 / max")
    for key in sorted(ratios):
        row = ratios[key]
        cells = []
        for name in counters:
            v = sorted(row[name])
            cells.append(f"{name} {v[0]:.2f}/{v[len(v) // 2]:.2f}/{v[-1]:.2f}")
        lo = min(min(v) for v in row.values())
        hi = max(max(v) for v in row.values())
        n = len(row["cl100k"])
        print(f"{key[0]:>6}/{key[1]:<7} n={n:<4} {'  '.join(cells)}  all [{lo:.2f}, {hi:.2f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
