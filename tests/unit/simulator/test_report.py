import json
from pathlib import Path

import pytest

from simulator import plots, report
from simulator.run import run

from .conftest import small


def test_jain_index() -> None:
    assert report.jain([1, 1, 1, 1]) == pytest.approx(1.0)
    assert report.jain([1, 0, 0, 0]) == pytest.approx(0.25)
    assert report.jain([]) == 1.0


def test_report_has_every_metric_and_consistent_figures(tmp_path: Path) -> None:
    sc = small(
        rate=30,
        requests=300,
        workers=2,
        components=[{"family": "chat"}, {"family": "rag"}],
        slo={"interactive": 0.05, "long": 100.0},
    )
    res = run(sc)
    rep = report.build(res)
    for key in ("ttft", "tpot", "latency", "queue_wait"):
        p = rep[key]
        assert p["n"] == 300 and p["p50"] <= p["p95"] <= p["p99"] <= p["max"]
    classes = rep["slo"]["classes"]
    ttfts = {r.id: r.first_token - r.arrival for r in res.records}
    expect = (
        sum(ttfts[r.id] > 0.05 for r in res.records if r.slo_class == "interactive")
        / classes["interactive"]["requests"]
    )
    assert classes["interactive"]["violation_rate"] == pytest.approx(expect, abs=1e-6)
    assert classes["long"]["violation_rate"] == 0.0
    out_tokens = sum(r.completion_tokens for r in res.records)
    assert rep["throughput"]["output_tokens_per_s"] == pytest.approx(
        out_tokens / rep["virtual_seconds"], rel=1e-5
    )
    pool = rep["pools"]["short"]
    assert 0 < pool["utilisation"] <= pool["busy"] <= 1
    assert 0 < rep["fairness"]["jain"] <= 1
    assert len(rep["series"]["t"]) == len(rep["series"]["pools"]["short"]["utilisation"]) > 10
    text = report.table(rep)
    assert "ttft" in text and "interactive" in text and "short" in text
    report.write_json(rep, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["requests"] == 300
    for png in plots.plot(res, rep, tmp_path):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rejected_requests_count_as_slo_violations() -> None:
    sc = small(
        rate=5,
        requests=50,
        workers=1,
        components=[{"family": "burstgpt", "params": {"prompt_max": 30000}}],
        seed=3,
    )
    rep = report.build(run(sc), include_series=False)
    rejected = rep["status"].get("rejected_413", 0)
    assert rejected > 0
    assert rep["slo"]["violation_rate"] >= rejected / rep["requests"]
