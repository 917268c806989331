"""The QUARTZ evaluation protocol (the QUARTZ paper, §5) as simulator runs: methods,
workloads, one run's metrics. `bench/quartz_experiments.py` sweeps these and prints tables.

Methods are configurations over identical traces: a router, a dispatcher (the gateway's
admission queue) and their parameters, applied to the same `RequestSpec`s — a trace is
fixed by (workload variant, offered load, seed), never by the method.

Workload (the paper's Mixed: Chat 70 % + RAG 30 %, per-class TTFT SLOs 2 s / 4 s) is
`simulator/scenarios/quartz-mixed.yaml`'s, with three things the shipped families do not
draw and the protocol needs, added to the generated specs here (`shape`):
- prefix reuse: a request reuses a shared prefix (a chat's system prompt and earlier turns,
  a RAG answer's popular retrieved passages) with probability `Reuse.share`, picking one
  of `Reuse.groups` prefixes per category with Zipf(1.1) popularity; the prefix is a
  whole number of 16-token KV blocks, so the engine's prefix cache and the gateway's
  locality index see it (nominal share 0.6; the "low reuse" shift 0.1);
- clients by application: chat requests come from 12 chat clients, RAG requests from
  4 RAG clients, so that a size-aware queue's bias against long prompts shows up as
  unfairness *between clients* (the paper's Table 8); with clients drawn independently
  of the request type every client sees the same mix and Jain's index is 1 by design;
- the generation budget: `max_tokens` = the output length (nominal), or 2–8× it
  ("large budget" shift: clients ask far more than they use; the work done is unchanged).

Metrics per run (`metrics`): P95/P99 TTFT, SLO violation rate (a request without a first
token counts as violated), throughput (prompt + output tokens of completed requests over
first arrival → last finish), Jain's index over clients of 1/mean slowdown (the
simulator's report definition, latency-based) and of 1/mean TTFT slowdown, the maximum and P99 wait (arrival → engine admission:
gateway queue plus engine queue), the mean slowdown of long-class requests, and — when
the run's records carry predicted quantiles (the QUARTZ predictor's) — coverage.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from simulator import report
from simulator.families import chain_hashes, mix64
from simulator.run import RunResult, build_workload, run
from simulator.scenario import Scenario, parse, resolve
from simulator.theory import EngineTiming, capacity, mean_slot_steps
from simulator.workloads import RequestSpec
from tests.experiments.quartz_oracle import oracle_extras

BASE = "quartz-mixed"
BLOCK = 16  # the engine's KV block size: prefixes must be whole blocks to hit


@dataclass(frozen=True, slots=True)
class Method:
    """A configuration of the pipeline: router and dispatcher with their parameters."""

    name: str
    routing: str
    dispatch: str = "fifo"
    routing_params: Mapping[str, Any] = field(default_factory=dict)
    dispatch_params: Mapping[str, Any] = field(default_factory=dict)
    quartz: Mapping[str, Any] | None = None  # the predictor's settings (policy.quartz)
    # the protocol's shared dispatch settings this method replaces (e.g. no gateway queue:
    # capacity "none", prefill_room None — forward on arrival, the engines queue)
    dispatch_settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reuse:
    share: float = 0.6  # probability a request reuses one of its category's prefixes
    groups: int = 16  # distinct shared prefixes per category
    chat_prefix: tuple[int, int] = (128, 512)  # prefix length range, tokens (system + history)
    rag_prefix: tuple[int, int] = (1024, 3072)  # popular retrieved passages


@dataclass(frozen=True, slots=True)
class Variant:
    """A workload variant of Mixed (Table 7's shifts are three of these)."""

    name: str
    rag_weight: float = 0.3
    reuse: Reuse = Reuse()
    budget: tuple[float, float] = (1.0, 1.0)  # max_tokens = output × U(lo, hi)
    bursty: bool = False  # Mixed Bursty: 4× bursts of 2 s every 20 s on the same mean rate


NOMINAL = Variant("Nominal Mixed")
SHIFTS = (
    Variant("More RAG", rag_weight=0.5),
    Variant("Low Reuse", reuse=Reuse(share=0.1, groups=64)),
    Variant("Large Budget", budget=(2.0, 8.0)),
)
BURSTY = Variant("Mixed Bursty", bursty=True)
VARIANTS = {v.name: v for v in (NOMINAL, *SHIFTS, BURSTY)}

# The engine the fleet runs (`fleet.engine` of the scenario). `fleetopt`: the engine model's
# default W + H·n step, where a prefill never slows anyone else down. `compute`: prefill is
# compute-bound as on a GPU (0.1 ms per prompt token a step computes, ~10k prompt tokens/s,
# and vLLM's per-step budget of 2,048 tokens shared by prefill chunks in admission order), so
# a long prompt delays the prompts behind it: the head-of-line blocking QUARTZ is about.
ENGINES: dict[str, dict[str, Any]] = {
    "fleetopt": {},
    "compute": {"prefill_token_s": 0.0001, "max_num_batched_tokens": 2048},
}


def base_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(resolve(BASE).read_text())
    return doc


def scenario_for(
    method: Method,
    variant: Variant,
    rate: float,
    requests: int,
    dispatch: Mapping[str, Any],
    engine: Mapping[str, Any] | None = None,
) -> Scenario:
    """quartz-mixed at `rate` req/s with the method's policies; `dispatch` are the
    protocol's shared dispatch settings (capacity, room limit), the method's policy and
    parameters on top; `engine` overrides the fleet's engine parameters (ENGINES)."""
    doc = base_doc()
    if engine:
        doc["fleet"]["engine"] = {**doc["fleet"].get("engine", {}), **engine}
    doc["workload"]["requests"] = requests
    if variant.bursty:
        doc["workload"]["arrivals"] = {
            "kind": "bursty",
            "rate": rate,
            "burst_factor": 4,
            "burst_every": 20,
            "burst_duration": 2,
        }
    else:
        doc["workload"]["arrivals"] = {"kind": "poisson", "rate": rate}
    doc["workload"]["components"] = [
        {"family": "chat", "weight": 1.0 - variant.rag_weight},
        {"family": "rag", "weight": variant.rag_weight},
    ]
    doc["policy"]["routing"] = {"policy": method.routing, "params": dict(method.routing_params)}
    doc["policy"]["dispatch"] = {
        **dispatch,
        **method.dispatch_settings,
        "policy": method.dispatch,
        **({"params": dict(method.dispatch_params)} if method.dispatch_params else {}),
    }
    if method.quartz is not None:
        doc["policy"]["quartz"] = dict(method.quartz)
    doc["report"] = {"plots": False, "sample_interval": 5.0}
    return parse(doc, f"{BASE}[{method.name}, {variant.name}, {rate}/s]")


def shape(specs: list[RequestSpec], variant: Variant, seed: int) -> list[RequestSpec]:
    """The protocol's additions to the generated trace (module docstring): prefix reuse,
    clients by application, the generation budget. Deterministic in (specs, variant, seed)."""
    rng = random.Random(f"{seed}:quartz-protocol:{variant.reuse}:{variant.budget}")
    ru = variant.reuse
    zipf = [1.0 / (k + 1) ** 1.1 for k in range(ru.groups)]
    out = []
    for i, s in enumerate(specs):
        rag = s.slo_class == "long"
        lo, hi = ru.rag_prefix if rag else ru.chat_prefix
        client = f"rag-{rng.randrange(4)}" if rag else f"chat-{rng.randrange(12):02d}"
        hashes: tuple[int, ...] = ()
        if rng.random() < ru.share:
            group = rng.choices(range(ru.groups), zipf)[0]
            template = (2 if rag else 1) * 1_000_003 + group
            glen = random.Random(mix64(template)).randint(lo, hi)
            shared = min(glen, s.prompt_tokens) // BLOCK
            hashes = chain_hashes(s.prompt_tokens, BLOCK, (template, shared), mix64(seed * 7 + i))
        budget = s.output_tokens
        if variant.budget != (1.0, 1.0):
            budget = round(s.output_tokens * rng.uniform(*variant.budget))
            budget = max(s.output_tokens, min(budget, 8192 - s.prompt_tokens))
        out.append(replace(s, client=client, prefix_hashes=hashes, max_tokens=budget))
    return out


def trace(variant: Variant, rate: float, requests: int, seed: int) -> list[RequestSpec]:
    """The trace every method runs at this (variant, load, seed)."""
    sc = scenario_for(Method("trace", "least_loaded"), variant, rate, requests, {})
    return shape(build_workload(sc, seed, requests), variant, seed)


def capacity_rps(variant: Variant = NOMINAL, seed: int = 1, requests: int = 3000) -> float:
    """Requests/s the fleet completes with every slot busy (simulator/theory.py; no
    prefix-cache hits), to express an offered load as a fraction of capacity."""
    sc = scenario_for(Method("trace", "least_loaded"), variant, 10.0, requests, {})
    pool = sc.fleet.pools[0]
    cfg = sc.engine_config(pool)
    specs = trace(variant, 10.0, requests, seed)
    k = mean_slot_steps(((s.prompt_tokens, s.output_tokens) for s in specs), cfg.prefill_chunk)
    return capacity(
        pool.workers, k, EngineTiming(cfg.w, cfg.h, cfg.prefill_chunk, cfg.max_num_seqs)
    )


# -- metrics -------------------------------------------------------------------------------
def _p(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def metrics(result: RunResult) -> dict[str, Any]:
    """The protocol's numbers for one run (module docstring)."""
    rep = report.build(result, include_series=False)
    recs = result.records
    ok = [r for r in recs if r.status == "ok" and r.first_token is not None]
    ttft = [r.first_token - r.arrival for r in ok]  # type: ignore[operator]
    wait = [r.scheduled - r.arrival for r in ok if r.scheduled is not None]
    gateway_wait = [r.dispatch - r.arrival for r in ok if r.dispatch is not None]
    t0 = min(r.arrival for r in recs)
    t1 = max((r.finish for r in ok if r.finish is not None), default=t0 + 1e-9)
    tokens = sum(r.prompt_tokens + r.completion_tokens for r in ok)
    cfg = result.scenario.engine_config(result.scenario.fleet.pools[0])
    slow_long = [
        (r.finish - r.arrival)  # type: ignore[operator]
        / ((math.ceil(r.prompt_tokens / cfg.prefill_chunk) + r.completion_tokens) * (cfg.w + cfg.h))
        for r in ok
        if r.slo_class == "long"
    ]
    classes = rep["slo"]["classes"]
    out: dict[str, Any] = {
        "requests": len(recs),
        "completed": len(ok),
        "p50_ttft": _p(ttft, 50),
        "p95_ttft": _p(ttft, 95),
        "p99_ttft": _p(ttft, 99),
        "violation": rep["slo"]["violation_rate"],
        "violation_chat": classes.get("interactive", {}).get("violation_rate", float("nan")),
        "violation_rag": classes.get("long", {}).get("violation_rate", float("nan")),
        "p99_chat": classes.get("interactive", {}).get("ttft", {}).get("p99", float("nan")),
        "p99_rag": classes.get("long", {}).get("ttft", {}).get("p99", float("nan")),
        "throughput": tokens / max(t1 - t0, 1e-9),
        "jain": rep["fairness"]["jain"],
        "jain_ttft": _jain_ttft(ok, cfg),
        "max_wait": max(wait, default=0.0),
        "p99_wait": _p(wait, 99),
        "max_gateway_wait": max(gateway_wait, default=0.0),
        "long_slowdown": float(np.mean(slow_long)) if slow_long else float("nan"),
        "prefix_hit_rate": rep["pools"][result.scenario.fleet.pools[0].name].get(
            "prefix_hit_rate", 0.0
        ),
    }
    out.update(coverage(result))
    return out


def _jain_ttft(ok: list[Any], cfg: Any) -> float:
    """Jain's index over clients of 1 / mean TTFT slowdown (TTFT over the unloaded TTFT,
    (⌈L_in/C⌉ + 1)·(W + H)): the simulator's Jain uses end-to-end latency, which decode
    dominates here, so queueing unfairness barely moves it; this one sees the queue."""
    by_client: dict[str, list[float]] = defaultdict(list)
    for r in ok:
        alone = (math.ceil(r.prompt_tokens / cfg.prefill_chunk) + 1) * (cfg.w + cfg.h)
        by_client[r.client].append((r.first_token - r.arrival) / alone)
    return report.jain([1.0 / float(np.mean(v)) for _, v in sorted(by_client.items())])


def coverage(result: RunResult, alpha: float = 0.95) -> dict[str, Any]:
    """Coverage of the predicted q_α against the observed prefill time, when the records
    carry both (`predicted`, `prefill_s`: runs with QUARTZ's predictor): the share with observed ≤ predicted, and the
    mean signed residual (predicted − observed) over the under-covered requests, i.e. how
    far too optimistic the predictor was when it was wrong, in seconds."""
    pairs = [
        (r.predicted.at(alpha), r.prefill_s)
        for r in result.records
        if r.predicted is not None and r.prefill_s is not None
    ]
    if not pairs:
        return {}
    covered = sum(1 for q, o in pairs if o <= q)
    under = [q - o for q, o in pairs if o > q]
    return {
        "coverage": covered / len(pairs),
        "residual": float(np.mean([q - o for q, o in pairs])),
        "under_residual": float(np.mean(under)) if under else 0.0,
        "predicted": len(pairs),
    }


# -- one job ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Job:
    method: Method
    variant: Variant
    rate: float
    seed: int
    requests: int
    dispatch: Mapping[str, Any]
    engine: Mapping[str, Any] = field(default_factory=dict)


# extra arguments to simulator.run.run for a method (the oracle's hooks and routers)
Extras = Callable[[Job, Scenario, list[RequestSpec]], dict[str, Any]]
EXTRAS: dict[str, Extras] = {
    "Oracle": lambda job, sc, specs: oracle_extras(
        tuple((p.name, p.workers) for p in sc.fleet.pools)
    ),
}


def run_job(job: Job) -> dict[str, Any]:
    """Run one (method, variant, load, seed) and return its metrics (picklable)."""
    sc = scenario_for(job.method, job.variant, job.rate, job.requests, job.dispatch, job.engine)
    specs = trace(job.variant, job.rate, job.requests, job.seed)
    extra = EXTRAS[job.method.name](job, sc, specs) if job.method.name in EXTRAS else {}
    result = run(sc, seed=job.seed, specs=specs, **extra)
    m = metrics(result)
    m.update(method=job.method.name, variant=job.variant.name, rate=job.rate, seed=job.seed)
    return m


def mean_over_seeds(rows: list[dict[str, Any]]) -> dict[tuple[str, str, float], dict[str, Any]]:
    """Rows of the same (method, variant, rate) averaged over seeds (numbers only)."""
    groups: dict[tuple[str, str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["variant"], r["rate"])].append(r)
    out = {}
    for key, rs in groups.items():
        avg: dict[str, Any] = {"seeds": len(rs)}
        for k, v in rs[0].items():
            if (
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and k not in ("rate", "seed")
            ):
                vals = [r[k] for r in rs if isinstance(r.get(k), (int, float))]
                avg[k] = float(np.mean(vals)) if vals else float("nan")
        out[key] = avg
    return out


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    import json

    path.write_text(json.dumps(rows, indent=0, default=str) + "\n")
