"""The safety net of Compress-and-Route: an engine that refuses a request for its context
length although placement had it fit (a count that was off for this engine) does not cost
the client an error: the request goes once more, uncompressed, to a pool with a longer
context, and the answer says so."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway

pytestmark = pytest.mark.e2e

PROSE = "The committee reviewed the quarterly figures and noted several trends. " * 300


def test_a_context_length_400_is_retried_once_on_the_long_pool(fresh_procs):
    # the short engine's real context is 2048 tokens; the gateway is told 8192
    short = emulator(fresh_procs, "net-short", 2048).wait_ready()
    long = emulator(fresh_procs, "net-long", 65536).wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([short.url], [long.url]))
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROSE}], "max_tokens": 8}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-fleetgate-pool"] == "long"
    assert r.headers["x-fleetgate-retried"] == "context_length"
    assert r.json()["usage"]["prompt_tokens"] > 2048
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_context_retries_total", pool="short") == 1
    # a stream takes the same path: the 400 comes before any byte of the answer
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=60) as s:  # fmt: skip
        assert s.status_code == 200 and s.headers["x-fleetgate-retried"] == "context_length"
        assert b"".join(s.iter_raw()).rstrip().endswith(b"data: [DONE]")


def test_with_no_longer_pool_the_engines_400_passes_through(fresh_procs):
    short = emulator(fresh_procs, "net-only", 2048).wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([short.url], []))
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROSE}], "max_tokens": 8}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert "context length" in r.json()["error"]["message"]
    assert "x-fleetgate-retried" not in r.headers
