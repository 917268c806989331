"""The token-pools paper's two experiments (§5.2–5.3) LIVE, beside the simulator's and the paper's.

    python bench/token_pools_live.py --out out/token-pools-live          # both, ~3 min wall
    python bench/token_pools_live.py --scale 0.1 --only exp1             # a quick look

The scenarios are bench/token_pools_experiments.py's (simulator/scenarios/token-pools-exp1,
-exp1-off, -exp2); here each runs against real processes on loopback:

- engines: `fleetgate emulate` processes with the scenario's engine (max_num_seqs, W, H,
  131,072 KV tokens, no prefix caching) and `--time-scale S`: an engine second takes S wall
  seconds (default S = 0.25: the 90 s and 300 s experiments take 23 s and 75 s);
- one gateway process (`fleetgate serve`) in front of them, its `admission` the scenario's
  with every time constant scaled by S — tokens/s baselines ÷ S, SLO targets, windows, the
  control interval, the typical request length and the state Retry-After × S — so the
  admitter sees the same experiment in wall time; each entitlement gets its own API key;
- the token pool's capacity follows the fleet (`admission.params.follow_workers`): the
  outage of experiment 2 is a worker drained through `POST /admin/workers/{id}/drain` at
  30 s and added back through `POST /admin/workers` at 120 s; reports' entitlement is bound
  through `PATCH /admin/entitlements/reports` at 210 s;
- clients: one asyncio + httpx load generator per tenant, with its key, sending the
  simulator's own workload (simulator.run.build_workload: the same seeded arrival times and
  lengths) open-loop at the scaled times: streamed chat completions of the drawn prompt
  length (" a" tokens, measured against the engine once) and exactly max_tokens of output
  (`ignore_eos`). A 429 is retried as the scenario says (after Retry-After, capped at
  max_wait_s · S). Each attempt is a `simulator.records.RequestRecord` in experiment seconds:
  arrival, first token (TTFT; also taken as `scheduled`, the slot-share plot's start),
  finish, status, the refusal's code and message;
- sampled every `report.sample_interval` · S: the engines' /metrics (vLLM's running and
  waiting: the queue of Fig. 2) and the gateway's /metrics (per entitlement in flight, debt,
  priority; the pool's slots and admission threshold: Fig. 5).

The figures are computed and plotted by bench/token_pools_experiments.py's functions
(`exp1_figures`, `exp2_figures`, `plot_exp1`, `plot_exp2`), and printed beside the
simulator's (run here too, a second each) and the paper's. Wall time and the processes'
CPU are printed per experiment. Nothing here asserts: tests/e2e/test_token_pools_live.py
checks the qualitative claims on a strongly time-scaled experiment 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from simulator.records import PoolSeries, RequestRecord, Series
from simulator.run import build_workload
from simulator.scenario import EntitlementEventModel, Scenario, WorkersEventModel, load
from simulator.workloads import RequestSpec
from tests.experiments.token_pools_experiments import (
    PAPER,
    LedgerTrace,
    exp1_figures,
    exp2_figures,
    figure_rows,
    plot_exp1,
    plot_exp2,
    run_exp1,
    run_exp2,
)
from tests.procs import Proc, procs

MODEL = "qwen3-8b"
SECRET = "token-pools-live-secret-0123"
ADMIN = "token-pools-live-admin"
KV_TOKENS = 131_072  # one engine's KV cache, as the scenarios' kv_bytes assume
DRAIN_S = 40.0  # experiment seconds after the last arrival for answers to finish


FIRST_CONTENT = re.compile(rb'"content":"[^"]')  # a chunk with text (not the role's)
COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')


def key_of(entitlement: str) -> str:
    return f"sk-live-{entitlement}"


# --- the scenario, live ---------------------------------------------------------------
def live_admission(scenario: Scenario, scale: float) -> dict[str, Any]:
    """The scenario's `admission` with every time constant × `scale` (rates ÷ `scale`), its
    entitlements' API keys, and the token pool following the fleet when an event says so."""
    adm = scenario.policy.admission
    if adm.policy != "token_pools":
        return {"policy": adm.policy, "params": dict(adm.params)}
    params = json.loads(json.dumps(adm.params))  # a deep copy
    for pool in params["pools"].values():
        pool["tokens_per_s"] = pool["tokens_per_s"] / scale
        pool["typical_request_s"] = pool.get("typical_request_s", 1.0) * scale
        pool["window_s"] = pool.get("window_s", 60.0) * scale
    for name, ent in params["entitlements"].items():
        ent["tokens_per_s"] = ent.get("tokens_per_s", 0.0) / scale
        ent["window_s"] = ent.get("window_s", 60.0) * scale
        if ent.get("slo_target_ms") is not None:
            ent["slo_target_ms"] = ent["slo_target_ms"] * scale
        ent["keys"] = [key_of(name)]
    params["control_interval_s"] = params.get("control_interval_s", 1.0) * scale
    params["state_retry_s"] = params.get("state_retry_s", 5.0) * scale
    follow = {
        ev.token_pool: ev.pool
        for ev in scenario.events
        if isinstance(ev, WorkersEventModel) and ev.token_pool is not None
    }
    if follow:
        params["follow_workers"] = follow
    return {"policy": "token_pools", "params": params}


