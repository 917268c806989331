"""QUARTZ against its baselines LIVE (issue 15; the QUARTZ paper, §5): gateway + emulators,
time-scaled, the predictor trained from the gateway's own request log of a warm-up run.

    python bench/quartz_live.py --out out/quartz-live                 # ~9 min wall
    python bench/quartz_live.py --reps 1 --methods FIFO-LL,QUARTZ     # a quick look

The simulator protocol (bench/quartz_experiments.py) made small enough to run on loopback:

- engines: `fleetgate emulate` processes (default 2) with the emulator's engine model
  (W 8 ms, H 0.65 ms, 512-token chunked prefill, prefix caching on) and a smaller batch
  (`--max-num-seqs`, default 16) so that a few hundred requests reach the saturation knee;
  `--time-scale S`: an engine second takes S wall seconds. Every number printed is in
  experiment (engine) seconds: wall ÷ S.
- the trace: simulator/scenarios/quartz-mixed.yaml's Mixed workload (Chat 70 % + RAG 30 %,
  simulator/families.py's length families, Poisson arrivals), seeded and identical for
  every method, open-loop, bounded in count (`--requests`) and time (`--drain` experiment
  seconds after the last arrival, then what is left is cut and counted as violated). The
  same three additions as the simulator protocol: prefix reuse (a request reuses one of 16
  shared prefixes of its class with probability 0.6, Zipf(1.1) popularity: a chat's system
  prompt of 128–512 tokens, a RAG answer's popular passages of 1,024–3,072), clients by
  application (12 chat clients, 4 RAG clients), max_tokens = the output length. Outputs
  are × `--output-scale` (default 0.25): every output token is an SSE event through the
  gateway and the load generator, and at full length two emulators at the knee emit more
  than a shared 2-core machine relays in time; shorter answers keep the slot turnover —
  and so the knee — within a few hundred requests.
- prompts are real text of the drawn length (tokens as the emulator counts them, cl100k):
  a shared prefix is the same text in every request that uses it (so both the engine's
  prefix cache and the gateway's 512-byte-block prefix index see it), the rest is unique.
- one gateway process per method (restarted, engines restarted too: every method starts
  with cold prefix caches), `pools.short.max_num_seqs` = the engine's (capacity: engine)
  and `dispatch.prefill_room` 4,096 for EVERY method (the simulator protocol's DISPATCH),
  so requests wait in the gateway and its order matters; QUARTZ's analytic engine model
  is given the scaled W and H (its predictions are wall seconds, as its observations).
- per-class TTFT SLOs 2 s (chat, interactive) / 4 s (RAG, long) in experiment seconds.
- warm-up: the gateway with QUARTZ (analytic model) and its request log, the Mixed load at
  a different seed; then `fleetgate train-predictor LOG -o model.json` as a subprocess (its
  holdout report is printed), and PointPred and QUARTZ run with `quartz.model:` that file.

Per method and repetition: P99 TTFT overall and per class, SLO violation rate (no first
token counts as violated), Jain's index over clients of 1 / mean TTFT slowdown (TTFT over
the unloaded (⌈L/512⌉ + 1)·(W + H)), max wait (TTFT minus that unloaded TTFT), from the
gateway's /metrics at the end the QUARTZ model in use, coverage, fallback and the queue
length, and the run's wall time and the processes' CPU seconds. Nothing asserts here:
tests/e2e/test_quartz_live.py runs a very small version end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from simulator.families import mix64
from simulator.run import build_workload
from simulator.scenario import parse, resolve
from tests.experiments.token_pools_live import cpu_seconds, parse_metrics
from tests.procs import ROOT, Proc, Procs, env, procs

MODEL = "llama-test"
W, H, CHUNK = 0.008, 0.00065, 512  # the emulator's engine model (emulator/engine.py)
SLO = {"interactive": 2.0, "long": 4.0}  # experiment seconds (QUARTZ §5.2)
PREFILL_ROOM = 4096  # bench/quartz_experiments.py's DISPATCH, every method alike
FIRST_CONTENT = re.compile(rb'"content":"[^"]')  # a chunk with text (not the role's)


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    routing: str
    dispatch: str = "fifo"
    dispatch_params: dict[str, Any] = field(default_factory=dict)
    trained: bool = False  # uses the warm-up's model file
    # no gateway queue: no max_num_seqs and no prefill room, so each request goes to the
    # least-loaded engine on arrival and waits in its queue (the paper's FIFO-LL, SGLang's
    # router; bench/quartz_experiments.py FORWARD_LL)
    forward: bool = False


METHODS = {
    m.name: m
    for m in (
        Method("FIFO-LL", "least_loaded"),
        Method("FIFO-P2C", "power_of_two"),
        Method("Locality-aware", "locality"),
        Method("TokenFair", "least_loaded", "token_fair"),
        Method("PointPred", "point_pred", "quartz", {"point": True}, trained=True),
        Method("QUARTZ", "quartz", "quartz", trained=True),
        Method("FIFO-LL (forward on arrival)", "least_loaded", forward=True),
        # the wait bound θ in experiment seconds (scaled to wall seconds in the config);
        # the gateway gives every request one SLO class, so θ is absolute here
        Method("QUARTZ θ=2.5 s", "quartz", "quartz", {"wait_bound_s": 2.5}, trained=True),
        Method(
            "QUARTZ θ=2.5 s λ=1",
            "quartz",
            "quartz",
            {"wait_bound_s": 2.5, "lam": 1.0},
            trained=True,
        ),
        # ablations (Table 5), not in the default run
        Method("Routing-only", "quartz", "fifo", trained=True),
        Method("Queueing-only", "least_loaded", "quartz", trained=True),
    )
}
DEFAULT_METHODS = ("FIFO-LL", "FIFO-P2C", "Locality-aware", "TokenFair", "PointPred", "QUARTZ")


@dataclass(frozen=True, slots=True)
class Setup:
    workers: int = 2
    max_num_seqs: int = 16
    # wall seconds per engine second: 2.0 (slower than real time) because at 0.5 a shared,
    # loaded 2-core machine's scheduling delays ate the engines' capacity (docs/QUARTZ_PAPER.md)
    scale: float = 2.0
    output_scale: float = 0.25
    rate: float = 26.0  # requests per experiment second: FIFO-LL's P99 TTFT ≈ 2–4 s here
    requests: int = 400
    drain: float = 30.0  # experiment seconds after the last arrival
    # the gateway's max_num_seqs above the engine's: each engine may queue this many, so
    # its own scheduler refills a freed slot at the next step instead of after a round
    # trip through the gateway (docs/QUARTZ_PAPER.md, Live: late binding's refill)
    gateway_slack: int = 0
    # loop25 (issue 25): > 0 — closed-loop load instead of the open-loop trace: this many
    # clients (simulator/closed_loop.py, the simulator's definition), no think time, each
    # sending its next request when its previous one is answered; `requests` caps the run
    clients: int = 0


# --- the trace ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Req:
    i: int
    arrival: float  # experiment seconds
    slo_class: str  # interactive (chat) / long (RAG)
    client: str
    prompt_tokens: int
    max_tokens: int
    text: str


def filler(tokens: int) -> str:
    return " a" * max(0, tokens)  # one cl100k token each


def prefix_text(template: int, tokens: int) -> str:
    """A shared prefix: the same text wherever it is used (its first words name it)."""
    head = f"Context {template}:"
    return head + filler(tokens - 4)


def trace(setup: Setup, seed: int, overhead: int) -> list[Req]:
    """quartz-mixed's Mixed workload at `setup.rate`, seeded, with the simulator protocol's
    prefix reuse and clients by application (module docstring); prompts as text."""
    doc = yaml.safe_load(resolve("quartz-mixed").read_text())
    doc["workload"]["arrivals"] = {"kind": "poisson", "rate": setup.rate}
    doc["workload"]["requests"] = setup.requests
    specs = build_workload(parse(doc, "quartz-live"), seed, setup.requests)
    rng = random.Random(f"{seed}:quartz-live")
    zipf = [1.0 / (k + 1) ** 1.1 for k in range(16)]
    out = []
    for i, s in enumerate(specs):
        rag = s.slo_class == "long"
        client = f"rag-{rng.randrange(4)}" if rag else f"chat-{rng.randrange(12):02d}"
        body = max(8, s.prompt_tokens - overhead)
        text = ""
        if rng.random() < 0.6:
            group = rng.choices(range(16), zipf)[0]
            template = (2 if rag else 1) * 1_000_003 + group
            lo, hi = (1024, 3072) if rag else (128, 512)
            shared = min(random.Random(mix64(template)).randint(lo, hi), body - 8)
            text = prefix_text(template, shared)
            body -= shared
        text += f" Request {seed}-{i}." + filler(body - 6)
        output = max(1, round(s.output_tokens * setup.output_scale))
        out.append(Req(i, s.arrival, s.slo_class, client, s.prompt_tokens, output, text))
    return out


# --- processes ----------------------------------------------------------------------------
def start_engines(ps: Procs, setup: Setup) -> list[Proc]:
    engines = [
        ps.emulator(
            f"w{i}", "--model", MODEL, "--max-model-len", "8192",
            "--max-num-seqs", str(setup.max_num_seqs), "--time-scale", str(setup.scale),
            "--max-lag", str(max(0.05, 0.2 * setup.scale)),
        )
        for i in range(setup.workers)
    ]  # fmt: skip
    for e in engines:
        e.wait_ready("/health")
    return engines


def gateway_config(
    setup: Setup,
    engines: list[Proc],
    method: Method | None,
    model: Path | None = None,
    log: Path | None = None,
) -> dict[str, Any]:
    """`method` None: the warm-up (QUARTZ, analytic model, request log on)."""
    routing, dispatch, params = ("quartz", "quartz", {}) if method is None else (
        method.routing, method.dispatch, dict(method.dispatch_params))  # fmt: skip
    if "wait_bound_s" in params:  # experiment seconds → the gateway's wall seconds
        params["wait_bound_s"] = params["wait_bound_s"] * setup.scale
    forward = method is not None and method.forward
    cfg: dict[str, Any] = {
        "pools": {
            "short": {
                "max_model_len": 8192,
                "models": [MODEL],
                "max_num_seqs": setup.max_num_seqs + setup.gateway_slack,
                "workers": [{"url": e.url, "name": e.name} for e in engines],
            }
        },
        "routing": {"policy": routing},
        "dispatch": {"policy": dispatch, "params": params, "prefill_room": PREFILL_ROOM,
                     "max_waiting": 4096, "timeout_s": 600.0},
        "telemetry": {"scrape_interval_s": 0.1, "stale_after_s": 2.0},
        "health": {"interval_s": 0.5, "timeout_s": 2.0, "unhealthy_after": 3},
        "upstream": {"connect_timeout_s": 2.0, "first_byte_timeout_s": 600.0,
                     "idle_timeout_s": 120.0},
        "listen": {"drain_delay_s": 0.0, "graceful_shutdown_s": 2.0},
    }  # fmt: skip
    if forward:
        del cfg["pools"]["short"]["max_num_seqs"], cfg["dispatch"]["prefill_room"]
    if method is None or method.trained or routing in ("quartz", "point_pred"):
        quartz: dict[str, Any] = {
            "engine_w": W * setup.scale,  # predictions in wall seconds, as observed
            "engine_h": H * setup.scale,
            "mean_output_tokens": 256.0 * setup.output_scale,
        }
        if model is not None:
            quartz["model"] = str(model)
        cfg["quartz"] = quartz
    if log is not None:
        cfg["request_log"] = {"path": str(log)}
    return cfg


def start_gateway(ps: Procs, cfg: dict[str, Any], name: str) -> Proc:
    path = ps.dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return ps.fleetgate(name, "serve", "--config", str(path), "--port", "{port}").wait_ready(
        "/healthz"
    )


def measure_overhead(engine: str) -> int:
    """Tokens the chat template adds around the content (the engine's own count)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": filler(64)}],
            "max_tokens": 1}  # fmt: skip
    usage = httpx.post(engine + "/v1/chat/completions", json=body, timeout=30).json()["usage"]
    return int(usage["prompt_tokens"]) - 64


