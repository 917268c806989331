#!/usr/bin/env python3
"""How long relayed streams stall while the gateway compresses borderline prompts.

50 clients keep one stream each open through the gateway (an emulated vLLM worker decodes
for all of them, a chunk every few ms), while another client sends borderline prose
prompts (B_short < L_total ≤ γ·B_short, so the gateway counts and compresses each, a few
ms of CPU) at 20 per second. Each stream client records the gap between consecutive reads;
the p50/p99/max gap is what a user sees as stutter. The same load runs twice, the gateway
compressing on the event loop (`placement.compress_workers: 0`) and on a thread (1).

    python bench/loop_stall.py [--seconds 15] [--streams 50] [--rate 20]

Gateway pinned to CPU 0, emulators and clients to CPU 1 (taskset), loopback only; every
process is stopped at the end. Prints one table row per setting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.corpus import borderline_set  # noqa: E402
from tests.procs import free_port  # noqa: E402

MODEL = "m"


def _start(args: list[str], cpu: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        ["taskset", "-c", cpu, sys.executable, "-m", "fleetgate", *args],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


async def _stream_client(port: int, stop: float, gaps: list[float]) -> None:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    while time.monotonic() < stop:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        last = None
        try:
            while time.monotonic() < stop:
                data = await reader.read(65536)
                if not data:
                    break
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
                if b"[DONE]" in data:
                    break
        finally:
            writer.close()


async def _borderline_client(port: int, stop: float, rate: float, sent: list[int]) -> None:
    samples = borderline_set(60, seed=7)
    rng = random.Random(1)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
        pending: set[asyncio.Task[object]] = set()
        while time.monotonic() < stop:
            s = rng.choice(samples)
            if s.messages is not None:
                path, req = "/v1/chat/completions", {"messages": s.messages}
            else:
                path, req = "/v1/completions", {"prompt": s.prompt}
            req |= {"model": MODEL, "max_tokens": s.max_tokens}
            t = asyncio.ensure_future(c.post(path, json=req))
            pending.add(t)
            t.add_done_callback(pending.discard)
            sent[0] += 1
            await asyncio.sleep(rng.expovariate(rate))
        if pending:
            await asyncio.wait(pending, timeout=30)


async def _load(port: int, seconds: float, streams: int, rate: float) -> tuple[list[float], int]:
    stop = time.monotonic() + seconds
    gaps: list[float] = []
    sent = [0]
    await asyncio.gather(
        *(_stream_client(port, stop, gaps) for _ in range(streams)),
        _borderline_client(port, stop, rate, sent),
    )
    return gaps, sent[0]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(workers: int, args: argparse.Namespace, logdir: Path) -> dict[str, float]:
    short_port, long_port, gw_port = free_port(), free_port(), free_port()
    procs = [
        _start(
            ["emulate", "--port", str(short_port), "--model", MODEL, "--max-model-len", "8192",
             "--max-num-seqs", "256", "--time-scale", str(args.time_scale)],
            "1", logdir / "short.log",
        ),
        _start(
            ["emulate", "--port", str(long_port), "--model", MODEL, "--max-model-len", "65536",
             "--time-scale", str(args.time_scale)],
            "1", logdir / "long.log",
        ),
    ]  # fmt: skip
    try:
        for p in (short_port, long_port):
            _wait(f"http://127.0.0.1:{p}/health")
        cfg = {
            "pools": {
                "short": {"max_model_len": 8192, "models": [MODEL],
                          "workers": [{"url": f"http://127.0.0.1:{short_port}"}]},
                "long": {"max_model_len": 65536, "models": [MODEL],
                         "workers": [{"url": f"http://127.0.0.1:{long_port}"}]},
            },
            "placement": {"compress_workers": workers},
        }  # fmt: skip
        path = logdir / f"gateway-{workers}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        gw = _start(
            ["serve", "--config", str(path), "--port", str(gw_port), "--log-level", "warning"],
            "0",
            logdir / f"gateway-{workers}.log",
        )
        procs.append(gw)
        _wait(f"http://127.0.0.1:{gw_port}/readyz")
        cpu0 = _cpu_seconds(gw.pid)
        gaps, sent = asyncio.run(_load(gw_port, args.seconds, args.streams, args.rate))
        cpu = _cpu_seconds(gw.pid) - cpu0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    gaps.sort()
    q = statistics.quantiles(gaps, n=100)
    return {
        "compress_workers": workers,
        "gaps": len(gaps),
        "p50_ms": 1000 * q[49],
        "p99_ms": 1000 * q[98],
        "max_ms": 1000 * gaps[-1],
        "borderline_sent": sent,
        "gateway_cpu_s": cpu,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--rate", type=float, default=20.0, help="borderline prompts per second")
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--workers", default="0,1", help="compress_workers settings to compare")
    args = ap.parse_args()
    logdir = Path(tempfile.mkdtemp(prefix="fleetgate-stall-"))
    print(
        "| compress_workers | chunk gaps | p50 gap ms | p99 gap ms | max gap ms | borderline sent | gateway CPU s |"
    )
    print("|---|---|---|---|---|---|---|")
    for w in (int(x) for x in args.workers.split(",")):
        r = run(w, args, logdir)
        print(
            f"| {w} | {r['gaps']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} "
            f"| {r['borderline_sent']} | {r['gateway_cpu_s']:.1f} |",
            flush=True,
        )
    print(f"logs: {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
