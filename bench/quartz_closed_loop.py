"""The QUARTZ paper's Table 4 protocol under CLOSED-LOOP load (issue 25): the load is a
number of clients, each sending its next request when its previous one is answered
(simulator/closed_loop.py), as the paper's "Load" column (40 / 28 / 18 clients) reads.

    python bench/quartz_closed_loop.py --out out/quartz-cl             # both engines
    python bench/quartz_closed_loop.py --quick --out out/quartz-cl-q   # a small look
    python bench/quartz_closed_loop.py --ray auto ...                  # on a Ray cluster

Per engine model (bench/quartz_protocol.py ENGINES: `fleetopt`, `compute`):
1. Sweep client counts (`--clients`) for FIFO-LL (gateway queue, late binding), FIFO-LL
   forwarding on arrival, PointPred, QUARTZ (the paper's key) and QUARTZ θ=2.5 s λ=1, on
   the Mixed workload (bench/quartz_protocol.py's trace: Chat 70 % + RAG 30 % by draw,
   prefix reuse, max_tokens = output), clients by application (chat clients send chat,
   RAG clients RAG: simulator/closed_loop.py `deal`), no think time, a ramp of 5 s, each
   run capped at `--requests` requests (default 1,000, the paper's 3,000 shrunk to fit a
   shared 2-core machine); seeds 1–3.
2. The operating point: the fewest clients at which FIFO-LL misses ≥ 15 % of its SLOs
   (mean over seeds; the paper's FIFO-LL misses 18.8–35.1 % at its operating points, and in
   a closed loop P99 > 2 s comes well before any violation: `knee`).
3. There: Table 5's ablations and Table 8's fairness rows (Mixed, and Mixed Bursty:
   think time 1 s, ÷4 in 2 s bursts every 20 s — synchronised think-time drops).
Writes rows.json and tables.md; the figure is bench/quartz_closed_loop_fig.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from simulator.closed_loop import Bursts, LoadShape, deal, simulate
from simulator.sweep import run_jobs
from tests.experiments.quartz_experiments import (
    ABLATIONS,
    BOUNDED,
    BY_NAME,
    DISPATCH,
    FORWARD_LL,
    PAPER_T4,
    PAPER_T5,
    PAPER_T8,
)
from tests.experiments.quartz_protocol import (
    BURSTY,
    ENGINES,
    NOMINAL,
    VARIANTS,
    metrics,
    scenario_for,
    trace,
)

T4_METHODS = ("FIFO-LL", FORWARD_LL, "PointPred", "QUARTZ", BOUNDED)
T8_METHODS = ("FIFO-LL", FORWARD_LL, "TokenFair", "No Fairness", "QUARTZ", BOUNDED)
RAMP_S = 5.0
POINT_VIOLATION = 0.15
BURSTY_THINK_S = 1.0


@dataclass(frozen=True, slots=True)
class CLJob:
    method: str
    variant: str
    clients: int
    seed: int
    requests: int
    engine: str
    think_s: float = 0.0
    extras: tuple[str, ...] = field(default_factory=tuple)


def sequences(variant: str, clients: int, requests: int, seed: int) -> list[list[Any]]:
    """The clients' request sequences: a draw of 3 × `requests` from the variant's trace
    (enough that no client runs out before the run's cap), dealt by application."""
    specs = trace(VARIANTS[variant], 10.0, 3 * requests, seed)
    return deal(specs, clients, names={"interactive": "chat", "long": "rag"})


def shape_for(job: CLJob) -> LoadShape:
    bursts = Bursts(20.0, 2.0, 4.0) if VARIANTS[job.variant].bursty else None
    return LoadShape(
        job.clients,
        think_s=job.think_s,
        ramp_s=RAMP_S,
        requests=job.requests,
        bursts=bursts,
        seed=job.seed,
    )


def run_cl(job: CLJob) -> dict[str, Any]:
    """One closed-loop run's metrics (picklable; a pure function of the job)."""
    t = time.process_time()
    method = BY_NAME[job.method]
    variant = VARIANTS[job.variant]
    sc = scenario_for(method, variant, 10.0, job.requests, DISPATCH, ENGINES[job.engine])
    result, loop = simulate(
        sc, shape_for(job), sequences(job.variant, job.clients, job.requests, job.seed), job.seed
    )
    m = metrics(result)
    ok = [r for r in result.records if r.status == "ok"]
    m.update(
        method=job.method,
        variant=job.variant,
        clients=job.clients,
        seed=job.seed,
        engine=job.engine,
        max_outstanding=loop.max_outstanding,
        rag_share=sum(1 for r in result.records if r.slo_class == "long") / len(result.records),
        rps=len(ok) / max(result.end, 1e-9),
        cpu_s=time.process_time() - t,
    )
    return m


def group(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str, int], dict[str, Any]]:
    """Mean and spread (min–max over seeds) of every number, by (engine, method, variant,
    clients)."""
    by: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["engine"], r["method"], r["variant"], r["clients"]), []).append(r)
    out = {}
    for key, rs in by.items():
        agg: dict[str, Any] = {"seeds": len(rs)}
        for k, v in rs[0].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "seed":
                vals = [float(r[k]) for r in rs]
                agg[k] = float(np.mean(vals))
                agg[k + "_lo"], agg[k + "_hi"] = min(vals), max(vals)
        out[key] = agg
    return out


