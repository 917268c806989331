"""bench/quartz_live.py end to end, very small: a warm-up gateway with QUARTZ (analytic model)
logs the Mixed Chat + RAG load, `fleetgate train-predictor` fits a model from that log, and
a fresh gateway serves the same kind of load with QUARTZ and the model. Asserts only what
holds on a slow machine: everything is answered with a first token, the model file is the
one in use (the metric), chat requests are not starved behind RAG ones, and the queue is
empty at the end (no leaked leases). Nothing about who wins."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.experiments.quartz_live import METHODS, Setup, run_one, train

pytestmark = pytest.mark.e2e
pytest.importorskip("sklearn")

# 2 engines of 4 slots at half speed, short answers: a few seconds of wall time per run;
# the drain bound is generous, so only a lost or starved request misses it
SMALL = Setup(workers=2, max_num_seqs=4, scale=0.5, output_scale=0.1, rate=8.0,
              requests=40, drain=120.0)  # fmt: skip
WARMUP = 80  # the trainer needs 50, and a holdout


def test_warmup_train_and_serve_with_quartz(tmp_path: Path) -> None:
    log = tmp_path / "warmup.jsonl"
    warm_setup = dataclasses.replace(SMALL, requests=WARMUP)
    warm = run_one(warm_setup, None, seed=100, log=log)
    assert warm["answered"] == WARMUP, warm
    assert warm["quartz"]["model"] == "analytic"
    entries = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(entries) == WARMUP and all(e["prefill_s"] is not None for e in entries)

    model = tmp_path / "live-model.json"
    report = train(log, model, SMALL)
    assert report["examples"] == WARMUP and report["skipped"] == {}
    assert 0.0 <= report["quality"]["trees + calib."]["coverage_95"] <= 1.0

    run = run_one(SMALL, METHODS["QUARTZ"], seed=1, model=model)
    assert run["answered"] == run["requests"] == SMALL.requests, run  # none cut, none refused
    assert run["quartz"]["model"] == "live-model"  # the trained file, not the analytic model
    assert run["quartz"]["observations_total"] == SMALL.requests
    assert run["quartz"]["queue_length"] == 0.0  # every queued request left the heap
    # chat requests are not starved behind RAG ones: each got its first token well inside
    # the run's drain bound (engine seconds, so a slow machine's wall time does not count)
    assert run["p99_chat"] < SMALL.drain / 2, run