# --- the load generator -------------------------------------------------------------------
@dataclass
class Outcome:
    req: Req
    ttft: float | None = None  # experiment seconds
    status: str = "cut"


async def drive(url: str, reqs: list[Req], setup: Setup) -> list[Outcome]:
    """Open-loop: every request at its arrival time; streamed; TTFT at the first content."""
    loop = asyncio.get_running_loop()
    outcomes = [Outcome(r) for r in reqs]
    stop = max(r.arrival for r in reqs) + setup.drain

    async def one(client: httpx.AsyncClient, o: Outcome) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": o.req.text}],
                "max_tokens": o.req.max_tokens, "ignore_eos": True, "stream": True,
                "user": o.req.client}  # fmt: skip
        sent = loop.time()
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                o.status = f"http_{r.status_code}"
                await r.aread()
                return
            tail = b""
            async for raw in r.aiter_raw():
                if o.ttft is None:
                    tail = (tail + raw)[-4096:]
                    if FIRST_CONTENT.search(tail):
                        o.ttft = (loop.time() - sent) / setup.scale
                else:
                    tail = (tail + raw)[-64:]
            o.status = "ok" if tail.rstrip().endswith(b"[DONE]") else "incomplete"

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(stop * setup.scale + 60, connect=10.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:
        t0 = loop.time() + 0.2
        tasks = []
        for o in outcomes:
            await asyncio.sleep(max(0.0, t0 + o.req.arrival * setup.scale - loop.time()))
            tasks.append(asyncio.create_task(one(client, o)))
        deadline = t0 + stop * setup.scale
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()))
        for t in pending:  # bounded in time: what is left is cut
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return outcomes


