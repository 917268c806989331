"""The engine side of the HTTP edge: a real gateway process in front of engines that
misbehave (tests/misbehaving_engine.py), one engine process per misbehaviour, each the
only worker of a pool serving a model named after it.

Each case is one of the HTTP audit's findings against the gateway's upstream client as it
was before (issue "The HTTP edge on uvicorn and FastAPI"); the docstrings say what
happened then. tests/unit/gateway/test_upstream_conformance.py checks the client alone.
"""

from __future__ import annotations

import concurrent.futures
import socket
import time

import httpx
import orjson
import pytest

from tests.e2e.fleet import metric, start_gateway, wait_until
from tests.procs import procs

pytestmark = pytest.mark.e2e

MODES = (
    "normal",
    "early-hints",
    "unsolicited",
    "header-flood",
    "close-json",
    "close-sse",
    "sse-crlf",
    "sse-cr",
    "long-sse",
    "slow-sse",
    "huge-body",
)
IDLE_TIMEOUT = 1.0
WRITE_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def gw():
    with procs() as ps:
        params = {"long-sse": ["--param", "n=400", "--param", "size=65536"]}
        engines = {
            mode: ps.python(
                f"engine-{mode}",
                "tests.misbehaving_engine",
                "--port",
                "{port}",
                "--mode",
                mode,
                *params.get(mode, []),
            )
            for mode in MODES
        }
        for e in engines.values():
            e.wait_ready("/health")
        pools = {
            mode.replace("-", "_"): {
                "max_model_len": 8192,
                "models": [mode],
                "workers": [{"url": e.url}],
            }
            for mode, e in engines.items()
        }
        cfg = {
            "pools": pools,
            "placement": {"policy": "short_long", "short_pool": "normal"},
            "health": {"interval_s": 30.0},
            "telemetry": {"scrape_interval_s": 30.0},
            "upstream": {
                "connect_timeout_s": 2.0,
                "first_byte_timeout_s": 10.0,
                "idle_timeout_s": IDLE_TIMEOUT,
                "max_response_bytes": 256 * 1024,
                "max_connections_per_worker": 2,
            },
            "limits": {"client_write_timeout_s": WRITE_TIMEOUT},
        }
        g = start_gateway(ps, cfg)
        g.extra["engines"] = engines
        yield g


def chat(model: str, stream: bool = False, **extra: object) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": stream,
        **extra,
    }


def stats(gw, mode: str) -> dict:
    return httpx.get(gw.extra["engines"][mode].url + "/stats", timeout=5).json()


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_1xx_is_skipped_and_never_reaches_another_client(gw):
    """Was: client A got the 103 as its final answer and hung; the real 200 stayed in
    the pooled connection and was prepended to client B's answer."""
    for i in range(6):
        with httpx.Client(timeout=10) as c:  # a new client, a new connection, each time
            r = c.post(gw.url + "/v1/chat/completions", json=chat("early-hints"))
        assert r.status_code == 200, r.text
        assert orjson.loads(r.content)["object"] == "chat.completion", (i, r.content[:200])


def test_bytes_on_an_idle_pooled_connection_are_never_delivered(gw):
    """Was: an engine's unsolicited bytes were delivered with the next request's answer."""
    for _ in range(5):
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat("unsolicited"), timeout=10)
        assert r.status_code == 200
        assert b"WRONG" not in r.content
        assert orjson.loads(r.content)["choices"]
        time.sleep(0.1)  # the bogus bytes arrive on the idle connection meanwhile


def test_endless_response_head_is_a_quick_502_with_bounded_memory(gw):
    """Was: RSS 66 → 2,480 MiB in 5 s, until the 600 s first-byte timeout."""
    pid = gw.popen.pid
    before = rss_kib(pid)
    t = time.monotonic()
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat("header-flood"), timeout=30)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "bad_gateway"
    assert time.monotonic() - t < 10
    assert rss_kib(pid) - before < 64 * 1024


def test_oversized_answer_is_a_clear_502_and_not_the_workers_fault(gw):
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat("huge-body"), timeout=30)
    assert r.status_code == 502
    assert "max_response_bytes" in r.json()["error"]["message"]
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_circuit_opens_total") == 0


def test_close_delimited_answers_end_cleanly(gw):
    """Was: 502 and a breaker failure; streams got an error frame and a second [DONE]."""
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat("close-json"), timeout=10)
    assert r.status_code == 200 and orjson.loads(r.content)["choices"]
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat("close-sse", True), timeout=10)
    assert r.status_code == 200
    assert r.text.count("[DONE]") == 1 and '"error"' not in r.text
    text = httpx.get(gw.url + "/metrics").text
    for pool in ("close_json", "close_sse"):
        assert metric(text, "fleetgate_upstream_errors_total", pool=pool) == 0


@pytest.mark.parametrize("mode", ["sse-crlf", "sse-cr"])
def test_sse_framed_with_cr_is_relayed_and_its_usage_read(gw, mode):
    """Was: nothing relayed until the stream ended, and the usage never read."""
    pool = mode.replace("-", "_")
    before = metric(
        httpx.get(gw.url + "/metrics").text, "fleetgate_completion_tokens_total", pool=pool
    )
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat(mode, True), timeout=10)
    assert r.status_code == 200
    sep = "\r\n\r\n" if mode == "sse-crlf" else "\r\r"
    events = [e for e in r.text.split(sep) if e.strip()]
    assert events[-1].strip() == "data: [DONE]"
    assert all('"usage"' not in e for e in events)  # the usage event we asked for: stripped
    assert wait_until(
        lambda: (
            metric(
                httpx.get(gw.url + "/metrics").text, "fleetgate_completion_tokens_total", pool=pool
            )
            == before + 5  # the engine's usage event: completion_tokens = its 5 chunks
        )
    )


def test_a_client_that_stops_reading_is_cut_and_the_worker_is_not_blamed(gw):
    """Was: the engine's idle timer fired while the gateway waited on the client, the
    healthy worker's breaker opened and the next client got 503."""
    body = orjson.dumps(chat("long-sse", True))
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
        s.connect(("127.0.0.1", gw.port))
        s.sendall(head + body)
        s.recv(1024)  # the head and a little of the stream, then nothing for a while
        time.sleep(IDLE_TIMEOUT + WRITE_TIMEOUT + 2)
        # the gateway cut us: the rest of the stream ends without its [DONE]
        s.settimeout(10)
        rest = b""
        while chunk := s.recv(1 << 20):
            rest += chunk
        assert b"[DONE]" not in rest
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_upstream_errors_total", pool="long_sse") == 0
    assert metric(text, "fleetgate_circuit_opens_total") == 0
    # the worker still serves: a client that reads gets the whole stream
    r = httpx.post(gw.url + "/v1/chat/completions", json=chat("long-sse", True), timeout=30)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")


def test_connections_per_worker_are_capped(gw):
    """Was: `upstream.max_connections_per_worker` never read (40 streams, 42 connections)."""

    def one(_: int) -> int:
        r = httpx.post(gw.url + "/v1/chat/completions", json=chat("slow-sse", True), timeout=30)
        assert r.text.count("[DONE]") == 1
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(one, range(12)))
    assert statuses == [200] * 12
    assert stats(gw, "slow-sse")["peak_busy"] <= 2