def emulator_args(scenario: Scenario, scale: float) -> list[str]:
    pool = scenario.fleet.pools[0]
    e = scenario.engine_config(pool)
    return [
        "--model", MODEL, "--max-model-len", str(pool.max_model_len),
        "--max-num-seqs", str(e.max_num_seqs), "--w", str(e.w), "--h", str(e.h),
        "--kv-tokens", str(KV_TOKENS), "--no-prefix-caching", "--time-scale", str(scale),
        "--max-lag", str(max(0.05, 0.2 * scale)),
    ]  # fmt: skip


def gateway_config(scenario: Scenario, scale: float, workers: list[Proc]) -> dict[str, Any]:
    pool = scenario.fleet.pools[0]
    admission = live_admission(scenario, scale)
    cfg: dict[str, Any] = {
        "pools": {
            pool.name: {
                "max_model_len": pool.max_model_len,
                "models": [MODEL],
                "workers": [{"url": w.url, "name": w.name} for w in workers],
            }
        },
        "placement": {"short_pool": pool.name},
        "admission": admission,
        "telemetry": {"scrape_interval_s": 0.25, "stale_after_s": 5.0},
        "health": {"interval_s": 0.5, "timeout_s": 2.0, "unhealthy_after": 3},
        "upstream": {"connect_timeout_s": 2.0, "first_byte_timeout_s": 600.0,
                     "idle_timeout_s": 120.0},
        "auth": {"admin_key": ADMIN},
        "listen": {"drain_delay_s": 0.0, "graceful_shutdown_s": 2.0},  # nothing to drain
    }  # fmt: skip
    if admission["policy"] == "token_pools":
        cfg["auth"] |= {"key_secret": SECRET, "entitlements_admin_key": ADMIN}
    return cfg


# --- the live run -----------------------------------------------------------------------
@dataclass
class LiveRun:
    """What a live run leaves: the shape the plots and figures read (`Run`)."""

    scenario: Scenario
    scale: float
    records: list[RequestRecord] = field(default_factory=list)
    series: Series = field(default_factory=lambda: Series(1.0, pools={"main": PoolSeries()}))
    trace: LedgerTrace = field(default_factory=lambda: LedgerTrace("qwen3-8b"))
    events: list[tuple[float, str]] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    prompt_overhead: int = 0