async def drive_closed(url: str, reqs: list[Req], setup: Setup) -> list[Outcome]:
    """Closed-loop (issue 25): `setup.clients` clients, by application, each with its own
    sequence dealt from the trace (simulator/closed_loop.py `deal`, the same definition the
    simulator runs), its next request sent when the previous one is answered."""
    from simulator.closed_loop import ClosedLoop, LoadShape, deal
    from simulator.closed_loop import drive as drive_loop
    from simulator.workloads import RequestSpec

    by_id = {str(r.i): r for r in reqs}
    specs = [RequestSpec(str(r.i), 0.0, r.prompt_tokens, r.max_tokens, r.max_tokens,
                         slo_class=r.slo_class) for r in reqs]  # fmt: skip
    seqs = deal(specs, setup.clients, names={"interactive": "chat", "long": "rag"})
    shape = LoadShape(setup.clients, ramp_s=2.0, hold_s=setup.drain * 4, requests=setup.requests)
    loop = asyncio.get_running_loop()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(setup.drain * setup.scale + 60, connect=10.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def send(spec: RequestSpec) -> Outcome:
            req = dataclasses.replace(by_id[spec.id], client=spec.client, arrival=spec.arrival)
            o = Outcome(req)
            body = {"model": MODEL, "messages": [{"role": "user", "content": req.text}],
                    "max_tokens": req.max_tokens, "ignore_eos": True, "stream": True,
                    "user": req.client}  # fmt: skip
            sent = loop.time()
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        o.status = f"http_{r.status_code}"
                        await r.aread()
                        return o
                    tail = b""
                    async for raw in r.aiter_raw():
                        if o.ttft is None:
                            tail = (tail + raw)[-4096:]
                            if FIRST_CONTENT.search(tail):
                                o.ttft = (loop.time() - sent) / setup.scale
                        else:
                            tail = (tail + raw)[-64:]
                    o.status = "ok" if tail.rstrip().endswith(b"[DONE]") else "incomplete"
            except httpx.HTTPError as e:  # an answer all the same: the client goes on
                o.status = type(e).__name__
            return o

        answers = await drive_loop(ClosedLoop(shape, seqs), send, lambda: loop.time() / setup.scale)
    return [o for _, o in answers]


# --- the numbers --------------------------------------------------------------------------
def p99(xs: list[float]) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(0.99 * len(xs)) - 1)]


