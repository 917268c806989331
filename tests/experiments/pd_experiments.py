"""Disaggregated P/D pools in the simulator: the paper's Experiment 1 (the knee) on a 1P/2D
and a 1P/5D topology ("The Price of Anarchy in Disaggregated Inference", §8; docs/PD.md).

    python bench/pd_experiments.py --out out/pd            # C swept 1…512, both topologies
    python bench/pd_experiments.py --quick --out out/pd-q  # fewer points, shorter holds
    python bench/pd_experiments.py --split --out out/pd-split  # P:D splits of 6 workers
    python bench/pd_experiments.py --grid --out out/pd-grid    # the 4×4 (τ, ω) grid
    python bench/pd_experiments.py --spike --out out/pd-spike  # Exp. 3: static vs adaptive
    python bench/pd_experiments.py --grid --topology 1P/5D --clients 64 128 --out out/g5
    python bench/pd_experiments.py --grid --topology "2P/2D decode-bound" --clients 64 \
        --templates 50 --kv-blocks 450 --out out/gkv  # the decode workers' KV cache binds
    python bench/pd_experiments.py --strategies --topology "2P/2D decode-bound" \
        --clients 128 --out out/strat  # static vs regime-adaptive under the grid's ramp
    python bench/pd_experiments.py --strategies --prompt-blocks-only ...  # the decode load
        without output blocks (kv_cost_decode's accounting before they were charged)

Protocol (the paper's §8.1, in virtual time):
- closed loop, C clients, a 30 s linear ramp then a 120 s hold (`--quick`: 10 s + 30 s);
  metrics over the requests that *arrive* in the hold, as the paper excludes ramp data;
- every request: 128 prompt tokens, max_tokens 256 (the paper's), an answer of 192–256
  tokens (uniform, seeded per client: the paper's 5 templates answer differently; equal
  lengths would march a closed loop in lockstep convoys), no think time;
- engines (emulator/engine.py): prefill workers compute-bound at `PREFILL_TOKEN_S` per prompt
  token with a per-step token budget, decode workers W + H·n per step with H small (a
  memory-bound decode of a 70B model: ~11 ms ITL near the paper's batch), the KV's
  transfer `TRANSFER_S_PER_BLOCK` per 16-token block; `max_num_seqs` 256 on decode
  workers, 32 on prefill workers (`PREFILL_SEQS`);
- routing: the default pair selector (prefill by Dynamo's KV cost at τ = 0, ω = 1; decode
  by active decode load), i.e. the paper's static Dynamo defaults.
Per C: TTFT P50/P99, ITL P99 (per request: (finish − first token)/(tokens − 1)),
throughput (answers per second of hold), the prefill workers' busy fraction (time spent
stepping) and the decode workers' slot utilisation (Σ batch × step time over
max_num_seqs × time: how full their batches are); the knee
is the first C whose TTFT P99 is ≥ 10× the one at C = 32 while ITL P99 stays within 1.5×
of it. Writes rows.json and table.md.

`--split` (the paper's Game 1, which it only analyses): G = 6 workers split every way
(1P/5D … 5P/1D) at C = 64, 128 and 256, the same requests and holds: where the cascade
starts (prefill busy → 1 while decode slots stay low) and where it turns (decode-bound).

`--grid` (the paper's Experiment 4a/4b): the 4×4 (τ, ω) grid at C = 32, 64 and 128, seeds
1–3 (TTFT P99 per cell: the mean over seeds; the spread: (max − min) / min of those) with the
`kv_cost_decode` pair selector (the decode worker by Dynamo's cost, as the paper's routing
game among decode workers), requests drawn from 5 prompt templates (their 8 blocks hashed
per template, so the prefix index sees 5 prefixes; the prefill engine's own prefix cache
off, so prefill work is Experiment 1's). Each cell also reports PoA^ (eq. 12 over 30 s
windows of the hold, every 5 s: the paper's Exp. 4 measure), throughput, and the decode
workers' preemptions and prefix-cache hit rate; `--clients` picks the C values,
`--templates` the number of prompt templates, `--kv-blocks` the decode workers' KV capacity.
The sweep runs `--seeds` seeds per C (mean ± sd; the knee on the means).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.poa_window import PoaWindow
from simulator.closed_loop import LoadShape, Spike, simulate
from simulator.scenario import Scenario, parse
from simulator.workloads import RequestSpec

SWEEP = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)
QUICK = (1, 8, 32, 64, 96, 128, 192, 256, 512)
PROMPT, OUTPUT = 128, 256
PREFILL_TOKEN_S = 0.00017  # ≈ 5,900 prompt tokens/s on the prefill worker
PREFILL_BUDGET = 2048  # tokens a prefill step computes at most (max_num_batched_tokens)
# prompts a prefill worker holds at once: the engine model charges H per running sequence
# per step, which a prefill-only engine holding hundreds of half-done prompts would pay
# for nothing; the rest wait in its queue
PREFILL_SEQS = 32
DECODE_H = 0.00001  # decode: W = 8 ms + 0.01 ms per sequence in the batch
TRANSFER_S_PER_BLOCK = 0.0002
TOPOLOGIES = {"1P/2D": (1, 2), "1P/5D": (1, 5)}
SPLITS = {f"{p}P/{6 - p}D": (p, 6 - p) for p in range(1, 6)}


GRID = (0.0, 0.3, 0.7, 1.0)


def scenario(
    prefill: int,
    decode: int,
    seed: int = 1,
    pair: dict[str, Any] | None = None,
    prefill_cache: bool = True,
    sample_interval: float | None = None,
    decode_engine: dict[str, Any] | None = None,
) -> Scenario:
    return parse(
        {
            "name": f"pd-{prefill}p{decode}d",
            "seed": seed,
            "report": {"sample_interval": sample_interval},
            "fleet": {
                "engine": {"max_num_seqs": 256, "num_kv_blocks": 65536},
                "pools": [
                    {
                        "name": "short",
                        "workers": prefill + decode,
                        "kind": "pd",
                        "pd": {
                            "protocol": "vllm",
                            "prefill": prefill,
                            "decode": decode,
                            "transfer_s_per_block": TRANSFER_S_PER_BLOCK,
                            "prefill_engine": {
                                "prefill_token_s": PREFILL_TOKEN_S,
                                "max_num_batched_tokens": PREFILL_BUDGET,
                                "max_num_seqs": PREFILL_SEQS,
                                "enable_prefix_caching": prefill_cache,
                            },
                            "decode_engine": decode_engine or {"h": DECODE_H},
                            "pair": pair or {"policy": "kv_cost_decode_load"},
                        },
                    }
                ],
            },
            "workload": {
                "arrivals": {"kind": "poisson", "rate": 1},
                "components": [{"family": "chat"}],
            },
            "policy": {"dispatch": {"max_waiting": 100000, "timeout_s": 3600}},
        }
    )


@dataclass(frozen=True, slots=True)
class Row:
    topology: str
    clients: int
    answered: int
    ttft_p50: float
    ttft_p99: float
    itl_p99_ms: float
    rps: float
    prefill_busy: float
    decode_busy: float
    wall_s: float
    seed: int = 1
    poa: float = math.nan  # PoA^ (eq. 12), mean over the hold's 30 s windows (grid cells only)
    decode_hit: float = math.nan  # decode workers' prefix-cache hits / lookups (tokens)
    preemptions: int = 0  # decode workers' preemptions (KV cache full), whole run


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run_point(
    topology: str,
    clients: int,
    ramp_s: float,
    hold_s: float,
    seed: int = 1,
    cell: tuple[float, float] | None = None,
    templates: int = 5,
    kv_blocks: int | None = None,
    strategy: str | None = None,
    output_blocks: bool = True,
) -> Row:
    """One closed-loop run; `cell` = (τ, ω): the grid's selector, templated prompts (from
    `templates` templates) and PoA^; `kv_blocks`: the decode workers' KV capacity;
    `strategy` (a `STRATEGIES` name, with a cell): that selector instead of the cell's;
    `output_blocks` false: the decode load counts prompt blocks alone (the accounting
    before output blocks were charged, docs/PD.md)."""
    prefill, decode = {**TOPOLOGIES_SPIKE, **SPLITS}[topology]
    pair = None
    if cell is not None:
        pair = {
            "policy": "kv_cost_decode",
            "params": {
                "temperature": cell[0],
                "overlap_weight": cell[1],
                "seed": seed,
                "output_blocks": output_blocks,
            },
        }
    if strategy is not None:
        params = {**STRATEGIES[strategy]["params"], "seed": seed, "output_blocks": output_blocks}
        if "detector" in params and "decode-bound" in topology:
            params["detector"] = {"baseline_s": 0.10}  # as the spike's
        pair = {"policy": STRATEGIES[strategy]["policy"], "params": params}
    engine = dict(DECODE_BOUND) if "decode-bound" in topology else {"h": DECODE_H}
    if kv_blocks is not None:
        engine["num_kv_blocks"] = kv_blocks
    # the PoA probe needs samples every 5 s only; the sweep keeps the 10 ms sampling that
    # its busy fractions (over the run, to its last sample) were measured with
    sc = scenario(prefill, decode, seed, pair, cell is None, None if cell is None else 1.0, engine)
    per_client = int((ramp_s + hold_s) / 2.0) + 4  # more than a client can send in the run
    seqs = []
    for c in range(clients):
        rng = random.Random(seed * 1_000_003 + c)
        outs = [rng.randint(OUTPUT * 3 // 4, OUTPUT) for _ in range(per_client)]
        chosen = [rng.randrange(templates) for _ in range(per_client)]
        seqs.append(
            [
                RequestSpec(
                    f"c{c}-{k}",
                    0.0,
                    PROMPT,
                    out,
                    OUTPUT,
                    client=f"c{c}",
                    prefix_hashes=(
                        tuple(1_000 * (t + 1) + i for i in range(PROMPT // 16))
                        if cell is not None
                        else ()
                    ),
                )
                for k, (out, t) in enumerate(zip(outs, chosen, strict=True))
            ]
        )
    start, end = ramp_s, ramp_s + hold_s
    window = PoaWindow(window_s=30.0, max_requests=512)
    poa: list[float] = []
    due = [start + 30.0]  # the first window lies inside the hold

    def probe(core: Any, now: float) -> None:
        if now < due[0] or now >= end:
            return
        due[0] = now + 5.0
        selector = core.pd_pools["short"].selector
        inner = selector.inner if hasattr(selector, "inner") else selector
        window.index = inner.decode_router.state.index
        est = window.paper(now)
        if est is not None:
            poa.append(est.ratio)

    extra: dict[str, Any] = {} if cell is None else {"hooks": (window,), "probe": probe}
    shape = LoadShape(clients, ramp_s=ramp_s, hold_s=hold_s, seed=seed)
    t0 = time.monotonic()
    result, _ = simulate(sc, shape, seqs, **extra)
    wall = time.monotonic() - t0
    held = [r for r in result.records if start <= r.arrival < end and r.status == "ok"]
    ttft = [r.first_token - r.arrival for r in held]
    itl = [(r.finish - r.first_token) / (r.completion_tokens - 1) for r in held]
    done_in_hold = [r for r in result.records if r.finish is not None and start <= r.finish < end]
    pools = result.core.load_of.__self__.cluster.pools["short"]  # type: ignore[attr-defined]
    span = result.end  # over the whole run (ramp and drain included)
    prefill = [w for w in pools if w.view.role == "prefill"]
    decode = [w for w in pools if w.view.role == "decode"]
    busy = {
        "prefill": sum(w.busy_time for w in prefill) / (span * len(prefill)),
        "decode": sum(w.busy_slot_seconds for w in decode)
        / (span * sum(w.config.max_num_seqs for w in decode)),
    }
    stats = [w.engine.stats for w in decode]
    queries = sum(st.prefix_queries_tokens for st in stats)
    return Row(
        topology,
        clients,
        len(held),
        _q(ttft, 0.5),
        _q(ttft, 0.99),
        _q(itl, 0.99) * 1000,
        len(done_in_hold) / hold_s,
        busy["prefill"],
        busy["decode"],
        wall,
        seed,
        sum(poa) / len(poa) if poa else math.nan,
        sum(st.prefix_hits_tokens for st in stats) / queries if queries else math.nan,
        sum(st.preemptions for st in stats),
    )


def knee(rows: list[Row]) -> int | None:
    """The first C whose TTFT P99 is ≥ 10× the one at C = 32 with ITL P99 within 1.5×."""
    base = next((r for r in rows if r.clients == 32), None)
    if base is None:
        return None
    for r in rows:
        if r.clients > 32 and r.ttft_p99 >= 10 * base.ttft_p99:
            if r.itl_p99_ms <= 1.5 * base.itl_p99_ms:
                return r.clients
            return None
    return None


def table(rows: list[Row]) -> str:
    out = []
    for topo in TOPOLOGIES:
        mine = [r for r in rows if r.topology == topo]
        if not mine:
            continue
        out.append(f"### {topo} (knee: C = {knee(mine)})\n")
        out.append(
            "| C | answered | TTFT P50 | TTFT P99 | ITL P99 | rps | prefill busy | decode slots |"
        )
        out.append("|---|---|---|---|---|---|---|---|")
        out += [
            f"| {r.clients} | {r.answered} | {r.ttft_p50:.3f} s | {r.ttft_p99:.3f} s | "
            f"{r.itl_p99_ms:.1f} ms | {r.rps:.1f} | {r.prefill_busy:.2f} | {r.decode_busy:.2f} |"
            for r in mine
        ]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=Path("out/pd"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--topology", choices=list(TOPOLOGIES_SPIKE), action="append")
    ap.add_argument("--split", action="store_true", help="P:D splits of 6 workers instead")
    ap.add_argument("--grid", action="store_true", help="the (τ, ω) grid at C = 32, 64, 128")
    ap.add_argument("--spike", action="store_true", help="C = 32 → 128 → 32, static vs adaptive")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--clients", type=int, nargs="+", help="the grid's C (default 32 64 128)")
    ap.add_argument("--templates", type=int, default=5, help="the grid's prompt templates")
    ap.add_argument("--kv-blocks", type=int, help="the decode workers' KV capacity (blocks)")
    ap.add_argument(
        "--prompt-blocks-only",
        action="store_true",
        help="the decode load without output blocks (kv_cost_decode's output_blocks: false)",
    )
    ap.add_argument(
        "--strategies",
        action="store_true",
        help="static vs adaptive under the grid's ramp and hold (--clients, --seeds)",
    )
    args = ap.parse_args(argv)
    if args.spike:
        plan = SpikePlan(below_s=60.0, saturated_s=90.0, recovery_s=60.0) if args.quick else SPIKE
        spike_rows = [
            spike(topo, strategy, seed, plan, not args.prompt_blocks_only)
            for topo in args.topology or list(TOPOLOGIES)
            for strategy in STRATEGIES
            for seed in range(1, args.seeds + 1)
        ]
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "spike.json").write_text(json.dumps(spike_rows, indent=1))
        text = spike_table(spike_rows)
        (args.out / "spike.md").write_text(text)
        print(text)
        return
    sweep, ramp, hold = (QUICK, 10.0, 30.0) if args.quick else (SWEEP, 30.0, 120.0)
    rows: list[Row] = []
    if args.strategies:
        lines = ["| pool | C | strategy | TTFT P50 s | TTFT P99 s | ITL P99 ms | rps | PoA^ |"]
        lines.append("|---|---|---|---|---|---|---|---|")
        for topo in args.topology or ["2P/2D decode-bound"]:
            for c in args.clients or (128,):
                for strategy in STRATEGIES:
                    runs = [
                        run_point(
                            topo,
                            c,
                            ramp,
                            hold,
                            seed,
                            (0.0, 1.0),
                            strategy=strategy,
                            output_blocks=not args.prompt_blocks_only,
                        )
                        for seed in range(1, args.seeds + 1)
                    ]
                    rows += runs
                    print(strategy, runs, flush=True)

                    def ms(f: str, fmt: str, v: list[Row] = runs) -> str:
                        xs = [getattr(r, f) for r in v]
                        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
                        return f"{statistics.mean(xs):{fmt}} ± {sd:{fmt}}"

                    lines.append(
                        f"| {topo} | {c} | {strategy} | {ms('ttft_p50', '.3f')} | "
                        f"{ms('ttft_p99', '.3f')} | {ms('itl_p99_ms', '.1f')} | "
                        f"{ms('rps', '.2f')} | {ms('poa', '.2f')} |"
                    )
        text = "\n".join(lines) + "\n"
    elif args.grid:
        grid_rows: list[tuple[float, float, Row]] = []
        for topo in args.topology or ["1P/2D"]:
            for c in args.clients or (32, 64, 128):
                for tau in GRID:
                    for omega in GRID:
                        for seed in range(1, args.seeds + 1):
                            row = run_point(
                                topo,
                                c,
                                ramp,
                                hold,
                                seed,
                                (tau, omega),
                                args.templates,
                                args.kv_blocks,
                                output_blocks=not args.prompt_blocks_only,
                            )
                            grid_rows.append((tau, omega, row))
                            rows.append(row)
                            print(tau, omega, seed, row, flush=True)
        text = grid_table(grid_rows)
    elif args.split:
        for c in (64, 128, 256):
            for topo in SPLITS:
                row = run_point(topo, c, ramp, hold)
                rows.append(row)
                print(row, flush=True)
        text = split_table(rows)
    else:
        for topo in args.topology or list(TOPOLOGIES):
            for c in sweep:
                for seed in range(1, args.seeds + 1):
                    row = run_point(topo, c, ramp, hold, seed)
                    rows.append(row)
                    print(row, flush=True)
        text = table(rows) if args.seeds == 1 else sweep_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    doc: list[dict[str, Any]] = [_asdict(r) for r in rows]
    (args.out / "rows.json").write_text(json.dumps(doc, indent=1))
    (args.out / "table.md").write_text(text)
    print(text)


def grid_table(cells: list[tuple[float, float, Row]]) -> str:
    """TTFT P99 per (τ, ω) per (topology, C), and each block's spread."""
    out = []
    keys = sorted({(r.topology, r.clients) for _, _, r in cells})
    for topo, c in keys:
        runs: dict[tuple[float, float], list[Row]] = {}
        for t, o, r in cells:
            if r.topology == topo and r.clients == c:
                runs.setdefault((t, o), []).append(r)

        def mean(f: str, v: list[Row]) -> float:
            return float(statistics.mean(getattr(r, f) for r in v))

        mine = {k: mean("ttft_p99", v) for k, v in runs.items()}
        p99 = list(mine.values())
        rps = [mean("rps", v) for v in runs.values()]
        itl = [mean("itl_p99_ms", v) for v in runs.values()]
        seeds = [r.ttft_p99 for v in runs.values() for r in v]
        out.append(
            f"### {topo}, C = {c}: mean TTFT P99 (s) by τ (rows) and ω (columns); spread "
            f"{(max(p99) - min(p99)) / min(p99):.1%} (single runs: {min(seeds):.3f}–"
            f"{max(seeds):.3f} s), throughput {min(rps):.1f}–{max(rps):.1f} rps, ITL P99 "
            f"{min(itl):.1f}–{max(itl):.1f} ms\n"
        )
        out.append("| τ \\ ω | " + " | ".join(f"{o}" for o in GRID) + " |")
        out.append("|---|" + "---|" * len(GRID))
        out += [f"| {t} | " + " | ".join(f"{mine[(t, o)]:.3f}" for o in GRID) + " |" for t in GRID]
        out.append("")
        for f, label, fmt in (
            ("poa", "PoA^", ".2f"),
            ("rps", "throughput (rps)", ".2f"),
            ("preemptions", "decode preemptions", ".0f"),
            ("decode_hit", "decode prefix-cache hit rate", ".3f"),
        ):
            vals = {k: mean(f, v) for k, v in runs.items()}
            xs = [x for x in vals.values() if not math.isnan(x)]
            if not xs or (f == "preemptions" and max(xs) == 0):
                continue
            spread = (max(xs) - min(xs)) / min(xs) if min(xs) > 0 else math.inf
            out.append(f"{label} by τ (rows) and ω (columns); spread {spread:.1%}\n")
            out.append("| τ \\ ω | " + " | ".join(f"{o}" for o in GRID) + " |")
            out.append("|---|" + "---|" * len(GRID))
            out += [
                f"| {t} | " + " | ".join(f"{vals[(t, o)]:{fmt}}" for o in GRID) + " |" for t in GRID
            ]
            out.append("")
    return "\n".join(out)


