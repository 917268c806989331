"""SIGTERM under load: readiness goes 503 first, new requests are refused with
Retry-After, every stream in flight finishes, nothing is left held, the process exits 0."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway, wait_until

pytestmark = pytest.mark.e2e

STREAMS = 100
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 400,
    "ignore_eos": True,
    "stream": True,
}


def running(url: str) -> float:
    return metric(httpx.get(url + "/metrics", timeout=5).text, "vllm:num_requests_running")


def in_flight(url: str) -> float:
    return metric(httpx.get(url + "/metrics", timeout=5).text, "fleetgate_worker_in_flight")


def test_sigterm_drains_then_finishes_every_stream(fresh_procs):
    emu = emulator(fresh_procs, "drain-emu", 8192, "--time-scale", "0.5").wait_ready()
    cfg = gateway_config([emu.url], [])
    cfg["listen"] = {"drain_delay_s": 5.0, "graceful_shutdown_s": 60.0}
    gw = start_gateway(fresh_procs, cfg)

    def stream(_: int) -> str:
        with httpx.Client(timeout=60) as c:
            return c.post(gw.url + "/v1/chat/completions", json=CHAT).text

    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        futures = [pool.submit(stream, i) for i in range(STREAMS)]
        assert wait_until(lambda: in_flight(gw.url) == STREAMS, timeout=30), in_flight(gw.url)
        os.kill(gw.popen.pid, signal.SIGTERM)
        t = time.monotonic()
        # while draining: still accepting, but not ready and refusing new work
        assert wait_until(
            lambda: httpx.get(gw.url + "/readyz", timeout=5).status_code == 503, timeout=4.0
        )
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "stream": False})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "shutting_down"
        # all of that inside the drain delay (after it the listener closes: no answer at all)
        assert time.monotonic() - t < 5.0
        answers = [f.result(timeout=90) for f in futures]
    for text in answers:
        assert text.rstrip().endswith("data: [DONE]"), text[-200:]
        assert text.count("[DONE]") == 1 and '"error"' not in text
    assert gw.popen.wait(30) == 0
    assert wait_until(lambda: running(emu.url) == 0)
