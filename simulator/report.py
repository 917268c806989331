"""The report of a run: latency percentiles, SLOs, throughput, utilisation, fairness, balance.

Definitions (T = makespan, from the first arrival to the last event):
- TTFT = first token − arrival at the gateway; TPOT = (finish − first token)/(completion−1)
  over requests with ≥ 2 tokens; latency = finish − arrival; queue wait = engine admission
  − arrival. Percentiles are numpy's linear ones.
- SLO violation rate, per class and overall: the share of a class's requests whose TTFT
  exceeded the class's target (QUARTZ §5.2: 2 s interactive, 4 s long-context), counting
  a request that never produced a token (rejected, failed) as a violation. Classes with
  no target are reported but not counted.
- Throughput: output tokens / T, and prompt + output tokens / T.
- Utilisation of a pool: Σ batch_size·duration / (workers · max_num_seqs · T), the
  slot-time busy fraction; `busy` is the share of worker-time spent stepping at all.
- Jain's fairness index over clients, J = (Σx)²/(n·Σx²), of x_c = 1 / (mean slowdown of
  client c), slowdown = latency / the request's unloaded service time
  ((⌈L_in/C⌉ + L_out)·(W + H), Eq. 4 alone on an idle engine). 1 is perfectly fair.
- Token-load imbalance: the mean over samples of 1 − mean_g L_g / max_g L_g (see
  `records.py`), per pool.

The report is a plain dict of numbers and strings: equal runs give equal JSON.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from simulator.run import RunResult


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def _pct(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    a = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {
        "n": len(values),
        "mean": _r(a.mean()),
        "p50": _r(p50),
        "p95": _r(p95),
        "p99": _r(p99),
        "max": _r(a.max()),
    }


def jain(values: list[float]) -> float:
    if not values:
        return 1.0
    s, s2 = sum(values), sum(v * v for v in values)
    return s * s / (len(values) * s2) if s2 > 0 else 1.0


def build(result: RunResult, include_series: bool = True) -> dict[str, Any]:
    sc = result.scenario
    recs = result.records
    t0 = min((r.arrival for r in recs), default=0.0)
    span = max(result.end - t0, 1e-9)
    ok = [r for r in recs if r.status == "ok"]
    ttft = [r.first_token - r.arrival for r in ok if r.first_token is not None]
    tpot = [
        (r.finish - r.first_token) / (r.completion_tokens - 1)
        for r in ok
        if r.first_token is not None and r.finish is not None and r.completion_tokens > 1
    ]
    latency = [r.finish - r.arrival for r in ok if r.finish is not None]
    wait = [r.scheduled - r.arrival for r in ok if r.scheduled is not None]
    out_tokens = sum(r.completion_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)

    by_class: dict[str, list[Any]] = defaultdict(list)
    for r in recs:
        by_class[r.slo_class].append(r)
    slo: dict[str, Any] = {"targets": dict(sc.slo), "classes": {}}
    counted = violated = 0
    for cls in sorted(by_class):
        rs = by_class[cls]
        target = sc.slo.get(cls)
        t = [
            r.first_token - r.arrival for r in rs if r.status == "ok" and r.first_token is not None
        ]
        entry: dict[str, Any] = {"requests": len(rs), "ttft": _pct(t)}
        if target is not None:
            bad = sum(
                1
                for r in rs
                if r.status != "ok" or r.first_token is None or r.first_token - r.arrival > target
            )
            entry["target"] = target
            entry["violation_rate"] = _r(bad / len(rs))
            counted += len(rs)
            violated += bad
        slo["classes"][cls] = entry
    slo["violation_rate"] = _r(violated / counted) if counted else None

    pools: dict[str, Any] = {}
    pool_cfg = {p.name: sc.engine_config(p) for p in sc.fleet.pools}
    served = Counter(r.pool for r in ok)
    for name, ps in result.pools.items():
        series = result.series.pools[name]
        imb = [x for x in series.imbalance if x is not None]
        pools[name] = {
            "workers": ps.workers,
            "slots": ps.slots,
            "requests": served.get(name, 0),
            "utilisation": _r(ps.busy_slot_seconds / (ps.workers * ps.slots * span)),
            "busy": _r(ps.busy_time / (ps.workers * span)),
            "mean_batch": _r(ps.busy_slot_seconds / ps.busy_time) if ps.busy_time else 0.0,
            "steps": ps.steps,
            "imbalance": _r(sum(imb) / len(imb)) if imb else None,
            **{k: _r(v) for k, v in result.engine_stats.get(name, {}).items()},
        }

    slowdown: dict[str, list[float]] = defaultdict(list)
    for r in ok:
        # an ok request was dispatched (pool) and finished (finish): driver.finished
        assert r.pool is not None and r.finish is not None
        cfg = pool_cfg[r.pool]
        alone = (math.ceil(r.prompt_tokens / cfg.prefill_chunk) + r.completion_tokens) * (
            cfg.w + cfg.h
        )
        slowdown[r.client].append((r.finish - r.arrival) / alone)
    per_client = [1.0 / (sum(v) / len(v)) for _, v in sorted(slowdown.items())]

    report: dict[str, Any] = {
        "scenario": sc.name,
        "seed": result.seed,
        "requests": len(recs),
        "completed": len(ok),
        "status": dict(sorted(Counter(r.status for r in recs).items())),
        "virtual_seconds": _r(span),
        "events": result.events,
        "ttft": _pct(ttft),
        "tpot": _pct(tpot),
        "latency": _pct(latency),
        "queue_wait": _pct(wait),
        "slo": slo,
        "throughput": {
            "output_tokens_per_s": _r(out_tokens / span),
            "total_tokens_per_s": _r((out_tokens + in_tokens) / span),
            "requests_per_s": _r(len(ok) / span),
        },
        "pools": pools,
        "fairness": {"clients": len(per_client), "jain": _r(jain(per_client))},
    }
    if include_series:
        s = result.series
        report["series"] = {
            "interval": s.interval,
            "t": [_r(x) for x in s.t],
            "tokens_per_s": [_r(x) for x in s.tokens_per_s],
            "pools": {
                name: {
                    "utilisation": [_r(x) for x in p.utilisation],
                    "running": p.running,
                    "waiting": p.waiting,
                    "in_flight": p.in_flight,
                    "imbalance": [None if x is None else _r(x) for x in p.imbalance],
                }
                for name, p in s.pools.items()
            },
        }
    return report


def _ms(x: float | int | None) -> str:
    return "-" if x is None else f"{1000 * x:,.0f}"


def table(report: dict[str, Any]) -> str:
    """The report as a few aligned plain-text tables."""
    lines = [
        f"scenario {report['scenario']}  seed {report['seed']}  requests {report['requests']}"
        f"  completed {report['completed']}  status {report['status']}",
        f"virtual time {report['virtual_seconds']:.1f} s  events {report['events']:,}",
        "",
        f"{'metric (ms)':<14}{'mean':>10}{'p50':>10}{'p95':>10}{'p99':>10}{'max':>10}",
    ]
    for key in ("ttft", "tpot", "latency", "queue_wait"):
        p = report[key]
        if p.get("n"):
            lines.append(
                f"{key:<14}"
                + "".join(f"{_ms(p[k]):>10}" for k in ("mean", "p50", "p95", "p99", "max"))
            )
    lines.append("")
    lines.append(
        f"{'SLO class':<14}{'requests':>10}{'target s':>10}{'TTFT p99':>10}{'violated':>10}"
    )
    for cls, e in report["slo"]["classes"].items():
        vr = e.get("violation_rate")
        lines.append(
            f"{cls:<14}{e['requests']:>10}{e.get('target', '-'):>10}{_ms(e['ttft'].get('p99')):>10}"
            f"{'-' if vr is None else f'{100 * vr:.1f}%':>10}"
        )
    overall = report["slo"]["violation_rate"]
    lines.append(
        f"{'all':<14}{'':>10}{'':>10}{'':>10}{'-' if overall is None else f'{100 * overall:.1f}%':>10}"
    )
    lines.append("")
    tp = report["throughput"]
    lines.append(
        f"throughput {tp['output_tokens_per_s']:,.0f} output tok/s, {tp['total_tokens_per_s']:,.0f} total tok/s,"
        f" {tp['requests_per_s']:.2f} req/s   Jain over {report['fairness']['clients']} clients"
        f" {report['fairness']['jain']:.3f}"
    )
    lines.append("")
    lines.append(
        f"{'pool':<10}{'workers':>8}{'slots':>7}{'requests':>10}{'util':>8}{'busy':>8}{'batch':>8}{'imbal':>8}{'preempt':>9}{'prefix hit':>11}"
    )
    for name, p in report["pools"].items():
        imb = "-" if p["imbalance"] is None else f"{p['imbalance']:.3f}"
        lines.append(
            f"{name:<10}{p['workers']:>8}{p['slots']:>7}{p['requests']:>10}{p['utilisation']:>8.3f}"
            f"{p['busy']:>8.3f}{p['mean_batch']:>8.1f}{imb:>8}{p.get('preemptions', 0):>9.0f}"
            f"{100 * p.get('prefix_hit_rate', 0):>10.1f}%"
        )
    return "\n".join(lines)


def write_json(report: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(report, indent=1, sort_keys=False) + "\n")
