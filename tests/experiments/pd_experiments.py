"""Disaggregated P/D pools in the simulator: the paper's Experiment 1 (the knee) on a 1P/2D
and a 1P/5D topology ("The Price of Anarchy in Disaggregated Inference", §8; docs/PD.md).

    python bench/pd_experiments.py --out out/pd            # C swept 1…512, both topologies
    python bench/pd_experiments.py --quick --out out/pd-q  # fewer points, shorter holds
    python bench/pd_experiments.py --split --out out/pd-split  # P:D splits of 6 workers
    python bench/pd_experiments.py --grid --out out/pd-grid    # the 4×4 (τ, ω) grid

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
off, so prefill work is Experiment 1's).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.closed_loop import LoadShape, simulate
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
) -> Scenario:
    return parse(
        {
            "name": f"pd-{prefill}p{decode}d",
            "seed": seed,
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
                            "decode_engine": {"h": DECODE_H},
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
) -> Row:
    """One closed-loop run; `cell` = (τ, ω): the grid's selector and templated prompts."""
    prefill, decode = {**TOPOLOGIES, **SPLITS}[topology]
    pair = None
    if cell is not None:
        pair = {
            "policy": "kv_cost_decode",
            "params": {"temperature": cell[0], "overlap_weight": cell[1], "seed": seed},
        }
    sc = scenario(prefill, decode, seed, pair, prefill_cache=cell is None)
    per_client = int((ramp_s + hold_s) / 2.0) + 4  # more than a client can send in the run
    seqs = []
    for c in range(clients):
        rng = random.Random(seed * 1_000_003 + c)
        outs = [rng.randint(OUTPUT * 3 // 4, OUTPUT) for _ in range(per_client)]
        templates = [rng.randrange(5) for _ in range(per_client)]
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
                for k, (out, t) in enumerate(zip(outs, templates, strict=True))
            ]
        )
    t0 = time.monotonic()
    result, _ = simulate(sc, LoadShape(clients, ramp_s=ramp_s, hold_s=hold_s, seed=seed), seqs)
    wall = time.monotonic() - t0
    start, end = ramp_s, ramp_s + hold_s
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
    ap.add_argument("--topology", choices=list(TOPOLOGIES), action="append")
    ap.add_argument("--split", action="store_true", help="P:D splits of 6 workers instead")
    ap.add_argument("--grid", action="store_true", help="the (τ, ω) grid at C = 32, 64, 128")
    args = ap.parse_args(argv)
    sweep, ramp, hold = (QUICK, 10.0, 30.0) if args.quick else (SWEEP, 30.0, 120.0)
    rows: list[Row] = []
    if args.grid:
        grid_rows: list[tuple[float, float, Row]] = []
        for topo in args.topology or ["1P/2D"]:
            for c in (32, 64, 128):
                for tau in GRID:
                    for omega in GRID:
                        for seed in (1, 2, 3):
                            row = run_point(topo, c, ramp, hold, seed, cell=(tau, omega))
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
                row = run_point(topo, c, ramp, hold)
                rows.append(row)
                print(row, flush=True)
        text = table(rows)
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
        mine = {k: sum(r.ttft_p99 for r in v) / len(v) for k, v in runs.items()}
        p99 = list(mine.values())
        rps = [sum(r.rps for r in v) / len(v) for v in runs.values()]
        seeds = [r.ttft_p99 for v in runs.values() for r in v]
        out.append(
            f"### {topo}, C = {c}: mean TTFT P99 (s) by τ (rows) and ω (columns); spread "
            f"{(max(p99) - min(p99)) / min(p99):.1%} (single runs: {min(seeds):.3f}–"
            f"{max(seeds):.3f} s), throughput {min(rps):.1f}–{max(rps):.1f} rps\n"
        )
        out.append("| τ \\ ω | " + " | ".join(f"{o}" for o in GRID) + " |")
        out.append("|---|" + "---|" * len(GRID))
        out += [f"| {t} | " + " | ".join(f"{mine[(t, o)]:.3f}" for o in GRID) + " |" for t in GRID]
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


def _asdict(r: Row) -> dict[str, Any]:
    return {f: getattr(r, f) for f in Row.__dataclass_fields__}


if __name__ == "__main__":
    main()
