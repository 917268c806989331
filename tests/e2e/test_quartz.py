"""QUARTZ in the gateway (issue 15): quartz routing and queueing against real emulators —
short prompts queued behind a long one go first, the metrics say which model and whether
it fell back, and the request log carries what the predictor is trained on."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway, wait_until

pytestmark = pytest.mark.e2e


def first_token_at(url: str, words: int, tokens: int, start: float) -> tuple[int, float]:
    """Stream a request of about `words` prompt tokens; (status, seconds to first chunk)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * words}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "temperature": 0.7,
    }
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        chunks = r.iter_raw()
        next(chunks)
        at = time.monotonic() - start
        for _ in chunks:
            pass
    return r.status_code, at


def test_quartz_serves_short_prompts_first_and_logs_its_features(fresh_procs, tmp_path):
    emu = emulator(fresh_procs, "q-emu", 8192, "--time-scale", "0.5").wait_ready()
    log = tmp_path / "requests.jsonl"
    cfg = gateway_config(
        [emu.url],
        [],
        routing={"policy": "quartz"},
        dispatch={"policy": "quartz", "prefill_room": 20_000, "timeout_s": 30},
        quartz={"min_samples": 32},  # too few first tokens here to judge coverage
        request_log={"path": str(log)},
    )
    cfg["pools"]["short"]["max_num_seqs"] = 1  # one at a time: the order is the gateway's
    gw = start_gateway(fresh_procs, cfg)
    start = time.monotonic()
    queued = lambda: metric(httpx.get(gw.url + "/metrics").text, "fleetgate_quartz_queue_length")  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        busy = pool.submit(first_token_at, gw.url, 10, 1500, start)  # holds the only slot
        assert wait_until(lambda: metric(httpx.get(gw.url + "/metrics").text,
                                         "fleetgate_quartz_observations_total") == 1)  # fmt: skip
        long_ = pool.submit(first_token_at, gw.url, 6000, 4, start)  # queued first
        assert wait_until(lambda: queued() == 1)
        shorts = [pool.submit(first_token_at, gw.url, 20, 4, start) for _ in range(3)]
        assert wait_until(lambda: queued() == 4)
        assert not busy.done()  # all four wait behind it; then the heap orders them
        results = [busy.result(), long_.result(), *(s.result() for s in shorts)]
    assert [s for s, _ in results] == [200] * 5
    long_at = results[1][1]
    assert all(at < long_at for _, at in results[2:]), results  # shorts went first
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_quartz_model", model="analytic") == 1.0
    assert metric(text, "fleetgate_quartz_fallback") == 0.0
    assert metric(text, "fleetgate_quartz_observations_total") == 5.0
    assert metric(text, "fleetgate_quartz_queue_length") == 0.0
    assert metric(text, "fleetgate_quartz_prefill_seconds_count") == 5.0
    # the request log: features at dispatch, the prediction, the observed prefill
    deadline = time.monotonic() + 5
    lines: list[dict] = []
    while time.monotonic() < deadline and len(lines) < 5:
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        time.sleep(0.1)
    assert len(lines) == 5
    for entry in lines:
        assert entry["status"] == 200 and len(entry["features"]) == 12
        assert entry["features"][2] == 0.7  # temperature
        assert entry["prefill_s"] > 0 and entry["predicted"]["q95"] >= entry["predicted"]["mean"]
        assert entry["prefill_s"] <= entry["ttft_s"]


def test_a_wait_bound_serves_the_long_prompt_first_once_it_waited(fresh_procs):
    """`wait_bound_s`: the long prompt queued first has waited past θ when the slot frees
    (the gateway's clock says so: no event in between told the queue the time), so it goes
    ahead of the short prompts that arrived after it, which the size order alone would
    serve first (the test above)."""
    emu = emulator(fresh_procs, "qb-emu", 8192, "--time-scale", "0.5").wait_ready()
    cfg = gateway_config(
        [emu.url],
        [],
        routing={"policy": "quartz"},
        dispatch={
            "policy": "quartz",
            "prefill_room": 20_000,
            "timeout_s": 30,
            "params": {"wait_bound_s": 2.0},
        },
        quartz={"min_samples": 32},
    )
    cfg["pools"]["short"]["max_num_seqs"] = 1
    gw = start_gateway(fresh_procs, cfg)
    start = time.monotonic()
    queued = lambda: metric(httpx.get(gw.url + "/metrics").text, "fleetgate_quartz_queue_length")  # noqa: E731
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        busy = pool.submit(first_token_at, gw.url, 10, 1500, start)  # ~6 s on the only slot
        assert wait_until(lambda: metric(httpx.get(gw.url + "/metrics").text,
                                         "fleetgate_quartz_observations_total") == 1)  # fmt: skip
        long_ = pool.submit(first_token_at, gw.url, 6000, 4, start)
        assert wait_until(lambda: queued() == 1)
        shorts = [pool.submit(first_token_at, gw.url, 20, 4, start) for _ in range(3)]
        assert wait_until(lambda: queued() == 4)
        assert not busy.done()  # its 1,500 tokens: ~13 engine-s, 6.5 s at scale 0.5: past θ
        results = [busy.result(), long_.result(), *(s.result() for s in shorts)]
    assert [s for s, _ in results] == [200] * 5
    long_at = results[1][1]
    assert all(at > long_at for _, at in results[2:]), results  # the aged one went first