def unloaded_ttft(prompt_tokens: int) -> float:
    return (math.ceil(prompt_tokens / CHUNK) + 1) * (W + H)


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if xs else float("nan")


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    got = [o for o in outcomes if o.ttft is not None]
    ttft = [o.ttft for o in got if o.ttft is not None]
    per_class = {
        c: [o.ttft for o in got if o.req.slo_class == c and o.ttft is not None] for c in SLO
    }
    violated = sum(1 for o in outcomes if o.ttft is None or o.ttft > SLO[o.req.slo_class])
    slow: dict[str, list[float]] = defaultdict(list)
    for o in got:
        assert o.ttft is not None
        slow[o.req.client].append(o.ttft / unloaded_ttft(o.req.prompt_tokens))
    waits = [o.ttft - unloaded_ttft(o.req.prompt_tokens) for o in got if o.ttft is not None]
    return {
        "requests": len(outcomes),
        "answered": sum(1 for o in outcomes if o.status == "ok"),
        "p99": p99(ttft),
        "p99_chat": p99(per_class["interactive"]),
        "p99_rag": p99(per_class["long"]),
        "violation": violated / max(1, len(outcomes)),
        "violation_chat": sum(
            1 for o in outcomes if o.req.slo_class == "interactive"
            and (o.ttft is None or o.ttft > SLO["interactive"])
        ) / max(1, sum(1 for o in outcomes if o.req.slo_class == "interactive")),
        "violation_rag": sum(
            1 for o in outcomes if o.req.slo_class == "long"
            and (o.ttft is None or o.ttft > SLO["long"])
        ) / max(1, sum(1 for o in outcomes if o.req.slo_class == "long")),
        "jain": jain([1.0 / statistics.fmean(v) for _, v in sorted(slow.items())]),
        "max_wait": max(waits, default=float("nan")),
    }  # fmt: skip


