"""Placement on the served model's tokens, live (issue 24's must-show).

    python bench/placement_live.py [--per-shape 6] [--models llama3.1,qwen3] [--seed 24]
        [--out rows.json] [--offline-only]

For each model, two emulators (short 8,192, long 65,536) count prompts with that model's
real tokenizer.json and chat template (`--tokenizer hf:…`, tests/served_models.py), behind
a freshly started (cold) gateway whose pools name no tokenizer (the default, `auto`). The
corpus is bench/shapes.py's borderline shapes plus Chinese and Japanese man pages
(CJK_SHAPES), built from text on the machine. Every request goes through the gateway with
the openai SDK, one at a time; the oracle is the engine's own usage.prompt_tokens.

Per shape it prints, over the requests in the band by the served model's exact count
(B_short < L_total ≤ γ·B_short):
- live p_c: the share the gateway served on the short pool (its own estimate, placement,
  learnt ĉ_k and counts, starting cold);
- compressor p_c: the share the compressor fits into T_c = B_short − max_tokens OFFLINE,
  with the same fit the gateway runs for that pool and no estimate or placement at all:
  with `tokenizer: auto` (the engine's `/tokenize`) that is gateway/tokenize.py's
  `fit_with_engine` — the local cl100k compressor at the engine's ratio, the result
  re-counted by the engine, up to ENGINE_ROUNDS compressions — with the engine's count
  made here by the model's own template and tokenizer.json (what the emulator counts
  with). Live minus this is what the gateway's placement loses (or gains) against the
  compressor: the issue's "within 0.03 per shape";
- one pass: `fit_request` once with the served template (the `hf:` fit: one compression
  and its exact verify), the compressor's p_c as measured before the loop was the
  reference; reported beside it, not compared;
- per shape, requests the short pool received over B_short in the engine's own count
  (must be 0) and engine-400 retries (x-fleetgate-retried; must be 0);
and over all requests how many the gateway counted because the estimate could not place
them (fleetgate_compress_uncertain_total).

Then, offline (no gateway): the count-when-uncertain path's cost, a count-only
`fit_request` (what the gateway runs on its thread) per model template, and the engine's
/tokenize round trip (what `auto` runs), p50/p99 ms; how often the interval asks for a
count on the corpus at ¼, 1 and 2× its size; and the Intake's time per short request
with and without the intervals (non-borderline traffic must not pay).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from compressor.compress import Compression, CompressorConfig, fit_request
from compressor.content import classify
from compressor.hf_template import HFTemplate
from compressor.script import script_of_prompt
from compressor.template import default_template
from gateway.tokenize import fit_with_engine
from policies.budget import BudgetConfig, BudgetEstimator, measure_chat
from policies.intake import CHAT, Intake, Prompt
from policies.pools import DEFAULT_COMPRESSIBLE, CompressAndRoute
from policies.types import PoolSpec
from policies.uncertainty import ByteBounds
from tests.procs import Procs
from tests.served_models import llama31_dir, qwen3_dir
from tests.shapes import CJK_SHAPES, SHAPES, shape_set

B_SHORT, GAMMA = 8192, 1.5
MODEL = "llama-test"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))] if s else float("nan")


class TemplateCounts:
    """The engine's count of a body, as the emulator makes it with `--tokenizer hf:`
    (emulator/chat_template.py): the model's template rendered, its tokenizer.json."""

    def __init__(self, template: HFTemplate) -> None:
        self.template = template

    async def count(
        self,
        model: str,
        *,
        messages: list[Any] | None = None,
        prompt: str | None = None,
        tools: list[Any] | None = None,
    ) -> int | None:
        t = self.template
        if messages is not None:
            return len(t.tokenizer.encode(t.render(messages, tools or ())))
        return len(t.tokenizer.encode_with_specials(prompt or ""))


def gateway_fit(template: HFTemplate, s: Any, may_compress: bool) -> Compression | None:
    """The fit gateway/fitting.py runs for a `tokenizer: auto` pool that answers
    `/tokenize` (`fit_with_engine`; compression and the local count with the default
    template, as `run(aim, True, False)` and `run(0, False, False)` call it there)."""
    local, config = default_template(), CompressorConfig()
    target = B_SHORT - s.max_tokens

    def run(aim: int, may: bool) -> Compression:
        return fit_request(
            aim, prompt=s.prompt, messages=s.messages, may_compress=may,
            likely_fits=False, template=local, config=config,
        )  # fmt: skip

    async def compress(aim: int) -> Compression:
        return run(aim, True)

    async def local_count() -> int:
        return run(0, False).tokens_before

    return asyncio.run(
        fit_with_engine(
            TemplateCounts(template), MODEL, target, may_compress, compress, local_count,
            messages=s.messages, prompt=s.prompt,
            compress_within=math.floor(GAMMA * B_SHORT) - s.max_tokens,
        )
    )  # fmt: skip


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def start(procs: Procs, folder: Path) -> tuple[str, str]:
    spec = f"hf:{folder}"
    common = ("--model", MODEL, "--time-scale", "0.02", "--tokenizer", spec)
    short = procs.emulator("short0", "--max-model-len", str(B_SHORT), *common)
    long = procs.emulator("long0", "--max-model-len", "65536", *common)
    for p in (short, long):
        p.wait_ready("/health")
    cfg = {
        "pools": {
            "short": {"max_model_len": B_SHORT, "models": [MODEL], "workers": [{"url": short.url}]},
            "long": {"max_model_len": 65536, "models": [MODEL], "workers": [{"url": long.url}]},
        },
        "listen": {"drain_delay_s": 0},
    }
    path = procs.dir / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gw = procs.fleetgate("gateway", "serve", "--config", str(path), "--port", "{port}")
    gw.wait_ready("/healthz")
    return gw.url, short.url


