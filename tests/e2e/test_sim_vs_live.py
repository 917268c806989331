"""One engine model, two drivers: the TTFT distribution measured live (gateway + emulators
over HTTP, time-scaled) agrees with the simulator replaying the same requests.

The shipped scenario `live-small` (2 workers, moderate short-chat load) generates the
workload. Live: two `fleetgate emulate` processes run the engine model at time scale
S = 0.25 (wall seconds per engine second) behind `fleetgate serve` with least-loaded
routing; a client sends each request at its arrival time × S through the official
`openai` SDK (streaming, `ignore_eos`, so it generates exactly its output tokens), and
the gateway writes its request log. Simulated: the simulator replays that very log (its
arrivals, the engine's prompt and completion counts) on the scenario's fleet, in virtual
time. Live TTFT (the gateway's, divided by S) and simulated TTFT are compared.

Tolerance: median and mean TTFT within 20 %, P90 within 30 %. The live side carries what
the simulator leaves out — loopback HTTP, the gateway's and emulator's event loops, a
scrape-lagged least-loaded view — all a few wall milliseconds, i.e. ~10 % of a
50–200 ms engine step once scaled; the bounds are wide enough for a shared, noisy
2-core machine. The figures are printed (pytest -s) for the record.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import openai
import pytest

from simulator.run import build_workload, run
from simulator.scenario import load
from simulator.workloads import read_trace
from tests.e2e.fleet import MODEL, gateway_config, start_gateway, wait_until
from tests.procs import procs

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SCALE = 0.25
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
]


def _prompt(i: int, tokens: int) -> str:
    # One common English word is one cl100k token; the chat template adds a few more.
    body = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(max(1, tokens - 12)))
    return f"request {i}: {body}"


def _send(
    client: openai.OpenAI,
    i: int,
    prompt_tokens: int,
    output: int,
    at: float,
    out: dict[int, dict[str, object]],
) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    sent = time.monotonic()
    first = None
    usage = None
    try:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": _prompt(i, prompt_tokens)}],
            max_tokens=output,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": f"live{i:04d}"},
        )
        for chunk in stream:
            if first is None:
                first = time.monotonic()  # the role chunk comes with the first token
            if chunk.usage is not None:
                usage = chunk.usage
    except Exception as exc:  # recorded and asserted below
        out[i] = {"error": repr(exc)}
        return
    assert usage is not None and first is not None
    # A line of the gateway's request-log format: what the simulator replays.
    out[i] = {
        "ts": sent,
        "request_id": f"live{i:04d}",
        "model": MODEL,
        "status": 200,
        "max_tokens": output,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "ttft_s": first - sent,
    }


def _quantiles(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs)
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
    }


def test_live_and_simulated_ttft_agree(tmp_path: Path) -> None:
    scenario = load("live-small")
    specs = build_workload(scenario)
    cfg = scenario.engine_config(scenario.fleet.pools[0])
    with procs() as ps:
        emus = [
            ps.emulator(
                f"w{i}",
                "--model",
                MODEL,
                "--max-model-len",
                str(cfg.max_model_len),
                "--w",
                str(cfg.w),
                "--h",
                str(cfg.h),
                "--max-num-seqs",
                str(cfg.max_num_seqs),
                "--num-kv-blocks",
                str(cfg.num_kv_blocks),
                "--prefill-chunk",
                str(cfg.prefill_chunk),
                "--no-prefix-caching",
                "--time-scale",
                str(SCALE),
            )
            for i in range(scenario.fleet.pools[0].workers)
        ]
        for e in emus:
            e.wait_ready("/health")
        log = ps.dir / "requests.jsonl"
        gcfg = gateway_config([e.url for e in emus], [], request_log={"path": str(log)})
        gcfg["routing"] = {"policy": scenario.policy.routing.policy, "params": {}}
        gw = start_gateway(ps, gcfg)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        done: dict[int, dict[str, object]] = {}
        start = time.monotonic() + 0.5
        threads = [
            threading.Thread(
                target=_send,
                args=(client, i, s.prompt_tokens, s.output_tokens, start + s.arrival * SCALE, done),
            )
            for i, s in enumerate(specs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        errors = [r["error"] for r in done.values() if "error" in r]
        assert not errors and len(done) == len(specs), errors[:3]
        assert wait_until(
            lambda: log.exists() and len(log.read_text().splitlines()) >= len(specs), timeout=10
        )
        gateway_rows = [json.loads(line) for line in log.read_text().splitlines()]
    rows = [done[i] for i in range(len(specs))]
    assert [r["completion_tokens"] for r in rows] == [s.output_tokens for s in specs]
    # The gateway's own clock: arrival (ts) and TTFT as it measured them, the simulator's
    # definition (gateway arrival → first token); token counts from the engine's usage.
    by_gateway = {g["request_id"]: g for g in gateway_rows}
    statuses = sorted({g["status"] for g in gateway_rows})
    print(
        f"\ngateway log statuses: { {s: sum(g['status'] == s for g in gateway_rows) for s in statuses} }"
    )
    assert set(by_gateway) == {r["request_id"] for r in rows}
    client_ttft = [float(r["ttft_s"]) / SCALE for r in rows]  # type: ignore[arg-type]
    for r in rows:
        g = by_gateway[r["request_id"]]
        r["ts"], r["ttft_s"] = g["ts"], g["ttft_s"]
    live = [float(r["ttft_s"]) / SCALE for r in rows]  # type: ignore[arg-type]

    replay = read_trace(_write(rows, tmp_path / "live-trace.jsonl"), speedup=SCALE)
    result = run(scenario, specs=replay)
    simulated = [r.first_token - r.arrival for r in result.records if r.status == "ok"]
    assert len(simulated) == len(live)

    lq, sq = _quantiles(live), _quantiles(simulated)
    cq = _quantiles(client_ttft)
    print("\nTTFT, engine seconds   live (gateway)   live (client)   simulated   gateway/sim")
    for k in ("mean", "p50", "p90"):
        print(f"  {k:<20} {lq[k]:10.3f}   {cq[k]:13.3f}   {sq[k]:9.3f}   {lq[k] / sq[k]:9.3f}")
    by_id = {r.id: r.first_token - r.arrival for r in result.records}
    paired = [(float(r["ttft_s"]) / SCALE, by_id[str(r["request_id"])]) for r in rows]  # type: ignore[arg-type]
    corr = float(np.corrcoef(np.asarray(paired).T)[0, 1])
    print(
        f"  per-request correlation {corr:.3f}; median |live−sim| {statistics.median(abs(a - b) for a, b in paired):.3f} s"
    )
    assert lq["p50"] == pytest.approx(sq["p50"], rel=0.20)
    assert lq["mean"] == pytest.approx(sq["mean"], rel=0.20)
    assert lq["p90"] == pytest.approx(sq["p90"], rel=0.30)
    assert corr > 0.5  # the same requests are slow in both: longer prompts, busier moments


def _write(rows: list[dict[str, object]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