def quartz_gauges(text: str) -> dict[str, Any]:
    """The gateway's QUARTZ gauges at the end of a run."""
    out: dict[str, Any] = {"model": None}
    for name, labels, v in parse_metrics(text):
        if name == "fleetgate_quartz_model" and v == 1.0:
            out["model"] = labels.get("model")
        elif name in ("fleetgate_quartz_coverage", "fleetgate_quartz_fallback",
                      "fleetgate_quartz_queue_length", "fleetgate_quartz_observations_total"):  # fmt: skip
            out[name.removeprefix("fleetgate_quartz_")] = v
    return out


# --- runs ---------------------------------------------------------------------------------
def run_one(
    setup: Setup,
    method: Method | None,
    seed: int,
    model: Path | None = None,
    log: Path | None = None,
    records: Path | None = None,
) -> dict[str, Any]:
    """Fresh engines and gateway; the seeded trace; the numbers. `method` None: warm-up."""
    with procs() as ps:
        engines = start_engines(ps, setup)
        overhead = measure_overhead(engines[0].url)
        # the probe is in engine 0's prefix cache: harmless (no trace prompt starts with it)
        # closed loop (loop25): a larger draw, so that no client runs out before the cap
        drawn = dataclasses.replace(setup, requests=3 * setup.requests) if setup.clients else setup
        reqs = trace(drawn, seed, overhead)
        cfg = gateway_config(setup, engines, method, model, log)
        gw = start_gateway(ps, cfg, "gateway")
        everyone = [gw, *engines]
        cpu0 = {p.name: cpu_seconds(p) for p in everyone}
        started = time.monotonic()
        try:
            run = drive_closed if setup.clients > 0 else drive  # loop25: --clients
            outcomes = asyncio.run(run(gw.url, reqs, setup))
        except BaseException:
            print(gw.output()[-4000:], file=sys.stderr)
            raise
        wall = time.monotonic() - started
        time.sleep(0.3)
        gauges = quartz_gauges(httpx.get(gw.url + "/metrics", timeout=10).text)
        cpu = {p.name: round(cpu_seconds(p) - cpu0[p.name], 1) for p in everyone}
    if records is not None:  # one line per request, for a look beyond the table
        with records.open("w") as f:
            for o in outcomes:
                f.write(json.dumps({"i": o.req.i, "arrival": o.req.arrival,
                                    "class": o.req.slo_class, "client": o.req.client,
                                    "prompt_tokens": o.req.prompt_tokens,
                                    "max_tokens": o.req.max_tokens, "ttft": o.ttft,
                                    "status": o.status}) + "\n")  # fmt: skip
    result = summarize(outcomes)
    result.update(
        method="warm-up" if method is None else method.name,
        seed=seed,
        wall_s=round(wall, 1),
        cpu_s=cpu,
        quartz=gauges,
    )
    return result