def sweep_table(rows: list[Row]) -> str:
    """Mean ± sd over seeds per (topology, C); the knee on the means."""
    out = []
    for topo in dict.fromkeys(r.topology for r in rows):
        by_c: dict[int, list[Row]] = {}
        for r in rows:
            if r.topology == topo:
                by_c.setdefault(r.clients, []).append(r)

        def ms(xs: list[float], f: str) -> str:
            sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
            return f"{statistics.mean(xs):{f}} ± {sd:{f}}"

        means = [
            Row(
                topo,
                c,
                sum(r.answered for r in v),
                *(
                    statistics.mean(getattr(r, f) for r in v)
                    for f in ("ttft_p50", "ttft_p99", "itl_p99_ms", "rps")
                ),
                *(
                    statistics.mean(getattr(r, f) for r in v)
                    for f in ("prefill_busy", "decode_busy", "wall_s")
                ),
            )
            for c, v in by_c.items()
        ]
        out.append(
            f"### {topo}, seeds {len(next(iter(by_c.values())))} (knee: C = {knee(means)})\n"
        )
        out.append(
            "| C | TTFT P50 s | TTFT P99 s | ITL P99 ms | rps | prefill busy | decode slots |"
        )
        out.append("|---|---|---|---|---|---|---|")
        for c, v in by_c.items():
            col = {f: [getattr(r, f) for r in v] for f in Row.__dataclass_fields__}
            out.append(
                f"| {c} | {ms(col['ttft_p50'], '.3f')} | {ms(col['ttft_p99'], '.3f')} | "
                f"{ms(col['itl_p99_ms'], '.1f')} | {ms(col['rps'], '.1f')} | "
                f"{statistics.mean(col['prefill_busy']):.2f} | "
                f"{statistics.mean(col['decode_busy']):.2f} |"
            )
        out.append("")
    return "\n".join(out)


