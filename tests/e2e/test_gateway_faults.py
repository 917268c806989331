"""Faults end to end: workers dying mid-stream, clients leaving, workers down, timeouts."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway, wait_until

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "Say hello."}]


def stream_request(max_tokens: int = 400) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": HELLO,
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }


def in_flight(gw_url: str) -> float:
    return metric(httpx.get(gw_url + "/metrics").text, "fleetgate_worker_in_flight")


def engine_running(url: str) -> float:
    return metric(httpx.get(url + "/metrics").text, "vllm:num_requests_running")


def test_worker_killed_mid_stream_ends_with_error_frame(fresh_procs):
    # real time (scale 1): 400 tokens take ~3.5 s, so the kill lands mid-stream
    worker = fresh_procs.emulator(
        "w", "--model", MODEL, "--max-model-len", "8192", "--time-scale", "1"
    ).wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([worker.url], []))
    lines: list[str] = []
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", json=stream_request(), timeout=30
    ) as r:
        assert r.status_code == 200
        it = r.iter_lines()
        for line in it:
            if line.startswith("data: {"):
                lines.append(line)
            if len(lines) >= 3:
                break
        worker.kill()
        lines.extend(line for line in it if line)
    assert lines[-1] == "data: [DONE]"
    err = json.loads(lines[-2][len("data: ") :])
    assert err["error"]["code"] == "bad_gateway"
    assert wait_until(lambda: in_flight(gw.url) == 0)


def test_client_disconnect_aborts_upstream(fresh_procs):
    worker = fresh_procs.emulator(
        "w", "--model", MODEL, "--max-model-len", "8192", "--time-scale", "1"
    ).wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([worker.url], []))
    with httpx.stream(
        "POST", gw.url + "/v1/chat/completions", json=stream_request(), timeout=30
    ) as r:
        got = 0
        lines = r.iter_lines()  # held: dropping a half-read iterator closes httpx's connection
        for line in lines:
            got += line.startswith("data: {")
            if got >= 3:
                break
        assert engine_running(worker.url) == 1
    # leaving the `with` closed the connection mid-stream
    assert wait_until(lambda: engine_running(worker.url) == 0), "the engine kept generating"
    assert wait_until(lambda: in_flight(gw.url) == 0)
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_client_disconnects_total") == 1
    aborted = metric(
        httpx.get(worker.url + "/metrics").text,
        "vllm:request_success_total",
        finished_reason="abort",
    )
    assert aborted == 1


def test_connect_failure_is_retried_on_another_worker(fresh_procs):
    a = emulator(fresh_procs, "a", 8192).wait_ready()
    b = emulator(fresh_procs, "b", 8192).wait_ready()
    cfg = gateway_config(
        [a.url, b.url],
        [],
        health={"interval_s": 60, "unhealthy_after": 1},
        # on a loaded machine stopping `a` can take longer than the default staleness
        # bound; stale telemetry would then keep `a` out of routing and hide the retry
        telemetry={"scrape_interval_s": 0.1, "stale_after_s": 60.0},
    )
    gw = start_gateway(fresh_procs, cfg)
    a.stop()  # down, and the gateway has not noticed yet (next health check in a minute)
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    for _ in range(6):
        c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_upstream_retries_total") >= 1
    assert metric(text, "fleetgate_upstream_errors_total", kind="connect") >= 1
    # three connect failures opened a's circuit: it is out of routing
    assert metric(text, "fleetgate_worker_circuit_open", worker=a.url.split("://")[1]) == 1


def test_no_healthy_worker_is_503_with_retry_after(fresh_procs):
    a = emulator(fresh_procs, "a", 8192).wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([a.url], []))
    a.stop()
    assert wait_until(lambda: httpx.get(gw.url + "/readyz").status_code == 503)
    r = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": MODEL, "messages": HELLO}, timeout=5
    )
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_healthy_worker"
    assert int(r.headers["retry-after"]) >= 1


def test_short_pool_down_spills_to_long(fresh_procs):
    s = emulator(fresh_procs, "s", 8192).wait_ready()
    long = emulator(fresh_procs, "l", 65536).wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([s.url], [long.url]))
    s.stop()
    assert wait_until(
        lambda: metric(httpx.get(gw.url + "/metrics").text, "fleetgate_worker_healthy") == 1
    )
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert raw.headers["x-fleetgate-pool"] == "long"


def test_first_byte_timeout_is_504(fresh_procs):
    slow = emulator(fresh_procs, "slow", 8192, "--added-latency-ms", "3000").wait_ready()
    cfg = gateway_config(
        [slow.url],
        [],
        upstream={"connect_timeout_s": 1, "first_byte_timeout_s": 0.5, "idle_timeout_s": 5},
    )
    gw = start_gateway(fresh_procs, cfg)
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": HELLO, "max_tokens": 2},
        timeout=10,
    )
    assert r.status_code == 504
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "timeout",
        "param": None,
        "code": "upstream_timeout",
    }


def test_injected_death_mid_stream_via_sdk(fresh_procs):
    w = emulator(fresh_procs, "w", 8192, "--die-mid-stream-after", "3").wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([w.url], []))
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=50, stream=True):
            pass
    assert wait_until(lambda: in_flight(gw.url) == 0)
