"""The predictor's whole loop, as an operator runs it: a warm-up gateway (analytic model)
writes its request log, `fleetgate train-predictor` fits a model file from it, and a
gateway started with `quartz.model:` that file routes with it and says so in a metric."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import time

import httpx
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway
from tests.procs import ROOT, env

pytestmark = pytest.mark.e2e
pytest.importorskip("sklearn")

WARMUP = 90  # 50 to train (the trainer's minimum) and a holdout, with room to spare


def stream(url: str, words: int) -> int:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * words}],
        "max_tokens": 4,
        "stream": True,
    }
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for _ in r.iter_raw():
            pass
    return r.status_code


def test_train_from_the_gateways_log_and_serve_with_the_model(fresh_procs, tmp_path):
    emus = [emulator(fresh_procs, f"e{i}", 8192).wait_ready() for i in range(2)]
    urls = [e.url for e in emus]
    log = tmp_path / "requests.jsonl"
    cfg = gateway_config(urls, [], routing={"policy": "quartz"}, request_log={"path": str(log)})
    warm = start_gateway(fresh_procs, cfg, "warmup")
    sizes = [10 + (i * 397) % 3000 for i in range(WARMUP)]  # 10 .. 3,000 words
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert set(pool.map(lambda w: stream(warm.url, w), sizes)) == {200}
    deadline = time.monotonic() + 10
    lines: list[dict] = []
    while time.monotonic() < deadline and len(lines) < WARMUP:
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        time.sleep(0.1)
    assert len(lines) == WARMUP and all(e["prefill_s"] >= 0 for e in lines)
    warm.stop()

    model = tmp_path / "warmup-model.json"
    proc = subprocess.run(
        [sys.executable, "-m", "fleetgate", "train-predictor", str(log), "-o", str(model),
         "--trees", "10", "--json"],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["examples"] == WARMUP and report["skipped"] == {}

    cfg = gateway_config(urls, [], routing={"policy": "quartz"}, quartz={"model": str(model)})
    gw = start_gateway(fresh_procs, cfg, "trained")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert set(pool.map(lambda w: stream(gw.url, w), [20, 2000, 50, 800])) == {200}
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_quartz_model", model="warmup-model") == 1.0
    assert metric(text, "fleetgate_quartz_model", model="analytic") == 0.0
    assert metric(text, "fleetgate_quartz_observations_total") == 4.0
