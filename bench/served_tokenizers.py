"""How often compressed requests overflow B_short on a non-cl100k engine, and after the fix.

    python bench/served_tokenizers.py [n]

For each borderline chat of bench/corpus.py, compress to T_c = B_short − max_tokens
counting (a) with cl100k (the default) and (b) with the served model's tokenizer and
template, then count the result as the engine does (full render + encode with the real
tokenizer) and report the fraction over T_c and the median excess. Models: Qwen3 and
Llama-3 with Llama-3.1's template (tests/served_models.py).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.corpus import borderline_set
from compressor.compress import fit_request
from compressor.hf_template import HFTemplate
from tests.served_models import llama31_dir, qwen3_dir


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 150
    corpus = [s for s in borderline_set(n=n, seed=11) if s.messages is not None]
    models = {"qwen3": qwen3_dir(), "llama3.1": llama31_dir(Path(tempfile.mkdtemp()))}
    print(f"{len(corpus)} borderline chats, B_short 8192")
    print("| served model | counted with | compressed | over T_c | median excess |")
    print("|---|---|---|---|---|")
    for name, folder in models.items():
        served = HFTemplate(folder)
        for label, template in (("cl100k", None), (name, served)):
            over: list[int] = []
            done = 0
            for s in corpus:
                target = 8192 - s.max_tokens
                r = fit_request(target, messages=s.messages, template=template)
                if r.fits and r.changed:
                    done += 1
                    excess = served.chat_tokens(r.messages or []) - target
                    if excess > 0:
                        over.append(excess)
            med = statistics.median(over) if over else 0
            print(f"| {name} | {label} | {done} | {len(over) / max(done, 1):.2f} | +{med:.0f} |")


if __name__ == "__main__":
    main()