def live(model: str, folder: Path, corpus: list[Any]) -> dict[str, Any]:
    template = HFTemplate(folder)
    procs = Procs()
    try:
        url, short_url = start(procs, folder)
        info = httpx.get(url + "/metrics").text
        source = [ln for ln in info.splitlines() if ln.startswith("fleetgate_tokenizer_info{")]
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        rows = []
        for s in corpus:
            exact = (
                template.chat_tokens(s.messages)
                if s.messages is not None
                else template.completion_tokens(s.prompt)
            )
            if s.messages is not None:
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL, messages=s.messages, max_tokens=s.max_tokens
                )
            else:
                raw = client.completions.with_raw_response.create(
                    model=MODEL, prompt=s.prompt, max_tokens=s.max_tokens
                )
            usage = raw.parse().usage
            category = classify(prompt=s.prompt, messages=s.messages)
            target = B_SHORT - s.max_tokens
            may = category in DEFAULT_COMPRESSIBLE
            one_pass = fit_request(
                target, prompt=s.prompt, messages=s.messages, template=template,
                may_compress=may,
            ).fits  # fmt: skip
            looped = gateway_fit(template, s, may)
            rows.append(
                {
                    "shape": s.meta["shape"],
                    "total": exact + s.max_tokens,
                    "pool": raw.headers["x-fleetgate-pool"],
                    "compressed": "x-fleetgate-compressed" in raw.headers,
                    "retried": "x-fleetgate-retried" in raw.headers,
                    "over": raw.headers["x-fleetgate-pool"] == "short"
                    and usage.prompt_tokens + s.max_tokens > B_SHORT,
                    "own": bool(looped and looped.fits),
                    "one_pass": one_pass,
                    "category": category.value,
                }
            )
        after = httpx.get(url + "/metrics").text
        # the engine's /tokenize round trip, as `auto` asks it (the short pool's worker)
        trips = []
        with httpx.Client(base_url=short_url, timeout=30) as c:
            for s in corpus:
                body: dict[str, Any] = {"model": MODEL}
                if s.messages is not None:
                    body.update(messages=s.messages, add_generation_prompt=True)
                else:
                    body.update(prompt=s.prompt, add_special_tokens=True)
                t0 = time.perf_counter()
                c.post("/tokenize", json=body).raise_for_status()
                trips.append((time.perf_counter() - t0) * 1e3)
        return {
            "rows": rows,
            "source": source,
            "uncertain": metric(after, "fleetgate_compress_uncertain_total"),
            "tokenize_ok": sum(
                float(ln.rsplit(" ", 1)[1])
                for ln in after.splitlines()
                if ln.startswith("fleetgate_tokenize_requests_total") and 'result="ok"' in ln
            ),
            "trips": trips,
        }
    finally:
        procs.close()