def train(log: Path, out: Path, setup: Setup) -> dict[str, Any]:
    """`fleetgate train-predictor` on the warm-up's request log, as an operator runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "fleetgate", "train-predictor", str(log), "-o", str(out),
         "--engine-w", str(W * setup.scale), "--engine-h", str(H * setup.scale),
         "--max-num-seqs", str(setup.max_num_seqs), "--json"],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"train-predictor failed: {proc.stderr}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


COLUMNS = (
    ("p99", "P99 TTFT s", "{:.2f}"),
    ("p99_chat", "P99 chat", "{:.2f}"),
    ("p99_rag", "P99 RAG", "{:.2f}"),
    ("violation", "viol %", "{:.1%}"),
    ("violation_chat", "viol chat", "{:.1%}"),
    ("violation_rag", "viol RAG", "{:.1%}"),
    ("jain", "Jain", "{:.3f}"),
    ("max_wait", "max wait s", "{:.2f}"),
)


def table(rows: list[dict[str, Any]]) -> str:
    head = ["method", "seed", *(c[1] for c in COLUMNS), "answered", "model", "coverage",
            "fallback", "wall s", "gateway CPU s"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        q = r["quartz"]
        cov = q.get("coverage")
        lines.append(
            "| " + " | ".join([
                r["method"], str(r["seed"]), *(f.format(r[k]) for k, _, f in COLUMNS),
                f"{r['answered']}/{r['requests']}", str(q.get("model") or "—"),
                "—" if cov is None else f"{cov:.3f}", str(int(q.get("fallback", 0))),
                f"{r['wall_s']:.0f}", f"{r['cpu_s'].get('gateway', float('nan')):.0f}",
            ]) + " |"
        )  # fmt: skip
    return "\n".join(lines)


def mean_table(rows: list[dict[str, Any]]) -> str:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["method"]].append(r)
    head = ["method", "reps", *(f"{c[1]} (min–max)" for c in COLUMNS[:1] + COLUMNS[3:4]),
            *(c[1] for c in COLUMNS[1:3] + COLUMNS[4:])]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, rs in by.items():

        def cell(k: str, f: str, spread: bool = False, rs: list[dict[str, Any]] = rs) -> str:
            xs = [r[k] for r in rs]
            s = f.format(statistics.fmean(xs))
            return s + (f" ({f.format(min(xs))}–{f.format(max(xs))})" if spread else "")

        lines.append("| " + " | ".join([
            name, str(len(rs)), cell("p99", "{:.2f}", True), cell("violation", "{:.1%}", True),
            *(cell(k, f) for k, _, f in COLUMNS[1:3] + COLUMNS[4:]),
        ]) + " |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    D = Setup()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/quartz-live")
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS), help=", ".join(METHODS))
    ap.add_argument("--reps", type=int, default=2, help="seeds 1..reps, every method on each")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=D.workers)
    ap.add_argument("--max-num-seqs", type=int, default=D.max_num_seqs)
    ap.add_argument("--gateway-slack", type=int, default=D.gateway_slack,
                    help="the gateway's max_num_seqs is the engines' + this")  # fmt: skip
    ap.add_argument("--time-scale", type=float, default=D.scale)
    ap.add_argument("--output-scale", type=float, default=D.output_scale)
    ap.add_argument("--rate", type=float, default=D.rate, help="req / experiment s")
    ap.add_argument("--requests", type=int, default=D.requests)
    ap.add_argument("--warmup-requests", type=int, default=400)
    ap.add_argument("--model", default=None, help="skip the warm-up: use this model file")
    ap.add_argument("--clients", type=int, default=0,
                    help="closed-loop load with this many clients (issue 25); 0: open loop")  # fmt: skip
    args = ap.parse_args()
    setup = Setup(args.workers, args.max_num_seqs, args.time_scale, args.output_scale,
                  args.rate, args.requests, gateway_slack=args.gateway_slack,
                  clients=args.clients)  # fmt: skip
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    methods = [METHODS[m] for m in args.methods.split(",")]
    result: dict[str, Any] = {"setup": dataclasses.asdict(setup)}
    t_all = time.monotonic()
    model = Path(args.model).resolve() if args.model else out / "model.json"
    if args.model is None and any(m.trained for m in methods):
        log = out / "warmup-requests.jsonl"
        log.unlink(missing_ok=True)
        warm_setup = Setup(setup.workers, setup.max_num_seqs, setup.scale, setup.output_scale,
                           setup.rate, args.warmup_requests, setup.drain)  # fmt: skip
        warm = run_one(warm_setup, None, seed=100, log=log)
        print(f"warm-up: {warm['answered']}/{warm['requests']} answered, P99 TTFT "
              f"{warm['p99']:.2f} s, {warm['wall_s']} s wall", flush=True)  # fmt: skip
        t = time.monotonic()
        report = train(log, model, setup)
        result["warmup"] = warm
        result["train"] = report
        result["train_wall_s"] = round(time.monotonic() - t, 1)
        print(f"train-predictor ({result['train_wall_s']} s): "
              f"{json.dumps(report, default=str)}", flush=True)  # fmt: skip
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.reps):
        for m in methods:
            r = run_one(setup, m, seed, model if m.trained else None,
                        records=out / f"records-{m.name}-{seed}.jsonl")  # fmt: skip
            rows.append(r)
            print(table([r]).splitlines()[-1], flush=True)
            (out / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
    result["rows"] = rows
    result["wall_s"] = round(time.monotonic() - t_all, 1)
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nsetup: {result['setup']}; total {result['wall_s']} s wall\n")
    print(table(rows))
    print()
    print(mean_table(rows))


if __name__ == "__main__":
    main()