def knee(
    g: dict[tuple[str, str, str, int], dict[str, Any]], engine: str, counts: Sequence[int]
) -> int:
    """The operating point: the fewest clients at which FIFO-LL misses at least
    `POINT_VIOLATION` of its SLOs (mean over seeds; the paper's FIFO-LL misses 18.8–35.1 %
    at its three operating points); the largest count swept when it never does."""
    for n in sorted(counts):
        m = g.get((engine, "FIFO-LL", NOMINAL.name, n))
        if m is not None and m["violation"] >= POINT_VIOLATION:
            return n
    return max(counts)


def _cell(m: dict[str, Any], k: str, scale: float = 1000.0, fmt: str = ",.0f") -> str:
    return f"{scale * m[k]:{fmt}} [{scale * m[k + '_lo']:{fmt}}–{scale * m[k + '_hi']:{fmt}}]"


def _rel(a: float, b: float) -> str:
    return f"{100 * (a - b) / b:+.1f} %" if b else "-"


def tables(rows: list[dict[str, Any]], counts: dict[str, list[int]], knees: dict[str, int]) -> str:
    g = group(rows)
    out = ["# QUARTZ under closed-loop load (simulator)", ""]
    for engine, ns in counts.items():
        out += [
            f"## engine `{engine}` — sweep (P99 TTFT ms [min–max over seeds] / violations %)",
            "",
            "| clients | " + " | ".join(T4_METHODS) + " |",
            "|---" * (len(T4_METHODS) + 1) + "|",
        ]
        for n in ns:
            cells = []
            for name in T4_METHODS:
                m = g.get((engine, name, NOMINAL.name, n))
                cells.append(
                    "-" if m is None else f"{_cell(m, 'p99_ttft')} / {100 * m['violation']:.1f}"
                )
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        k = knees[engine]
        out += [
            "",
            f"### Table 4 at the operating point: {k} clients (engine `{engine}`); paper: 14B, 28 clients",
            "",
            "| method | P95 ms | P99 ms | viol. % | chat / RAG viol. % | throughput tok/s | "
            "RAG share | paper P99 | paper viol. |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in T4_METHODS:
            m = g.get((engine, name, NOMINAL.name, k))
            if m is None:
                continue
            pp = PAPER_T4.get(name)
            out.append(
                f"| {name} | {_cell(m, 'p95_ttft')} | {_cell(m, 'p99_ttft')} | "
                f"{_cell(m, 'violation', 100, '.1f')} | {100 * m['violation_chat']:.1f} / "
                f"{100 * m['violation_rag']:.1f} | {m['throughput']:,.0f} | "
                f"{m['rag_share']:.2f} | {pp[1] if pp else '-'} | {pp[2] if pp else '-'} |"
            )
        q = g.get((engine, "QUARTZ", NOMINAL.name, k))
        for base in ("FIFO-LL", FORWARD_LL):
            b = g.get((engine, base, NOMINAL.name, k))
            for name in ("QUARTZ", BOUNDED):
                m = g.get((engine, name, NOMINAL.name, k))
                if m and b:
                    out.append(
                        f"\n{name} vs {base}: P99 {_rel(m['p99_ttft'], b['p99_ttft'])} "
                        f"(paper −29.3 %), violations {100 * b['violation']:.1f} → "
                        f"{100 * m['violation']:.1f} % (paper 26.4 → 15.8 %)."
                    )
        if q is None:
            continue
        t5 = [(engine, n, NOMINAL.name, k) for n in (*[a.name for a in ABLATIONS], "QUARTZ")]
        if any(g.get(x) for x in t5):
            out += [
                "",
                f"### Table 5 (ablations) at {k} clients, engine `{engine}`",
                "",
                "| variant | P99 ms | viol. % | throughput | Jain (TTFT) | paper P99 / viol. / Jain |",
                "|---|---|---|---|---|---|",
            ]
            for key in t5:
                m = g.get(key)
                if m is None:
                    continue
                pp5 = PAPER_T5.get(key[1])
                out.append(
                    f"| {key[1]} | {_cell(m, 'p99_ttft')} | {100 * m['violation']:.1f} | "
                    f"{m['throughput']:,.0f} | {m['jain_ttft']:.3f} | "
                    + (f"{pp5[0]} / {pp5[1]} / {pp5[3]}" if pp5 else "-")
                    + " |"
                )
        rows8 = [
            (v, n)
            for v in (NOMINAL.name, BURSTY.name)
            for n in T8_METHODS
            if g.get((engine, n, v, k))
        ]
        if rows8:
            out += [
                "",
                f"### Table 8 (fairness) at {k} clients, engine `{engine}` (Mixed Bursty: "
                f"think {BURSTY_THINK_S:g} s ÷4 in bursts)",
                "",
                "| workload | method | Jain (TTFT) | Jain (latency) | max wait s | long slowdown | "
                "P99 ms | paper Jain / max wait / slowdown |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for v, n in rows8:
                m = g[(engine, n, v, k)]
                pv = "Mixed" if v == NOMINAL.name else "Mixed Bursty"
                p8 = PAPER_T8.get((pv, n))
                out.append(
                    f"| {v} | {n} | {m['jain_ttft']:.3f} | {m['jain']:.3f} | "
                    f"{m['max_wait']:.1f} | {m['long_slowdown']:.2f} | {1000 * m['p99_ttft']:,.0f} | "
                    + (f"{p8[0]} / {p8[1]} / {p8[2]}" if p8 else "-")
                    + " |"
                )
        out.append("")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/quartz-cl"))
    ap.add_argument("--engines", default="fleetopt,compute")
    ap.add_argument("--clients", default="", help="engine:n,n,…;engine:… (default per engine)")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ray", default=None, help="auto | ADDRESS | local: run on Ray")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-knee", action="store_true", help="skip Tables 5 and 8")
    a = ap.parse_args()
    engines = a.engines.split(",")
    default = {
        "fleetopt": [192, 256, 272, 288, 304, 320, 384],
        "compute": [128, 192, 224, 256, 288, 320, 384],
    }
    counts = {e: default[e] for e in engines}
    for part in filter(None, a.clients.split(";")):
        e, ns = part.split(":")
        counts[e] = [int(x) for x in ns.split(",")]
    seeds = [int(s) for s in a.seeds.split(",")]
    if a.quick:
        counts = {e: ns[::2] for e, ns in counts.items()}
        seeds, a.requests = seeds[:1], min(a.requests, 600)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sweep = [
        CLJob(m, NOMINAL.name, n, s, a.requests, e)
        for e in engines
        for n in counts[e]
        for m in T4_METHODS
        for s in seeds
    ]
    rows = run_jobs(run_cl, sweep, a.workers, a.ray)
    g = group(rows)
    knees = {e: knee(g, e, counts[e]) for e in engines}
    print("sweep done", f"{time.perf_counter() - t0:.0f} s", knees, flush=True)
    (a.out / "rows.json").write_text(json.dumps(rows, indent=0) + "\n")
    if not a.no_knee:
        extra = [
            CLJob(m.name, NOMINAL.name, knees[e], s, a.requests, e)
            for e in engines
            for m in ABLATIONS
            for s in seeds
        ] + [
            CLJob(n, v, knees[e], s, a.requests, e, BURSTY_THINK_S if v == BURSTY.name else 0.0)
            for e in engines
            for v in (NOMINAL.name, BURSTY.name)
            for n in T8_METHODS
            if not (v == NOMINAL.name and n in T4_METHODS)
            for s in seeds
        ]
        rows += run_jobs(run_cl, extra, a.workers, a.ray)
    (a.out / "rows.json").write_text(json.dumps(rows, indent=0) + "\n")
    text = tables(rows, counts, knees)
    text += f"\n{len(rows)} runs, {time.perf_counter() - t0:.0f} s wall, "
    text += f"{sum(r['cpu_s'] for r in rows):.0f} s CPU, {a.workers} workers\n"
    (a.out / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
