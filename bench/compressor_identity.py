"""The compressor's outputs on the bench corpora, saved or compared byte for byte: the check
that a speed change (bench/compressor_speed.py) changed no result.

    python bench/compressor_identity.py --save before.json      # on the old code
    python bench/compressor_identity.py --check before.json     # on the new code: exit 1 if any differs

Requests (saved with the outputs: the corpora read the installed distributions, which
change when packages are installed): tests/shapes.py's borderline set (lmsys and uniform lengths), tests/corpus.py's
borderline set, each at T_c = B_short − max_tokens and at three tighter targets (more
units dropped, trims, "does not fit"), with the default configuration and with
`protect_last_user`, and only counted (`may_compress` false), compressed cold (first sight of each text) and again warm with the
per-text cache emptied (the memo state must change no result); `--hf` adds Qwen3 and
Llama-3.1 (tests/served_models.py) on the chats. Per request it records `fits`, the
counts, units, units dropped, detail and a SHA-256 of the request sent (prompt or
messages as JSON). Prints the number of records and how many differ; exits 1 on any
difference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compressor.compress import Compression, CompressorConfig, default_analyzer, fit_request
from tests import corpus, shapes

B_SHORT = 8192
TIGHTER = (0, 600, 1500, 3000)  # tokens below T_c


def record(r: Compression) -> list[Any]:
    sent = r.prompt if r.messages is None else json.dumps(r.messages, sort_keys=True)
    digest = hashlib.sha256((sent or "").encode()).hexdigest()[:20]
    return [r.fits, r.tokens_before, r.tokens_after, r.units, r.units_dropped, r.detail, digest]


def corpora() -> dict[str, list[dict[str, Any]]]:
    """The requests: (prompt, messages, max_tokens) of each set's samples."""
    sets = {
        "shapes-lmsys": shapes.shape_set(12, seed=13, b_short=B_SHORT),
        "shapes-uniform": shapes.shape_set(6, seed=7, b_short=B_SHORT, lengths="uniform"),
        "borderline": corpus.borderline_set(60, seed=1, b_short=B_SHORT),
    }
    return {
        name: [
            {"prompt": s.prompt, "messages": s.messages, "max_tokens": s.max_tokens}
            for s in samples
        ]
        for name, samples in sets.items()
    }


def outputs(sets: dict[str, list[dict[str, Any]]], hf: bool) -> dict[str, list[Any]]:
    configs = {"default": None, "protect": CompressorConfig(protect_last_user=True)}
    out: dict[str, list[Any]] = {}
    analyzer = default_analyzer()
    for phase in ("cold", "warm"):
        for set_name, samples in sets.items():
            for i, s in enumerate(samples):
                for cname, config in configs.items():
                    for less in TIGHTER:
                        if phase == "warm":
                            analyzer.forget_texts()
                        target = B_SHORT - s["max_tokens"] - less
                        r = fit_request(
                            target, prompt=s["prompt"], messages=s["messages"], config=config
                        )
                        out[f"{phase}/{set_name}/{i}/{cname}/{less}"] = record(r)
                        if less == 0 and cname == "default":  # count only
                            r = fit_request(
                                target, prompt=s["prompt"], messages=s["messages"],
                                may_compress=False,
                            )  # fmt: skip
                            out[f"{phase}/{set_name}/{i}/count"] = record(r)
    if hf:
        from compressor.hf_template import HFTemplate
        from tests.served_models import llama31_dir, qwen3_dir

        with tempfile.TemporaryDirectory() as tmp:
            models = {"qwen3": qwen3_dir(), "llama3.1": llama31_dir(Path(tmp))}
            chats = [s for s in sets["shapes-lmsys"] if s["messages"] is not None][:40]
            for name, folder in models.items():
                template = HFTemplate(folder)
                for i, s in enumerate(chats):
                    for less in (0, 1500):
                        target = B_SHORT - s["max_tokens"] - less
                        r = fit_request(target, messages=s["messages"], template=template)
                        out[f"hf/{name}/{i}/{less}"] = record(r)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--save", type=Path)
    group.add_argument("--check", type=Path)
    ap.add_argument("--hf", action="store_true", help="also Qwen3 and Llama-3.1 templates")
    args = ap.parse_args(argv)
    if args.save:
        sets = corpora()
        got = outputs(sets, args.hf)
        args.save.write_text(json.dumps({"inputs": sets, "outputs": got}))
        print(f"saved {len(got)} records to {args.save}")
        return 0
    saved = json.loads(args.check.read_text())
    want = saved["outputs"]
    got = outputs(saved["inputs"], args.hf)
    differ = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    for k in differ[:20]:
        print(f"differs: {k}: {want.get(k)} → {got.get(k)}")
    print(f"{len(got)} records, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
