#!/usr/bin/env python3
"""The trace of one compressed, queued, streamed request, as docs/TRACING.md shows it.

An emulated engine (`fleetgate emulate`, one pool of one slot, max_model_len 4096) behind a
gateway in this process with tracing on, its spans kept by the SDK's in-memory exporter: a
long answer takes the slot, then a ~5,500-token chat (in the Compress-and-Route band) is
compressed onto the pool, waits for the slot and is streamed. Prints the chat's spans as a
tree: offset from the request's start and duration in ms, and each span's attributes and
events. Only 127.0.0.1. Needs the otel extra (pip install 'fleetgate[otel]').

    python bench/trace_example.py [--time-scale 0.02]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway import tracing  # noqa: E402
from gateway.app import create_app  # noqa: E402
from gateway.config import Tracing, load_config  # noqa: E402

MODEL = "llama-3.1-8b"
PROSE = [
    "I think we can do it, and we will see how it goes by the end of the day.",
    "It was not the plan, but he said we should try it one more time to be sure.",
    "She had a lot to say on the call, so we let her go first and then we took notes.",
    "If the run is slow, we can add two more boxes and see if it gets any better.",
    "We did not get to the last item, so it moves to the top of the list for next week.",
    "He asked if the new log view is up yet, and I told him it is not done but close.",
]


def chat() -> list[dict[str, str]]:
    turns = [
        {
            "role": "user" if t % 2 == 0 else "assistant",
            "content": " ".join(PROSE[(t + j) % len(PROSE)] for j in range(10)),
        }
        for t in range(26)
    ]
    return [*turns, {"role": "user", "content": "Which of the points above matters most?"}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run(time_scale: str) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    engine = subprocess.Popen(
        [sys.executable, "-m", "fleetgate", "emulate", "--host", "127.0.0.1", "--port",
         str(port), "--model", MODEL, "--max-model-len", "4096", "--time-scale", time_scale],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the emulator did not start")
            await asyncio.sleep(0.1)
        exporter = InMemorySpanExporter()
        tracing.configure(Tracing(enabled=True), exporter=exporter)
        config = load_config(
            data={
                "pools": {
                    "short": {
                        "max_model_len": 4096,
                        "max_num_seqs": 1,
                        "models": [MODEL],
                        "workers": [{"url": url}],
                    }
                },
                "placement": {
                    "policy": "compress_and_route",
                    "short_pool": "short",
                    "compress_single_pool": True,
                },
                "dispatch": {"timeout_s": 60},
            },
            environ={},
        )
        app = create_app(config)
        await app.gateway.start()
        try:
            short = next(iter(app.gateway.fleet.workers.values()))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://gw", timeout=60
            ) as c:
                hi = [{"role": "user", "content": "Hi"}]
                body = {"model": MODEL, "messages": hi, "max_tokens": 4000, "ignore_eos": True}
                hold = asyncio.create_task(c.post("/v1/chat/completions", json=body))
                while short.in_flight == 0:
                    await asyncio.sleep(0.002)
                body = {"model": MODEL, "messages": chat(), "max_tokens": 16, "stream": True}
                r = await c.post("/v1/chat/completions", json=body, headers={"x-request-id": "k"})
                r.raise_for_status()
                await hold
        finally:
            await app.gateway.stop()
        show(exporter.get_finished_spans())
    finally:
        os.killpg(engine.pid, signal.SIGTERM)
        engine.wait(10)


def show(spans: Any) -> None:
    root = next(s for s in spans if s.attributes.get("fleetgate.request_id") == "k")
    children = sorted(
        (s for s in spans if s.context.trace_id == root.context.trace_id and s is not root),
        key=lambda s: (s.start_time, s.end_time),
    )
    t0 = root.start_time

    def line(span: Any, indent: str) -> None:
        start, dur = (span.start_time - t0) / 1e6, (span.end_time - span.start_time) / 1e6
        attrs = ", ".join(f"{k}={v}" for k, v in span.attributes.items())
        print(f"{indent}{span.name:<{34 - len(indent)}} +{start:8.2f} ms {dur:9.2f} ms  {attrs}")
        for e in span.events:
            at = (e.timestamp - t0) / 1e6
            ev = ", ".join(f"{k}={v:.4f}" for k, v in e.attributes.items())
            print(f"{indent}  event {e.name:<{26 - len(indent)}} +{at:8.2f} ms{'':13}{ev}")

    print(f"trace {root.context.trace_id:032x}")
    line(root, "")
    for s in children:
        line(s, "  ")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-scale", default="0.02", help="the emulator's (wall s per engine s)")
    asyncio.run(run(p.parse_args().time_scale))


if __name__ == "__main__":
    main()
