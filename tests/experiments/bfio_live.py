"""Data-parallel balancing LIVE: the gateway in front of an emulated DP group, FCFS against
BF-IO (docs/BFIO.md, "Live").

    python bench/bfio_live.py --out out/bfio-live                  # ~6 min wall
    python bench/bfio_live.py --policies fcfs_maxfree,bfio --seconds 20   # a quick look

The simulator protocol of bench/bfio_experiments.py made small enough for loopback:

- the engine: one `fleetgate emulate --data-parallel-size G` process (default G = 4 ranks of
  B = 8 slots), its lockstep step t = T_sync + max_g (W + H·n_g + K·L_g) with the
  simulator's constants (T_sync 2 ms, W 5 ms, H 50 µs) except K: B = 8 slots hold ~9× less
  context than the paper's 72, so K is 2.5 µs a token (not 0.25) to give the context term
  the same share of a step (about two thirds) as in the simulation. `--time-scale S`: an
  engine second takes S wall seconds; every figure below is in engine seconds.
- the gateway: one process, `pools.short.kind: dp_group` with that one endpoint (the rank
  in `X-data-parallel-rank`; `--engine sglang`: the SGLang personality, the rank also in the
  body's `data_parallel_rank`), ranks G, slots B, the policy under test. `--rank-ports`:
  the emulator also serves each rank alone on its own port (`--data-parallel-rank-ports`,
  vLLM's external load balancing) and the pool lists those G endpoints in rank order.
- the load: a backlog — `--outstanding R` clients (default G·B + 16: the pool holds about
  16) each sending its next request as soon as its last one ends, streamed, token-id
  prompts (exact counts). Lengths: the synthetic BurstGPT-like pairs of
  simulator/dp_lengths.py (prompts lognormal, median 500, clipped to 4,096 here; outputs
  geometric, mean 280 × `--output-scale`, default 0.25: every output token is an SSE event
  through the gateway and the client, and a shared 2-core machine relays only so many).
  Client i draws from its own seeded generator: every policy sees the same sequence.

`--policies engine_lb` runs a plain pool instead: the engine's own balancer binds each request
to a rank on arrival (instant dispatch by count; throughput and TPOT only).

Measured after `--warmup` engine seconds, over `--seconds`: the mean imbalance
G·max L_g − Σ L_g and the barrier-idle share it implies (the gateway's per-rank loads,
sampled every 0.25 s wall from its /metrics), throughput (the emulator's
`vllm:generation_tokens_total` over the window, tokens per engine second), TPOT (client
side: (last − first token) / (n − 1) of the requests that finished in the window), pool wait
P50/P99 (`fleetgate_dp_pool_wait_seconds`, bucket-interpolated). Nothing asserts here:
tests/e2e/test_dp_group_two_drivers.py checks the live path end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from simulator.dp_lengths import synthetic_burstgpt
from tests.e2e.fleet import MODEL, gateway_config, start_gateway
from tests.experiments.token_pools_live import parse_metrics
from tests.procs import free_ports, procs

T_SYNC, W, H, K = 0.002, 0.005, 0.00005, 2.5e-6
PROMPT_CAP = 4096


@dataclass
class Result:
    policy: str
    imbalance: float = 0.0  # mean over samples, tokens
    idle: float = 0.0  # mean imbalance / (G·max L)
    throughput: float = 0.0  # generated tokens per engine second
    tpot_ms: float = 0.0
    pool_wait_p50: float = 0.0  # engine seconds
    pool_wait_p99: float = 0.0
    requests: int = 0
    samples: int = 0
    errors: int = 0
    loads: list[list[float]] = field(default_factory=list)  # per sample, per rank


def _quantile(buckets: dict[float, float], q: float) -> float:
    """A histogram quantile from cumulative buckets (upper bound → count), interpolated."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return float("nan")
    rank, prev_b, prev_c = q * total, 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if b == float("inf"):
                return prev_b
            return prev_b + (b - prev_b) * ((rank - prev_c) / (c - prev_c) if c > prev_c else 0)
        prev_b, prev_c = b, c
    return prev_b


