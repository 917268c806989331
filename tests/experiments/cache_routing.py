"""Cache-aware routing in the simulator (issue 27; docs/CACHE_ROUTING.md): the Price-of-
Anarchy paper's protocol on an ordinary pool, and a workload it never ran.
`bench/cache_routing_experiments.py` runs these and prints the tables.

Everything runs the real pipeline core (policies/build.py attaches the routers' hooks),
the engine model's prefix cache deciding hits, under closed-loop load
(simulator/closed_loop.py: C clients, a linear ramp, a hold, optionally a spike). Virtual
time: the figures do not depend on the machine.

The workload (`sessions`): multi-turn conversations. Each opens with one of `templates`
shared system prompts (Zipf popularity; lognormal lengths), then turns of lognormal user
messages and lognormal (variable) answers; turn k's prompt is the whole conversation so
far, so its KV blocks extend turn k−1's. Block hashes are chained over 16-token blocks:
a block wholly inside the system prompt carries the template's content, every later one
the conversation's own — the engine caches and the gateway's index see exactly the
sharing a real chat has. Each client runs conversations back to back; its `session` key
is the conversation's.

The paper's workload (`paper`): 5 templates of 128 tokens, outputs of 256 (its §4.1).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from policies.poa_window import PoaWindow
from simulator.closed_loop import LoadShape, Spike, simulate
from simulator.families import mix64
from simulator.run import RunResult
from simulator.scenario import Scenario, parse
from simulator.workloads import RequestSpec

BLOCK = 16


@dataclass(frozen=True, slots=True)
class Workload:
    templates: int = 128  # shared system prompts
    zipf_s: float = 0.8
    system_median: float = 1000.0  # tokens, lognormal
    system_sigma: float = 0.6
    user_median: float = 80.0  # a turn's new user message
    user_sigma: float = 0.8
    output_median: float = 120.0  # answers: variable
    output_sigma: float = 0.7
    output_max: int = 512
    turns_max: int = 6  # turns per conversation: uniform 1..turns_max
    context: int = 8192


PAPER = Workload(
    templates=5,
    zipf_s=0.0,
    system_median=112.0,
    system_sigma=0.0,
    user_median=16.0,
    user_sigma=0.0,
    output_median=256.0,
    output_sigma=0.0,
    output_max=256,
    turns_max=1,
)


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    v = median if sigma == 0 else rng.lognormvariate(math.log(median), sigma)
    return max(lo, min(hi, round(v)))


def _chain(template: int, system: int, conversation: int, blocks: int) -> list[int]:
    out: list[int] = []
    h = 0
    for i in range(blocks):
        if (i + 1) * BLOCK <= system:
            content = mix64(template * 1_000_003 + i)
        else:
            content = mix64(mix64(conversation + (1 << 40)) ^ mix64(i + 1))
        h = mix64(h ^ content)
        out.append(h)
    return out


def sessions(w: Workload, clients: int, per_client: int, seed: int) -> list[list[RequestSpec]]:
    """`per_client` requests for each client: its conversations, back to back."""
    rng = random.Random(f"{seed}:sessions")
    lengths = random.Random(f"{seed}:templates")
    system = [
        _lognormal(lengths, w.system_median, w.system_sigma, 64, 4096) for _ in range(w.templates)
    ]
    weights = [1.0 / (k + 1) ** w.zipf_s for k in range(w.templates)]
    out: list[list[RequestSpec]] = []
    conv = 0
    for c in range(clients):
        seq: list[RequestSpec] = []
        while len(seq) < per_client:
            conv += 1
            t = rng.choices(range(w.templates), weights)[0]
            turns = rng.randint(1, w.turns_max)
            prompt = system[t]
            chain: list[int] = []
            for _ in range(turns):
                prompt += _lognormal(rng, w.user_median, w.user_sigma, 4, 2048)
                out_tokens = _lognormal(rng, w.output_median, w.output_sigma, 4, w.output_max)
                if prompt + w.output_max > w.context:
                    break
                if len(chain) < prompt // BLOCK:
                    chain = _chain(t, system[t], conv, prompt // BLOCK)
                seq.append(
                    RequestSpec(
                        id=f"c{c:03d}-{len(seq):04d}",
                        arrival=0.0,
                        prompt_tokens=prompt,
                        output_tokens=out_tokens,
                        max_tokens=out_tokens,
                        client=f"c{c:03d}",
                        prefix_hashes=tuple(chain[: prompt // BLOCK]),
                        session=f"conv-{conv}",
                    )
                )
                prompt += out_tokens
                if len(seq) >= per_client:
                    break
        out.append(seq)
    return out


def scenario(
    routing: dict[str, Any],
    workers: int = 4,
    kv_blocks: int = 4096,
    max_num_seqs: int = 64,
    gateway_queue: bool = True,
) -> Scenario:
    """An ordinary pool of `workers` engines with prefix caching and compute-bound prefill
    (20k prompt tokens/s, 4,096 tokens per step): a cache hit saves real time. With
    `gateway_queue` a request waits in the gateway until a worker has a free sequence slot
    (dispatch capacity: engine); without, it goes to its worker at arrival and waits in
    that engine's queue."""
    return parse(
        {
            "name": "cache-routing",
            "seed": 1,
            "fleet": {
                "engine": {
                    "max_num_seqs": max_num_seqs,
                    "num_kv_blocks": kv_blocks,
                    "enable_prefix_caching": True,
                    "prefill_token_s": 5e-5,
                    "max_num_batched_tokens": 4096,
                },
                "pools": [
                    {
                        "name": "short",
                        "workers": workers,
                        "max_model_len": 8192,
                        "routing": routing,
                    }
                ],
            },
            "workload": {
                "requests": 1,
                "arrivals": {"kind": "poisson", "rate": 1.0},
                "components": [{"family": "chat"}],
            },
            "policy": {
                "dispatch": {
                    "capacity": "engine" if gateway_queue else "none",
                    "max_waiting": 100_000,
                }
            },
            "report": {"plots": False, "sample_interval": 1.0},
        }
    )