def parse_metrics(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample of a Prometheus text page."""
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels = {}
        for part in rest.rstrip("}").split('",'):
            k, _, v = part.partition('="')
            if k:
                labels[k.strip(",")] = v.rstrip('"')
        with contextlib.suppress(ValueError):
            yield name, labels, float(value)


class Experiment:
    """One scenario against live processes: clients, events, sampler."""

    def __init__(self, run: LiveRun, gateway: str, engines: dict[str, str]) -> None:
        self.run = run
        self.gateway = gateway
        self.engines = engines  # worker name → URL (drained ones too: they finish their work)
        self.scale = run.scale
        self.t0 = 0.0
        self.retry = {t.name: t.retry for t in run.scenario.workload.tenants}
        self.admin = {"authorization": f"Bearer {ADMIN}"}
        self.tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        """Experiment seconds since the start."""
        return (asyncio.get_running_loop().time() - self.t0) / self.scale

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, self.t0 + t * self.scale - asyncio.get_running_loop().time()))

    # --- clients ---------------------------------------------------------------------------
    def prompt(self, tokens: int) -> str:
        return " a" * max(1, tokens - self.run.prompt_overhead)

    def client(self, name: str, stop: float) -> httpx.AsyncClient:
        """A tenant's own connections, with its key."""
        return httpx.AsyncClient(
            base_url=self.gateway,
            headers={"authorization": f"Bearer {key_of(name)}"},
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            timeout=httpx.Timeout(stop * self.scale + 30.0, connect=10.0),
        )

    async def tenant(self, client: httpx.AsyncClient, specs: list[RequestSpec]) -> None:
        """One tenant's open-loop load generator: each request at its time, not waiting for
        the answers before."""
        for spec in specs:
            await self.sleep_until(spec.arrival)
            task = asyncio.create_task(self.request(client, spec))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def request(self, client: httpx.AsyncClient, spec: RequestSpec) -> None:
        retry = self.retry.get(spec.client)
        while True:
            rec = RequestRecord(spec, self.now())
            self.run.records.append(rec)
            wait = await self.attempt(client, spec, rec)
            if rec.status != "rejected_429" or retry is None or spec.attempt >= retry.max_attempts:
                return
            await asyncio.sleep(min(wait, retry.max_wait_s * self.scale))
            spec = replace(spec, attempt=spec.attempt + 1, first_arrival=rec.first_arrival)

    async def attempt(
        self, client: httpx.AsyncClient, spec: RequestSpec, rec: RequestRecord
    ) -> float:
        """One attempt; fills `rec`; returns the Retry-After (wall seconds) of a refusal."""
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": self.prompt(spec.prompt_tokens)}],
            "max_tokens": spec.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raw = await r.aread()  # a refusal has no finish (as in the simulator)
                    rec.status = "rejected_429" if r.status_code == 429 else f"http_{r.status_code}"
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        err = orjson.loads(raw)["error"]
                        rec.refusal, rec.refusal_reason = err.get("code"), err.get("message")
                    return float(r.headers.get("retry-after", 1.0))
                # raw bytes, parsed no more than needed: the client must keep up with
                # thousands of SSE events a second on a loaded machine
                end = b""
                async for raw in r.aiter_raw():
                    end = (end + raw)[-1024:]
                    if rec.first_token is None and FIRST_CONTENT.search(end):
                        rec.first_token = rec.scheduled = self.now()
                rec.finish = self.now()
                used = COMPLETION_TOKENS.search(end)
                rec.completion_tokens = int(used.group(1)) if used else 0
                done = rec.first_token is not None and end.rstrip().endswith(b"[DONE]")
                rec.status = "ok" if done else "incomplete"
        except (httpx.HTTPError, asyncio.CancelledError, RuntimeError) as exc:
            rec.finish = self.now()
            rec.status = "cut" if isinstance(exc, asyncio.CancelledError) else "client_error"
            rec.refusal_reason = repr(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        return 0.0

    # --- events ----------------------------------------------------------------------------
    async def events(self, admin: httpx.AsyncClient) -> None:
        pool = self.run.scenario.fleet.pools[0]
        names = list(self.engines)
        for ev in sorted(self.run.scenario.events, key=lambda e: e.at):
            await self.sleep_until(ev.at)
            if isinstance(ev, WorkersEventModel):
                for i, name in enumerate(names):
                    listed = (await admin.get("/admin/workers")).json()["data"]
                    active = {w["id"] for w in listed if w.get("state") != "draining"}
                    if i >= ev.workers and name in active:
                        r = await admin.post(f"/admin/workers/{name}/drain")
                    elif i < ev.workers and name not in {w["id"] for w in listed}:
                        r = await admin.post(
                            "/admin/workers",
                            json={"pool": pool.name, "url": self.engines[name], "name": name},
                        )
                    else:
                        continue
                    r.raise_for_status()
                    self.run.events.append((self.now(), f"{name}: {r.json()}"))
            elif isinstance(ev, EntitlementEventModel):
                r = await admin.patch(f"/admin/entitlements/{ev.name}", json={"state": ev.state})
                r.raise_for_status()
                self.run.events.append((self.now(), f"{ev.name}: {ev.state}"))

    # --- the sampler -------------------------------------------------------------------------
    async def sample(self, admin: httpx.AsyncClient, interval: float, stop: float) -> None:
        s = self.run.series
        s.interval = interval
        pool = s.pools["main"]
        token_pools = self.run.scenario.policy.admission.policy == "token_pools"
        while self.now() < stop:
            t = self.now()
            running = waiting = 0
            for url in self.engines.values():
                with contextlib.suppress(httpx.HTTPError):
                    text = (await admin.get(url + "/metrics")).text
                    for name, _, v in parse_metrics(text):
                        if name == "vllm:num_requests_running":
                            running += int(v)
                        elif name == "vllm:num_requests_waiting":
                            waiting += int(v)
            s.t.append(t)
            pool.running.append(running)
            pool.waiting.append(waiting)
            if token_pools:
                with contextlib.suppress(httpx.HTTPError):
                    self.ledger((await admin.get("/metrics")).text, t)
            await self.sleep_until(t + interval)

    def ledger(self, text: str, t: float) -> None:
        trace = self.run.trace
        per: dict[str, dict[str, float]] = defaultdict(dict)
        slots, threshold = None, None
        for name, labels, v in parse_metrics(text):
            if name.startswith("fleetgate_entitlement_") and labels.get("pool") == trace.pool:
                per[labels["entitlement"]][name.removeprefix("fleetgate_entitlement_")] = v
            elif name == "fleetgate_pool_capacity" and labels.get("pool") == trace.pool:
                if labels.get("resource") == "slots":
                    slots = int(v)
            elif name == "fleetgate_pool_admission_threshold" and labels.get("pool") == trace.pool:
                threshold = None if v < 0 else v
        if slots is None:
            return
        trace.t.append(t)
        trace.slots.append(slots)
        trace.threshold.append(threshold)
        for ent, g in sorted(per.items()):
            trace.in_flight[ent].append(int(g.get("in_flight", 0)))
            trace.debt[ent].append(g.get("debt", 0.0))
            trace.priority[ent].append(g.get("priority", 0.0))

    # --- the whole run -----------------------------------------------------------------------
    async def main(self, specs: list[RequestSpec]) -> None:
        by_tenant: dict[str, list[RequestSpec]] = defaultdict(list)
        for spec in specs:
            by_tenant[spec.client].append(spec)
        last = max((s.arrival for s in specs), default=0.0)
        stop = last + DRAIN_S
        interval = self.run.scenario.report.sample_interval or 1.0
        async with contextlib.AsyncExitStack() as stack:
            admin = await stack.enter_async_context(
                httpx.AsyncClient(base_url=self.gateway, headers=self.admin, timeout=30)
            )
            clients = {n: await stack.enter_async_context(self.client(n, stop)) for n in by_tenant}
            self.t0 = asyncio.get_running_loop().time() + 0.2
            started = time.monotonic()
            sampler = asyncio.create_task(self.sample(admin, interval, stop))
            events = asyncio.create_task(self.events(admin))
            await asyncio.gather(
                *(self.tenant(clients[n], by_tenant[n]) for n in sorted(by_tenant))
            )
            deadline = self.t0 + stop * self.scale
            while self.tasks and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            for task in list(self.tasks):  # bounded in time: what is left is cut
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await events
            # a few more samples after the last answer, then stop
            await asyncio.sleep(min(2.0, 4 * interval * self.scale))
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self.run.wall_s = time.monotonic() - started


def measure_prompt_overhead(engine: str, probe: int = 64) -> int:
    """Tokens the chat template adds around " a" × n (the engine's own count)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": " a" * probe}],
            "max_tokens": 1}  # fmt: skip
    usage = httpx.post(engine + "/v1/chat/completions", json=body, timeout=30).json()["usage"]
    return int(usage["prompt_tokens"]) - probe


def cpu_seconds(proc: Proc) -> float:
    """utime + stime of a process (its children are not counted: none here)."""
    if proc.popen is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{proc.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_live(scenario: Scenario, scale: float, requests: int | None = None) -> LiveRun:
    """Start the scenario's engines and a gateway, run its workload live, stop them."""
    run = LiveRun(scenario, scale)
    specs = build_workload(scenario, requests=requests)
    with procs() as ps:
        pool = scenario.fleet.pools[0]
        engines = [
            ps.emulator(f"w{i}", *emulator_args(scenario, scale)) for i in range(pool.workers)
        ]
        for e in engines:
            e.wait_ready("/health")
        run.prompt_overhead = measure_prompt_overhead(engines[0].url)
        cfg = gateway_config(scenario, scale, engines)
        path = ps.dir / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        gw = ps.fleetgate("gateway", "serve", "--config", str(path), "--port", "{port}")
        gw.wait_ready("/healthz")
        cpu0 = {p.name: cpu_seconds(p) for p in [gw, *engines]}
        try:
            exp = Experiment(run, gw.url, {e.name: e.url for e in engines})
            asyncio.run(exp.main(specs))
        except BaseException:
            print(gw.output(), file=sys.stderr)
            raise
        run.cpu_s = {p.name: round(cpu_seconds(p) - cpu0[p.name], 2) for p in [gw, *engines]}
    return run


def write_records(run: LiveRun, path: Path) -> None:
    """One JSON line per attempt (experiment seconds), for a look beyond the figures."""
    keys = ("client", "attempt", "arrival", "first_arrival", "first_token", "finish", "status",
            "refusal", "refusal_reason", "completion_tokens")  # fmt: skip
    with path.open("w") as f:
        for r in run.records:
            f.write(json.dumps({k: getattr(r, k) for k in keys}) + "\n")


# --- the printout ----------------------------------------------------------------------------
def print_rows(live: list[tuple[str, Any, Any]], sim: list[tuple[str, Any, Any]]) -> None:
    simulated = {name: value for name, value, _ in sim}
    width = max(len(r[0]) for r in live)
    print(f"\n{'figure':<{width}}  {'live':<30}  {'simulated':<30}  paper")
    for name, ours, paper in live:
        print(
            f"{name:<{width}}  {json.dumps(ours):<30}  {json.dumps(simulated.get(name)):<30}  {paper}"
        )


EMPTY2: dict[str, Any] = {
    c: {"ok": None, "low_priority_denials": None, "burst_denials": None, "peak_debt": None,
        "p99_admission_delay_s": None, "priority_at_start": None,
        "debt_below_0.05_after_recovery_s": None}
    for c in ("copilot", "synth", "reports")
}  # fmt: skip
EMPTY1: dict[str, Any] = {
    "guaranteed_p99_ttft_s": None, "guaranteed_p99_latency_s": None, "refused": {},
    "max_queue": None, "latency_end_phase2_s": None,
}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/token-pools-live", help="directory for PNGs and JSON")
    ap.add_argument("--scale", type=float, default=0.25,
                    help="wall seconds per experiment second (engines and admission alike)")  # fmt: skip
    ap.add_argument("--only", choices=("exp1", "exp2"), default=None)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"scale": args.scale, "paper": PAPER}
    f_on, f_off, f2 = dict(EMPTY1), dict(EMPTY1), dict(EMPTY2)
    s_on, s_off, s2 = dict(EMPTY1), dict(EMPTY1), dict(EMPTY2)
    if args.only in (None, "exp1"):
        _, s_on = run_exp1(load("token-pools-exp1"))
        _, s_off = run_exp1(load("token-pools-exp1-off"))
        on = run_live(load("token-pools-exp1"), args.scale)
        off = run_live(load("token-pools-exp1-off"), args.scale)
        f_on = exp1_figures(on.records, on.series.pools["main"].waiting)
        f_off = exp1_figures(off.records, off.series.pools["main"].waiting)
        plot_exp1(on, off, out / "exp1-live.png", label=f"live, time scale {args.scale}")
        write_records(on, out / "exp1-on-records.jsonl")
        write_records(off, out / "exp1-off-records.jsonl")
        for tag, r in (("exp1_on", on), ("exp1_off", off)):
            print(f"{tag}: {len(r.records)} attempts in {r.wall_s:.1f} s wall; CPU s {r.cpu_s}")
            result[tag] = {"figures": f_on if tag == "exp1_on" else f_off,
                           "wall_s": round(r.wall_s, 1), "cpu_s": r.cpu_s}  # fmt: skip
        result["exp1_sim"] = {"on": s_on, "off": s_off}
    if args.only in (None, "exp2"):
        scenario = load("token-pools-exp2")
        _, _, s2 = run_exp2(scenario)
        live2 = run_live(scenario, args.scale)
        f2 = exp2_figures(live2.records, live2.trace, scenario)
        plot_exp2(live2, live2.trace, out / "exp2-live.png", label=f"live, time scale {args.scale}")
        write_records(live2, out / "exp2-records.jsonl")
        print(f"exp2: {len(live2.records)} attempts in {live2.wall_s:.1f} s wall; "
              f"CPU s {live2.cpu_s}")  # fmt: skip
        for t, what in live2.events:
            print(f"  event at {t:.1f} s: {what}")
        result["exp2"] = {"figures": f2, "wall_s": round(live2.wall_s, 1), "cpu_s": live2.cpu_s,
                          "events": live2.events}  # fmt: skip
        result["exp2_sim"] = s2
    live_rows = figure_rows(f_on, f_off, f2)
    sim_rows = figure_rows(s_on, s_off, s2)
    if args.only == "exp1":
        live_rows = [r for r in live_rows if r[0].startswith("Exp 1")]
    elif args.only == "exp2":
        live_rows = [r for r in live_rows if r[0].startswith("Exp 2")]
    print_rows(live_rows, sim_rows)
    (out / "figures.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {out}: exp1-live.png, exp2-live.png (as run), figures.json, *-records.jsonl")


if __name__ == "__main__":
    main()