def split_table(rows: list[Row]) -> str:
    out = [
        "| C | split | TTFT P50 | TTFT P99 | ITL P99 | rps | prefill busy | decode slots |",
        "|---|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {r.clients} | {r.topology} | {r.ttft_p50:.3f} s | {r.ttft_p99:.3f} s | "
        f"{r.itl_p99_ms:.1f} ms | {r.rps:.1f} | {r.prefill_busy:.2f} | {r.decode_busy:.2f} |"
        for r in rows
    ]
    return "\n".join(out) + "\n"


# --- the spike (the paper's Experiment 3) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class SpikePlan:
    base: int = 32
    peak: int = 128
    below_s: float = 120.0  # the paper's 120 / 180 / 120 s
    saturated_s: float = 180.0
    recovery_s: float = 120.0


SPIKE = SpikePlan()
# the decode choice by Dynamo's cost, static at its defaults or following the regime table.
# The detector's baseline is Exp. 1's TTFT P99 at C = 32 (0.17 s on both topologies): θ1 =
# 4 × 0.17 = 0.68 s, θ2 = 6.7 × θ1 = 4.6 s, the paper's rule of thumb (its 70B: 55 ms,
# 300 ms, 2 s). Learning it at warm-up would take the start's burst (32 clients at once:
# a P99 of 0.8 s in the first 30 s) for the baseline and never leave Below.
BASELINE_S = 0.17
STRATEGIES: dict[str, dict[str, Any]] = {
    "static": {"policy": "kv_cost_decode", "params": {}},
    "adaptive": {"policy": "regime_adaptive", "params": {"detector": {"baseline_s": BASELINE_S}}},
}