def test_default_configuration_builds_no_predictor(fresh_procs):
    emu = emulator(fresh_procs, "q-emu2", 8192).wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([emu.url], []))
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=30,
    )
    assert r.status_code == 200
    assert "fleetgate_quartz" not in httpx.get(gw.url + "/metrics").text


def test_under_coverage_falls_back_and_says_so(fresh_procs):
    """A model far too optimistic and calibration off: once `min_samples` first tokens are
    in, coverage is below alpha − delta, the metric and a log line say so, and requests
    are still served (least-loaded, FIFO)."""
    emu = emulator(fresh_procs, "q-emu3", 8192).wait_ready()
    cfg = gateway_config(
        [emu.url],
        [],
        routing={"policy": "quartz"},
        dispatch={"policy": "quartz"},
        # a step of 1 µs: every prediction is far below what the engine takes
        quartz={"calibration": False, "min_samples": 8, "engine_w": 0.000001, "engine_h": 0.0},
    )
    gw = start_gateway(fresh_procs, cfg)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "stream": True,
    }  # fmt: skip  (a first token is observed only in a stream)
    for _ in range(10):
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            r.read()
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_quartz_fallback") == 1.0
    assert metric(text, "fleetgate_quartz_fallback_changes_total") == 1.0
    assert metric(text, "fleetgate_quartz_coverage") < 0.9
    assert wait_until(lambda: "coverage degraded: falling back" in gw.output())


def test_a_whole_answer_records_no_prefill(fresh_procs, tmp_path):
    """Was: a non-streamed answer's whole latency recorded as its prefill (it has no
    first token the gateway sees, and engines report none in the answer: WIRE_SPEC §3),
    which fed the calibration and `train-predictor` 3.3× (up to 30×) too-high targets.
    Now only a streamed first token is observed."""
    from collections import Counter

    from fleetgate.predictor import examples

    emu = emulator(fresh_procs, "q-emu4", 8192).wait_ready()
    log = tmp_path / "requests.jsonl"
    cfg = gateway_config(
        [emu.url],
        [],
        routing={"policy": "quartz"},
        dispatch={"policy": "quartz"},
        request_log={"path": str(log)},
    )
    gw = start_gateway(fresh_procs, cfg)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
            "ignore_eos": True}  # fmt: skip
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"x-request-id": "whole"},
                   timeout=30)  # fmt: skip
    assert r.status_code == 200
    with httpx.stream("POST", gw.url + "/v1/chat/completions", json={**body, "stream": True},
                      headers={"x-request-id": "streamed"}, timeout=30) as s:  # fmt: skip
        assert s.status_code == 200
        s.read()
    assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 2)
    entries = {e["request_id"]: e for e in map(json.loads, log.read_text().splitlines())}
    assert entries["whole"]["prefill_s"] is None
    # the log names the engine's id too (the gateway's own, the vLLM answer's id suffix)
    assert entries["whole"]["engine_request_id"] == r.json()["id"].removeprefix("chatcmpl-")
    assert entries["whole"]["features"] is not None  # it was routed by the predictor
    assert entries["streamed"]["prefill_s"] > 0
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_quartz_observations_total") == 1.0  # the calibration's
    assert metric(text, "fleetgate_quartz_prefill_seconds_count") == 1.0
    skipped: Counter[str] = Counter()
    assert len(list(examples(entries.values(), skipped))) == 1  # train-predictor's view
    assert skipped == Counter({"no features or prefill_s": 1})