def report(model: str, out: dict[str, Any]) -> list[dict[str, Any]]:
    """Prints the per-shape table; returns its rows."""
    rows = out["rows"]
    print(f"\n== {model}: {len(rows)} requests; {'; '.join(out['source'])}")
    head = ("shape", "band", "live p_c", "compressor p_c", "|Δ|", "one pass", "over", "400s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["shape"]].append(r)
    table = []
    for shape, rs in [*by.items(), ("all", rows)]:
        band = [r for r in rs if B_SHORT < r["total"] <= GAMMA * B_SHORT]
        line = {
            "model": model, "shape": shape, "band": len(band),
            "over": sum(r["over"] for r in rs), "retried": sum(r["retried"] for r in rs),
        }  # fmt: skip
        if band:
            line.update(
                live=sum(r["pool"] == "short" for r in band) / len(band),
                own=sum(r["own"] for r in band) / len(band),
                one_pass=sum(r["one_pass"] for r in band) / len(band),
            )
            cells = [f"{line['live']:.2f}", f"{line['own']:.2f}",
                     f"{abs(line['live'] - line['own']):.2f}", f"{line['one_pass']:.2f}"]  # fmt: skip
        else:
            cells = ["—"] * 4
        table.append(line)
        print(f"| {shape} | {len(band)} | " + " | ".join(cells)
              + f" | {line['over']} | {line['retried']} |")  # fmt: skip
    print(
        f"counted because uncertain: {out['uncertain']:.0f} of {len(rows)}; "
        f"/tokenize ok: {out['tokenize_ok']:.0f}"
    )
    t = out["trips"]
    print(f"/tokenize round trip (ms): p50 {pct(t, 0.5):.2f} p99 {pct(t, 0.99):.2f}")
    return table


def offline(corpus: list[Any], templates: dict[str, Any]) -> None:
    print("\n== offline")
    for name, template in templates.items():
        times = []
        for _ in range(2):  # the second pass is warm
            times = []
            for s in corpus:
                t0 = time.perf_counter()
                fit_request(
                    B_SHORT - s.max_tokens, prompt=s.prompt, messages=s.messages,
                    may_compress=False, likely_fits=True, template=template,
                )  # fmt: skip
                times.append((time.perf_counter() - t0) * 1e3)
        print(f"count-only fit_request, {name}, warm (ms): p50 {pct(times, 0.5):.2f} "
              f"p99 {pct(times, 0.99):.2f}")  # fmt: skip
    pools = [
        PoolSpec("short", B_SHORT, frozenset({"m"})),
        PoolSpec("long", 65536, frozenset({"m"})),
    ]

    def intake(bounds: bool) -> Intake:
        return Intake(
            CompressAndRoute("short", B_SHORT, GAMMA),
            BudgetEstimator(BudgetConfig()),
            lambda p: classify(prompt=p.prompt if isinstance(p.prompt, str) else None,
                               messages=p.messages),
            bounds=ByteBounds() if bounds else None,
            scripter=script_of_prompt if bounds else None,
        )  # fmt: skip

    for scale in (0.25, 1.0, 2.0):
        i = intake(True)
        n = counted = 0
        for s in corpus:
            if s.messages is None:
                continue
            msgs = [{**m, "content": _scaled(m.get("content"), scale)} for m in s.messages]
            text = "".join(str(m.get("content") or "") for m in msgs)
            p = Prompt(CHAT, "m", measure_chat(msgs), s.max_tokens, messages=msgs,
                       ascii=text.isascii())  # fmt: skip
            taken = i.take(p, "r", 0.0, pools)
            n += 1
            counted += bool(getattr(taken, "placement", None) and taken.placement.uncertain)
        print(f"interval asks for a count at {scale}x the corpus: {counted} of {n}")
    # the fast path: a 1 KB chat (every variant's ASCII floor), and 20 KB of prose, which
    # the logs' floor cannot place but prose's can (its script, a few µs, and no classifier)
    sentence = "What does the GPL say about linking? "
    for label, times in (("1 KB", 30), ("20 KB", 540)):
        chat = [{"role": "user", "content": sentence * times}]
        p = Prompt(CHAT, "m", measure_chat(chat), 256, messages=chat)
        for bounds in (False, True):
            i = intake(bounds)
            runs = []
            for _ in range(5):
                t0 = time.perf_counter_ns()
                for _ in range(20000):
                    i.take(p, "r", 0.0, pools)
                runs.append((time.perf_counter_ns() - t0) / 20000)
            print(f"Intake.take, a {label} chat, bounds {'on ' if bounds else 'off'}: "
                  f"{statistics.median(runs) / 1000:.2f} µs (median of 5 × 20,000)")  # fmt: skip


def _scaled(content: object, scale: float) -> object:
    if not isinstance(content, str) or len(content) < 2000 or scale == 1.0:
        return content
    return content[: int(len(content) * scale)] if scale < 1 else content * int(scale)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-shape", type=int, default=6)
    ap.add_argument("--models", default="llama3.1,qwen3")
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--offline-only", action="store_true")
    ap.add_argument("--out", help="write the per-shape rows and every request's row (JSON)")
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} at start; {os.cpu_count()} cores")
    corpus = shape_set(per_shape=args.per_shape, seed=args.seed, shapes=SHAPES + CJK_SHAPES)
    where = Path(tempfile.mkdtemp())
    folders = {"llama3.1": llama31_dir(where), "qwen3": qwen3_dir()}
    if not args.offline_only:
        saved: dict[str, Any] = {"table": [], "requests": {}}
        for model in args.models.split(","):
            out = live(model, folders[model], corpus)
            saved["table"] += report(model, out)
            saved["requests"][model] = out["rows"]
        if args.out:
            Path(args.out).write_text(json.dumps(saved, indent=1))
    offline(corpus, {m: HFTemplate(folders[m]) for m in args.models.split(",")})
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