@dataclass(frozen=True, slots=True)
class Router:
    label: str
    policy: str
    params: tuple[tuple[str, Any], ...] = ()


ROUTERS = (
    Router("least_loaded", "least_loaded"),
    Router("power_of_two", "power_of_two"),
    Router("prefix_overlap", "prefix_overlap"),
    Router("kv_cost (τ 0, ω 1)", "kv_cost"),
    Router("session_affinity", "session_affinity"),
    Router("regime_adaptive", "regime_adaptive"),
)


def _q(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def metrics(result: RunResult, t0: float, t1: float) -> dict[str, float]:
    """Over requests arriving in [t0, t1): TTFT P50/P99, ITL P99 (per request: decode time
    over generated tokens − 1), mean latency, throughput (completions in the window per
    second), effective concurrency (Little: throughput × mean latency), the engines'
    prefix hit rate over the whole run."""
    rs = [r for r in result.records if t0 <= r.arrival < t1 and r.status == "ok"]
    ttft = [r.first_token - r.arrival for r in rs if r.first_token is not None]
    itl = [
        (r.finish - r.first_token) / (r.completion_tokens - 1)
        for r in rs
        if r.finish is not None and r.first_token is not None and r.completion_tokens > 1
    ]
    lat = [r.finish - r.arrival for r in rs if r.finish is not None]
    done = [
        r
        for r in result.records
        if r.finish is not None and t0 <= r.finish < t1 and r.status == "ok"
    ]
    rps = len(done) / (t1 - t0)
    mean = sum(lat) / len(lat) if lat else float("nan")
    return {
        "n": len(rs),
        "hit": result.engine_stats["short"]["prefix_hit_rate"],
        "ttft_p50": _q(ttft, 0.5),
        "ttft_p99": _q(ttft, 0.99),
        "itl_p99": _q(itl, 0.99),
        "latency": mean,
        "rps": rps,
        "concurrency": rps * mean,
        "preempt": result.engine_stats["short"]["preemptions"],
    }


def run_one(
    router: Router,
    clients: int,
    seed: int = 1,
    workload: Workload | None = None,
    ramp_s: float = 10.0,
    hold_s: float = 60.0,
    spike: Spike | None = None,
    workers: int = 4,
    kv_blocks: int = 4096,
    extra: dict[str, Any] | None = None,
    max_num_seqs: int = 64,
    think_s: float = 0.0,
    gateway_queue: bool = True,
    poa_every_s: float | None = None,
) -> tuple[dict[str, float], RunResult]:
    """One closed-loop run; metrics over the hold (after the ramp). `poa_every_s`: also the
    paper's PoA^ (eq. 12 over a 30 s window of completions, o_qj from the router's index
    when it has one), estimated every that many seconds of the hold; `poa` is the mean."""
    w = workload or Workload()
    per_client = max(8, int(hold_s + ramp_s))  # more than a client can send in the run
    seqs = sessions(w, clients, per_client, seed)
    params = {**dict(router.params), **(extra or {})}
    sc = scenario(
        {"policy": router.policy, "params": params}, workers, kv_blocks, max_num_seqs, gateway_queue
    )
    shape = LoadShape(
        clients, think_s=think_s, ramp_s=ramp_s, hold_s=hold_s, seed=seed, spike=spike
    )
    window, probe, samples = poa_sampler(ramp_s, ramp_s + hold_s, poa_every_s)
    hooks = () if window is None else (window,)
    result, _ = simulate(sc, shape, seqs, seed=seed, hooks=hooks, probe=probe)
    m = metrics(result, ramp_s, ramp_s + hold_s)
    if samples:
        m["poa"] = sum(r for _, r in samples) / len(samples)
    return m, result


def poa_sampler(
    t0: float, t1: float, every_s: float | None
) -> tuple[PoaWindow | None, Any, list[tuple[float, float]]]:
    """A `PoaWindow` hook and a probe estimating eq. 12 every `every_s` in [t0, t1):
    (time, PoA^) samples."""
    samples: list[tuple[float, float]] = []
    if every_s is None:
        return None, None, samples
    window = PoaWindow(window_s=30.0, max_requests=512)
    due = [t0 + every_s]

    def probe(core: Any, now: float) -> None:
        if now < due[0] or now >= t1:
            return
        due[0] = now + every_s
        state = getattr(core.routers.get("short"), "state", None)
        window.index = getattr(state, "index", None)
        est = window.paper(now)
        if est is not None:
            samples.append((now, est.ratio))

    return window, probe, samples


# --- the experiments ----------------------------------------------------------------------

C_SWEEP = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
GRID = (0.0, 0.3, 0.7, 1.0)  # the paper's τ and ω values
KV_COST = Router("kv_cost", "kv_cost")
ADAPTIVE = Router("regime_adaptive", "regime_adaptive")
# the paper's aggregated analogue: 2 engines of 48 sequences (its 1P/2D's two decode
# workers), so the knee falls where the paper's did, C = 96…128
PAPER_POOL: dict[str, Any] = {"workers": 2, "kv_blocks": 8192, "max_num_seqs": 48}


def c_sweep(
    router: Router = KV_COST, cs: Sequence[int] = C_SWEEP, hold_s: float = 120.0, seed: int = 1
) -> list[dict[str, Any]]:
    """Exp. 1: the paper's workload at each C (ramp 10 s, then the hold)."""
    rows = []
    for c in cs:
        m, _ = run_one(router, c, seed, PAPER, hold_s=hold_s, poa_every_s=5.0, **PAPER_POOL)
        rows.append({"C": c, **m})
    return rows


def knee(rows: Sequence[dict[str, Any]]) -> tuple[int, float] | None:
    """The first C whose TTFT P99 is ≥ 10× the lowest C's (and that ratio)."""
    base = rows[0]["ttft_p99"]
    for r in rows:
        if r["ttft_p99"] >= 10 * base:
            return r["C"], r["ttft_p99"] / base
    return None


def grid(
    c: int, hold_s: float = 120.0, seed: int = 1, gateway_queue: bool = True
) -> list[dict[str, Any]]:
    """Exp. 4: the 4×4 (τ, ω) grid of static kv_cost at concurrency `c`."""
    rows = []
    for tau in GRID:
        for omega in GRID:
            r = Router(
                f"τ {tau} ω {omega}", "kv_cost", (("temperature", tau), ("overlap_weight", omega))
            )
            m, _ = run_one(
                r,
                c,
                seed,
                PAPER,
                hold_s=hold_s,
                gateway_queue=gateway_queue,
                poa_every_s=5.0,
                **PAPER_POOL,
            )
            rows.append({"tau": tau, "omega": omega, **m})
    return rows


@dataclass(frozen=True, slots=True)
class SpikePlan:
    base: int = 32
    peak: int = 128
    below_s: float = 40.0  # the paper's 120 / 180 / 120 s, shrunk
    saturated_s: float = 60.0
    recovery_s: float = 40.0


def spike(
    router: Router,
    seed: int,
    plan: SpikePlan = SpikePlan(),
    workload: Workload = PAPER,
    gateway_queue: bool = True,
) -> dict[str, Any]:
    """Exp. 3: C = base → peak → base; metrics per phase, and when the regime first left
    Below after the spike began (regime_adaptive)."""
    at, until = plan.below_s, plan.below_s + plan.saturated_s
    end = until + plan.recovery_s
    regimes: list[tuple[float, int]] = []

    window, poa_probe, poa = poa_sampler(10.0, end, 5.0)

    def probe(core: Any, now: float) -> None:
        r = core.routers.get("short")
        if r is not None and hasattr(r, "regime"):
            regimes.append((now, int(r.regime)))
        poa_probe(core, now)

    seqs = sessions(workload, plan.peak, int(end) + 8, seed)
    sc = scenario(
        {"policy": router.policy, "params": dict(router.params)},
        gateway_queue=gateway_queue,
        **PAPER_POOL,
    )
    shape = LoadShape(
        plan.peak,
        ramp_s=0.0,
        hold_s=end,
        seed=seed,
        spike=Spike(plan.peak - plan.base, at, until),
    )
    result, _ = simulate(sc, shape, seqs, seed=seed, probe=probe, hooks=(window,))
    phases = {"below": (10.0, at), "saturated": (at, until), "recovery": (until + 10.0, end)}
    out: dict[str, Any] = {}
    for name, (t0, t1) in phases.items():
        m = metrics(result, t0, t1)
        # PoA^ over a 30 s window: estimates once the window lies inside the phase
        xs = [r for t, r in poa if t0 + 30.0 <= t < t1] or [r for t, r in poa if t0 <= t < t1]
        m["poa"] = sum(xs) / len(xs) if xs else float("nan")
        out[name] = m
    switched = [t for t, g in regimes if t >= at and g >= 1]
    out["switch_s"] = switched[0] - at if switched else None
    out["regime_changes"] = sum(1 for a, b in itertools.pairwise(regimes) if a[1] != b[1])
    return out


def quiet_hold(c: int = 48, hold_s: float = 1800.0, seed: int = 1) -> dict[str, Any]:
    """The detector's false-alarm check (the brief's target: it never switches in a
    30-minute hold at 0.5·C*): regime_adaptive at the paper's defaults (baseline learnt in
    the first intervals) held at `c` on the paper's pool; the regime, L̄ and the
    thresholds sampled every second of virtual time."""
    regimes: list[tuple[float, int]] = []
    smoothed: list[float] = []
    seen: dict[str, Any] = {}

    def probe(core: Any, now: float) -> None:
        r = core.routers.get("short")
        if r is None or not hasattr(r, "detector"):
            return
        d = r.detector
        regimes.append((now, int(r.regime)))
        if d.smoothed is not None:
            smoothed.append(d.smoothed)
        seen["detector"] = d

    ramp_s = 10.0
    seqs = sessions(PAPER, c, int(hold_s + ramp_s) + 8, seed)
    sc = scenario({"policy": "regime_adaptive", "params": {}}, **PAPER_POOL)
    shape = LoadShape(c, ramp_s=ramp_s, hold_s=hold_s, seed=seed)
    result, _ = simulate(sc, shape, seqs, seed=seed, probe=probe)
    m = metrics(result, ramp_s, ramp_s + hold_s)
    d = seen.get("detector")
    return {
        "C": c,
        "hold_s": hold_s,
        "seed": seed,
        "regime_changes": sum(1 for a, b in itertools.pairwise(regimes) if a[1] != b[1]),
        "detector_changes": None if d is None else d.changes,
        "max_regime": max((g for _, g in regimes), default=None),
        "baseline": None if d is None else d.baseline,
        "theta1": None if d is None else d.theta1,
        "smoothed_max": max(smoothed, default=float("nan")),
        "smoothed_median": statistics.median(smoothed) if smoothed else float("nan"),
        **m,
    }


HETERO_ROUTERS = (
    *ROUTERS[:5],
    Router(
        "regime_adaptive (θ 1 s / 4 s)",
        "regime_adaptive",
        (("detector", {"theta1_s": 1.0, "theta2_s": 4.0}),),
    ),
)


# users read and type between turns: without a think time a closed loop makes least-loaded
# sticky by accident (the worker a client's answer just left is the least loaded)
THINK_S = 2.0


def heterogeneous(c: int, hold_s: float = 40.0, seed: int = 1) -> list[dict[str, Any]]:
    """The workload the paper never ran (`sessions`) at concurrency `c`, every router."""
    rows = []
    for r in HETERO_ROUTERS:
        m, _ = run_one(r, c, seed, Workload(), hold_s=hold_s, think_s=THINK_S)
        rows.append({"router": r.label, **m})
    return rows


def hetero_sweeps(c: int, hold_s: float = 40.0, seed: int = 1) -> list[dict[str, Any]]:
    """kv_cost on `sessions` at `c`: ω swept at τ 0, then τ swept at ω 1."""
    rows = []
    for omega in (0.0, 0.3, 1.0, 4.0):
        r = Router(f"ω {omega}", "kv_cost", (("overlap_weight", omega),))
        m, _ = run_one(r, c, seed, Workload(), hold_s=hold_s, think_s=THINK_S)
        rows.append({"tau": 0.0, "omega": omega, **m})
    for tau in (0.3, 0.7, 1.0):
        r = Router(f"τ {tau}", "kv_cost", (("temperature", tau),))
        m, _ = run_one(r, c, seed, Workload(), hold_s=hold_s, think_s=THINK_S)
        rows.append({"tau": tau, "omega": 1.0, **m})
    return rows