def _wait_buckets(text: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for name, labels, value in parse_metrics(text):
        if name == "fleetgate_dp_pool_wait_seconds_bucket" and labels.get("pool") == "short":
            out[float(labels["le"])] = value
    return out


GENERATED = ("vllm:generation_tokens_total", "sglang:generation_tokens_total")


def _generated(text: str) -> float:
    return sum(v for n, _, v in parse_metrics(text) if n in GENERATED)


async def run_policy(policy: str, params: dict[str, object], args: argparse.Namespace) -> Result:
    G, B, S = args.ranks, args.slots, args.time_scale
    res = Result(policy if not params else f"{policy} {json.dumps(params)}")
    lengths = synthetic_burstgpt()
    with procs() as ps:
        per_rank = ["--data-parallel-rank-ports", str(free_ports(G))] if args.rank_ports else []
        emu = ps.emulator(
            "dp", "--personality", args.engine, "--model", MODEL, "--max-model-len", "8192",
            "--time-scale", str(S),
            "--data-parallel-size", str(G), "--max-num-seqs", str(B), "--w", str(W),
            "--h", str(H), "--dp-t-sync", str(T_SYNC), "--dp-k", str(args.k),
            "--num-kv-blocks", "40000", *per_rank,
        ).wait_ready()  # fmt: skip
        # --rank-ports: the group's G per-rank API servers as G workers in rank order (vLLM's
        # external load balancing); else the one endpoint, the rank in a header (and body)
        urls = [f"http://127.0.0.1:{int(per_rank[1]) + g}" for g in range(G)] if per_rank else []
        cfg = gateway_config(urls or [emu.url], [])
        for w in cfg["pools"]["short"]["workers"]:  # type: ignore[index]
            w["engine"] = args.engine  # SGLang: the rank also goes in the body
        if policy != ENGINE_LB:
            dp = {"ranks": G, "slots": B, "assigner": {"policy": policy, "params": params},
                  "timeout_s": 600.0}  # fmt: skip
            cfg["pools"]["short"].update(kind="dp_group", dp_group=dp)  # type: ignore[index]
        cfg["upstream"] = {"connect_timeout_s": 2.0, "first_byte_timeout_s": 600.0,
                           "idle_timeout_s": 60.0}  # fmt: skip
        gw = start_gateway(ps, cfg)
        t0 = time.monotonic()
        start, end = t0 + args.warmup * S, t0 + (args.warmup + args.seconds) * S
        tpots: list[float] = []
        stop = asyncio.Event()

        async def client(i: int, c: httpx.AsyncClient) -> None:
            rng = np.random.default_rng([args.seed, i])
            while not stop.is_set():
                p, o = lengths.draw(rng, 1)
                prompt, out = (
                    min(int(p[0]), PROMPT_CAP),
                    max(2, round(int(o[0]) * args.output_scale)),
                )
                body = {"model": MODEL, "prompt": list(range(1000, 1000 + prompt)),
                        "max_tokens": out, "ignore_eos": True, "stream": True}  # fmt: skip
                first = last = None
                try:
                    async with c.stream("POST", "/v1/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("data: {"):
                                last = time.monotonic()
                                first = first or last
                        if r.status_code != 200:
                            res.errors += 1
                except httpx.HTTPError:
                    res.errors += 1
                    continue
                now = time.monotonic()
                if first is not None and last is not None and start <= now <= end:
                    res.requests += 1
                    tpots.append((last - first) / S / max(1, out - 1))

        async with httpx.AsyncClient(base_url=gw.url, timeout=600) as c:
            tasks = [asyncio.create_task(client(i, c)) for i in range(args.outstanding)]
            while time.monotonic() < start:
                await asyncio.sleep(0.05)
            gw0, emu0 = (await c.get("/metrics")).text, httpx.get(emu.url + "/metrics").text
            w0 = time.monotonic()
            imbs, idles = [], []
            while time.monotonic() < end:
                if policy == ENGINE_LB:  # no per-rank loads at the gateway
                    await asyncio.sleep(0.25)
                    continue
                text = (await c.get("/metrics")).text
                loads = [0.0] * G
                for name, labels, value in parse_metrics(text):
                    if name == "fleetgate_dp_rank_load_tokens" and labels.get("pool") == "short":
                        loads[int(labels["rank"])] = value
                top = max(loads)
                imbs.append(G * top - sum(loads))
                idles.append(imbs[-1] / (G * top) if top else 0.0)
                res.loads.append(loads)
                await asyncio.sleep(0.25)
            gw1, emu1 = (await c.get("/metrics")).text, httpx.get(emu.url + "/metrics").text
            w1 = time.monotonic()
            stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    res.samples = len(imbs)
    res.imbalance = statistics.fmean(imbs) if imbs else float("nan")
    res.idle = statistics.fmean(idles) if idles else float("nan")
    res.throughput = (_generated(emu1) - _generated(emu0)) / ((w1 - w0) / S)
    res.tpot_ms = 1000 * statistics.fmean(tpots) if tpots else float("nan")
    b0, b1 = _wait_buckets(gw0), _wait_buckets(gw1)
    delta = {b: b1[b] - b0.get(b, 0.0) for b in b1}
    res.pool_wait_p50 = _quantile(delta, 0.5) / S
    res.pool_wait_p99 = _quantile(delta, 0.99) / S
    return res


# a plain pool: the gateway names no rank and the engine's own DP balancer places each
# request on arrival (the emulator, as vLLM's internal balancer: the rank with the fewest
# running + waiting) to wait in that rank's queue — instant dispatch by count, the paper's
# untreated §7.3 interface. The gateway has no per-rank loads then (no imbalance, no pool
# wait): throughput and TPOT only.
ENGINE_LB = "engine_lb"

POLICIES = {
    ENGINE_LB: (ENGINE_LB, {}),
    "fcfs_maxfree": ("fcfs_maxfree", {}),
    "least_token_load": ("least_token_load", {}),
    "bfio": ("bfio", {}),
    "bfio_wait2": ("bfio", {"max_pool_wait_s": 2.0}),
    # the lookahead live: the client's max_tokens is the only live predictor; this load sets
    # ignore_eos with max_tokens = the drawn length, so here the bound is exact (an oracle)
    "bfio_h20": ("bfio", {"lookahead_steps": 20, "predictor": "max_tokens_bound"}),
    # with outputs × 0.25 (mean ≈ 70 tokens) a 20-step window is ~30 % of an answer's life;
    # bench/bfio_live_sim.py finds 5 steps the better window here
    "bfio_h5": ("bfio", {"lookahead_steps": 5, "predictor": "max_tokens_bound"}),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default="fcfs_maxfree,bfio")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--outstanding", type=int, default=None, help="default G·B + 16")
    ap.add_argument("--k", type=float, default=K)
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--output-scale", type=float, default=0.25)
    ap.add_argument("--warmup", type=float, default=8.0, help="engine seconds")
    ap.add_argument("--seconds", type=float, default=30.0, help="engine seconds measured")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--rank-ports",
        action="store_true",
        help="per-rank endpoints: the emulator's --data-parallel-rank-ports, G workers",
    )
    ap.add_argument(
        "--engine",
        choices=("vllm", "sglang"),
        default="vllm",
        help="the emulator's personality; sglang: the gateway appends data_parallel_rank",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.outstanding is None:
        args.outstanding = args.ranks * args.slots + 16
    results = []
    for name in args.policies.split(","):
        policy, params = POLICIES[name]
        r = asyncio.run(run_policy(policy, params, args))
        results.append(r)
        print(
            f"{r.policy:32s} imbalance {r.imbalance:9.0f}  idle {100 * r.idle:5.1f} %"
            f"  thpt {r.throughput:7.1f} tok/s  TPOT {r.tpot_ms:6.2f} ms"
            f"  pool wait P50/P99 {r.pool_wait_p50:.3f}/{r.pool_wait_p99:.3f} s"
            f"  requests {r.requests}  errors {r.errors}  samples {r.samples}",
            flush=True,
        )
    base = results[0]
    for r in results[1:]:
        print(
            f"{r.policy} vs {base.policy}: imbalance ÷ {base.imbalance / r.imbalance:.2f},"
            f" throughput {100 * (r.throughput / base.throughput - 1):+.1f} %,"
            f" TPOT {100 * (r.tpot_ms / base.tpot_ms - 1):+.1f} %"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        rows = [{k: v for k, v in asdict(r).items() if k != "loads"} for r in results]
        (args.out / "bfio_live.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