def _chain(template: int) -> tuple[int, ...]:
    return tuple(1_000 * (template + 1) + i for i in range(PROMPT // 16))


# a decode-bound pool, where the decode choice could matter: 2P/2D, decode steps 10× costlier
# per sequence and at most 64 sequences (each decode worker ~20 req/s, two prefills ~85)
DECODE_BOUND = {"h": 0.0001, "max_num_seqs": 64}
TOPOLOGIES_SPIKE = {**TOPOLOGIES, "2P/2D decode-bound": (2, 2)}


def spike(
    topology: str,
    strategy: str,
    seed: int,
    plan: SpikePlan = SPIKE,
    output_blocks: bool = True,
) -> dict[str, Any]:
    """Exp. 3 on a P/D topology: C = base → peak → base, 5 templated prompts (as the grid),
    the decode choice by `strategy`; per phase TTFT P50/P99, ITL P99, mean latency,
    throughput, effective concurrency (Little: throughput × mean latency) and PoA^ (eq. 12
    over a 30 s window of completions on the decode workers, every 5 s); when the regime
    first left Below after the spike began."""
    prefill, decode = TOPOLOGIES_SPIKE[topology]
    choice = STRATEGIES[strategy]
    params = {**choice["params"], "seed": seed, "output_blocks": output_blocks}
    bound = DECODE_BOUND if "decode-bound" in topology else None
    if bound is not None and "detector" in params:  # its static TTFT P99 at C = 32: 0.10 s
        params["detector"] = {"baseline_s": 0.10}
    pair = {"policy": choice["policy"], "params": params}
    sc = scenario(prefill, decode, seed, pair, False, 1.0, bound)
    at, until = plan.below_s, plan.below_s + plan.saturated_s
    end = until + plan.recovery_s
    per_client = int(end / 1.5) + 8  # more than a client can send in the run
    seqs = []
    for c in range(plan.peak):
        rng = random.Random(seed * 1_000_003 + c)
        seqs.append(
            [
                RequestSpec(
                    f"c{c}-{k}",
                    0.0,
                    PROMPT,
                    rng.randint(OUTPUT * 3 // 4, OUTPUT),
                    OUTPUT,
                    client=f"c{c}",
                    prefix_hashes=_chain(rng.randrange(5)),
                )
                for k in range(per_client)
            ]
        )
    window = PoaWindow(window_s=30.0, max_requests=512)
    poa: list[tuple[float, float]] = []
    regimes: list[tuple[float, int]] = []
    due = [5.0]

    def probe(core: Any, now: float) -> None:
        selector = core.pd_pools["short"].selector
        if hasattr(selector, "regime"):
            regimes.append((now, int(selector.regime)))
        if now < due[0]:
            return
        due[0] = now + 5.0
        window.index = (
            selector.decode_router.state.index
            if hasattr(selector, "decode_router")
            else selector.inner.decode_router.state.index
        )
        est = window.paper(now)
        if est is not None:
            poa.append((now, est.ratio))

    shape = LoadShape(
        plan.peak, ramp_s=0.0, hold_s=end, seed=seed, spike=Spike(plan.peak - plan.base, at, until)
    )
    t0 = time.monotonic()
    result, _ = simulate(sc, shape, seqs, seed=seed, hooks=(window,), probe=probe)
    wall = time.monotonic() - t0
    out: dict[str, Any] = {"topology": topology, "strategy": strategy, "seed": seed}
    phases = {"below": (10.0, at), "saturated": (at, until), "recovery": (until + 10.0, end)}
    for name, (t0_, t1) in phases.items():
        m = phase_metrics(result.records, t0_, t1)
        # PoA^ over a 30 s window: estimates once the window lies inside the phase
        xs = [r for t, r in poa if t0_ + 30.0 <= t < t1] or [r for t, r in poa if t0_ <= t < t1]
        m["poa"] = sum(xs) / len(xs) if xs else math.nan
        out[name] = m
    switched = [t for t, g in regimes if t >= at and g >= 1]
    out["switch_s"] = switched[0] - at if switched else None
    out["regime_changes"] = sum(1 for a, b in itertools.pairwise(regimes) if a[1] != b[1])
    out["changes_at"] = [
        (round(b[0], 1), b[1]) for a, b in itertools.pairwise(regimes) if a[1] != b[1]
    ]
    # the adaptive selector's time per regime within each phase (Below's start included)
    for name, (t0_, t1) in phases.items():
        inside = [g for t, g in regimes if t0_ <= t < t1]
        out[name]["in_transition"] = (
            sum(1 for g in inside if g >= 1) / len(inside) if inside else 0.0
        )
    out["max_regime"] = max((g for _, g in regimes), default=0)
    out["wall_s"] = wall
    print(topology, strategy, seed, {k: out[k] for k in ("switch_s", "max_regime")}, flush=True)
    return out


def phase_metrics(records: Any, t0: float, t1: float) -> dict[str, float]:
    """Over requests arriving in [t0, t1) (throughput: completions in it)."""
    rs = [r for r in records if t0 <= r.arrival < t1 and r.status == "ok"]
    ttft = [r.first_token - r.arrival for r in rs]
    itl = [(r.finish - r.first_token) / (r.completion_tokens - 1) for r in rs]
    lat = [r.finish - r.arrival for r in rs]
    done = [r for r in records if r.finish is not None and t0 <= r.finish < t1]
    rps = len(done) / (t1 - t0)
    mean = sum(lat) / len(lat) if lat else math.nan
    return {
        "n": len(rs),
        "ttft_p50": _q(ttft, 0.5),
        "ttft_p99": _q(ttft, 0.99),
        "itl_p99": _q(itl, 0.99),
        "latency": mean,
        "rps": rps,
        "concurrency": rps * mean,
    }


def spike_table(rows: list[dict[str, Any]]) -> str:
    """Mean ± sd over seeds per (topology, strategy, phase)."""
    out = [
        "| topology | strategy | phase | TTFT P50 s | TTFT P99 s | ITL P99 ms | mean latency s "
        "| req/s | eff. C | PoA^ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def ms(xs: list[float], f: str = ".3f") -> str:
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return f"{statistics.mean(xs):{f}} ± {sd:{f}}"

    keys = sorted(
        {(r["topology"], r["strategy"]) for r in rows}, key=lambda k: (k[0], k[1] != "static")
    )
    for topo, strat in keys:
        mine = [r for r in rows if r["topology"] == topo and r["strategy"] == strat]
        for phase in ("below", "saturated", "recovery"):
            col = {k: [r[phase][k] for r in mine] for k in mine[0][phase]}
            out.append(
                f"| {topo} | {strat} | {phase} | {ms(col['ttft_p50'])} | {ms(col['ttft_p99'])} | "
                f"{ms([x * 1000 for x in col['itl_p99']], '.1f')} | {ms(col['latency'], '.2f')} | "
                f"{ms(col['rps'], '.1f')} | {statistics.mean(col['concurrency']):.1f} | "
                f"{ms(col['poa'], '.1f')} |"
            )
    out.append("")
    for topo, strat in keys:
        mine = [r for r in rows if r["topology"] == topo and r["strategy"] == strat]
        if strat != "static":
            out.append(
                f"- {topo} {strat}: left Below after "
                f"{[r['switch_s'] for r in mine]} s; highest regime "
                f"{[r['max_regime'] for r in mine]}; regime changes "
                f"{[r['regime_changes'] for r in mine]} (at, to: {mine[0]['changes_at']}, seed "
                f"{mine[0]['seed']}); share of the saturated phase out of Below "
                f"{[round(r['saturated']['in_transition'], 2) for r in mine]}"
            )
    return "\n".join(out) + "\n"


def _asdict(r: Row) -> dict[str, Any]:
    return {f: getattr(r, f) for f in Row.__dataclass_fields__}


if __name__ == "__main__":
    main()
