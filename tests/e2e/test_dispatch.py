"""Step 6 in the gateway: a request that finds every worker at `max_num_seqs` waits for
room first come first served, is refused at once when the wait queue is full, and gets
503 `queue_timeout` after `dispatch.timeout_s`."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway

pytestmark = pytest.mark.e2e


def stream(url: str, tokens: int) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def test_requests_wait_for_room_and_the_engine_never_sees_more(fresh_procs):
    emu = emulator(fresh_procs, "cap-emu", 8192, "--time-scale", "0.2").wait_ready()
    cfg = gateway_config([emu.url], [])
    cfg["pools"]["short"]["max_num_seqs"] = 2
    gw = start_gateway(fresh_procs, cfg)
    peak = [0.0]
    done = threading.Event()

    def watch() -> None:  # the engine's own view of how many it runs at once
        while not done.is_set():
            running = metric(httpx.get(emu.url + "/metrics").text, "vllm:num_requests_running")
            peak[0] = max(peak[0], running)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        # two long requests take both slots first; the six sent once the engine runs both
        # must all wait, however slowly a loaded machine starts threads (the two run for
        # seconds: 400 tokens ended before a starved host had sent
        # the six, which then did not wait)
        first = [pool.submit(stream, gw.url, 1000) for _ in range(2)]
        deadline = time.monotonic() + 30
        while peak[0] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        rest = [pool.submit(stream, gw.url, 20) for _ in range(6)]
        answers = [f.result() for f in first + rest]
    done.set()
    watcher.join(10)
    assert [a.status_code for a in answers] == [200] * 8
    assert all(a.text.rstrip().endswith("data: [DONE]") for a in answers)
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_dispatch_waits_total") >= 6  # 8 requests, 2 slots
    assert 1 <= peak[0] <= 2


def test_full_queue_is_429_and_a_long_wait_is_503(fresh_procs):
    emu = emulator(fresh_procs, "cap-emu2", 8192, "--time-scale", "0.5").wait_ready()
    cfg = gateway_config([emu.url], [], dispatch={"max_waiting": 1, "timeout_s": 0.5})
    cfg["pools"]["short"]["max_num_seqs"] = 1
    gw = start_gateway(fresh_procs, cfg)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: stream(gw.url, 200), range(3)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 429, 503], statuses
    by_status = {a.status_code: a for a in answers}
    assert by_status[429].json()["error"]["code"] == "queue_full"
    assert by_status[429].headers["retry-after"] == "1"
    assert by_status[503].json()["error"]["code"] == "queue_timeout"
    assert "retry-after" in by_status[503].headers


def test_admission_refuses_beyond_the_entitlement_and_gives_the_seat_back(fresh_procs):
    """Step 5 through the gateway: `admission.policy: concurrency` with limit 1 — a second
    request while the first streams is 429 with the policy's Retry-After; once the first
    ends, its seat is back (a lease released on completion)."""
    emu = emulator(fresh_procs, "adm-emu", 8192, "--time-scale", "0.5").wait_ready()
    cfg = gateway_config([emu.url], [])
    cfg["admission"] = {"policy": "concurrency", "params": {"limit": 1, "retry_after_s": 3}}
    gw = start_gateway(fresh_procs, cfg)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=60) as first:
        assert first.status_code == 200
        chunks = first.iter_raw()
        next(chunks)  # the first is being served
        second = stream(gw.url, 4)
        assert second.status_code == 429
        err = second.json()["error"]
        assert err["code"] == "entitlement_exhausted" and err["type"]
        assert second.headers["retry-after"] == "3"
        rest = b"".join(chunks)
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert stream(gw.url, 4).status_code == 200  # the seat came back


def prompt(url: str, words: int, tokens: int) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * words}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def test_a_woken_request_waits_once(fresh_procs):
    """A request woken from the queue is bound to the freed slot inside the release, so
    each request waits at most once. Bound later (when its handler ran), the gateway's
    count showed the slot free in between, and a first token on that worker
    (`prefill_room` set: a first token wakes a waiter) woke a second waiter for the same
    slot, which found none and waited again at the back of the queue: 18 % of the wakes
    of a loaded bench/quartz_live.py run, and all of its 20 longest waits."""
    emu = emulator(fresh_procs, "once-emu", 8192, "--time-scale", "1.0").wait_ready()
    capacity = 4
    # a prefill room that never binds: only the wakes of first tokens matter
    cfg = gateway_config([emu.url], [], dispatch={"prefill_room": 1_000_000, "timeout_s": 60.0})
    cfg["pools"]["short"]["max_num_seqs"] = capacity
    gw = start_gateway(fresh_procs, cfg)
    running = [0.0]
    n = 40
    with concurrent.futures.ThreadPoolExecutor(capacity + n) as pool:
        # long answers hold every slot while the others arrive: each of those must wait
        first = [pool.submit(prompt, gw.url, 8, 300) for _ in range(capacity)]
        deadline = time.monotonic() + 30
        while running[0] < capacity and time.monotonic() < deadline:
            text = httpx.get(emu.url + "/metrics").text
            running[0] = metric(text, "vllm:num_requests_running")
        # then prompts of a few prefill chunks and short answers: slots turn over every
        # few engine steps, one request's last token and another's first in one step
        rest = [pool.submit(prompt, gw.url, 200 + 300 * (i % 7), 2 + i % 6) for i in range(n)]
        answers = [f.result() for f in first + rest]
    assert running[0] == capacity
    assert [a.status_code for a in answers] == [200] * (capacity + n)
    waits = metric(httpx.get(gw.url + "/metrics").text, "fleetgate_dispatch_waits_total")
    assert 1 <= waits <= n, waits  # each of the n waits once, at most
