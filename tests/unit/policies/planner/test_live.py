"""The gateway's histogram shape, the live plan, and `fleetgate plan` on a saved file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgate.plan import main
from policies.planner import PAPER, LengthCdf, live_plan, parse_histogram, plan
from policies.planner.live import SCHEMA


def histogram_doc(cdf: LengthCdf, requests: int, window_s: float) -> dict:
    """What the gateway would serve after a window of traffic drawn from `cdf`."""
    prev, counts = 0.0, []
    for _, f in cdf.points:
        counts.append(round(requests * (f - prev)))
        prev = f
    return {
        "schema": SCHEMA,
        "window_s": window_s,
        "requests": sum(counts),
        "buckets": [[t, n] for (t, _), n in zip(cdf.points, counts, strict=True)],
        "overflow": 0,
        "compression": {"attempted": 400, "succeeded": 300},
        "current": {"b_short": 4096, "gamma": 1.0, "n_short": 43, "n_long": 131},
    }


def test_parse_and_plan_match_the_file_workload(cdfs: dict) -> None:
    doc = histogram_doc(cdfs["azure_2023"], 300_000, 300.0)
    traffic = parse_histogram(json.loads(json.dumps(doc)))
    assert traffic.arrival_rate == pytest.approx(1000.0, rel=1e-4)
    assert traffic.p_c(1.0) == 0.75
    lp = live_plan(traffic, 0.5, options=PAPER)
    assert lp.p_c == 0.75
    # the observed CDF is the file's to within rounding of the counts: same fleet
    ref = plan(cdfs["azure_2023"], traffic.arrival_rate, 0.5, 0.75, 4096, options=PAPER)
    assert lp.current_required is not None and lp.current is not None
    assert lp.current_required.total == pytest.approx(ref.pool_routing.total, abs=2)
    assert lp.current.total == 174 and lp.current.b_short == 4096
    assert lp.plan.fleetopt.cost_per_hr <= lp.current_required.cost_per_hr


def test_observed_p_c_counts_every_band_request(cdfs: dict) -> None:
    """Before: p_c = succeeded / attempted, and code (or any band request C&R never tries)
    was in neither count, so 300 fitted of 400 tried read 0.75 though 1,000 requests were in
    the band and only 300 of them reached the short pool (Eq. 14's p_c is 0.30)."""
    doc = histogram_doc(cdfs["azure_2023"], 300_000, 300.0)
    doc["compression"] = {"borderline": 1000, "attempted": 400, "succeeded": 300}
    traffic = parse_histogram(doc)
    assert traffic.p_c(1.0) == pytest.approx(0.3)
    lp = live_plan(traffic, 0.5)
    assert lp.p_c == pytest.approx(0.3)
    # at (4096, 1.5) the short pool gets F(B) + 0.3 of the band (Eq. 14), not 0.75 of it
    sw = lp.plan.sweep
    observed = traffic.cdf()
    f_b, f_g = observed.cdf(4096), observed.cdf(6144)
    assert sw.alpha[sw.index(4096, 1.5)] == pytest.approx(f_b + 0.3 * (f_g - f_b))
    # too few band requests to estimate: the caller's default, however many were tried
    doc["compression"] = {"borderline": 49, "attempted": 49, "succeeded": 10}
    assert parse_histogram(doc).p_c(0.9) == 0.9
    # a document without "borderline" (an older gateway) keeps the old estimate
    doc["compression"] = {"attempted": 400, "succeeded": 300}
    assert parse_histogram(doc).p_c(1.0) == 0.75
    doc["compression"] = {"borderline": 10, "attempted": 400, "succeeded": 300}
    with pytest.raises(ValueError, match="borderline"):
        parse_histogram(doc)


def test_current_config_is_checked(cdfs: dict) -> None:
    doc = histogram_doc(cdfs["azure_2023"], 300_000, 300.0)
    doc["current"] = {"b_short": 4096, "gamma": 1.5, "n_short": 20, "n_long": 200}
    lp = live_plan(parse_histogram(doc), 0.5)
    assert lp.current is not None and lp.current.short is not None and lp.current.long is not None
    assert lp.current.short.binding == "INFEASIBLE"  # 20 GPUs for ~975 req/s: unstable
    # 25 % of the band (p_c = 0.75 observed) still goes long: ~44 req/s on 200 GPUs
    assert lp.current.long.binding == "OK" and lp.current.long.rho < 0.5


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"schema": "nope"}, "schema"),
        ({"window_s": 0}, "window_s"),
        ({"requests": 5}, "requests"),
        ({"buckets": [[128, 1], [64, 1]]}, "increasing"),
        ({"buckets": [[64, -1]]}, "bad bucket"),
        ({"compression": {"attempted": 1, "succeeded": 2}}, "succeeded"),
        ({"input_fraction": 1.5}, "input_fraction"),
        ({"current": {"b_short": 4096}}, "gamma"),
    ],
)
def test_malformed_documents_name_the_field(cdfs: dict, patch: dict, message: str) -> None:
    doc = histogram_doc(cdfs["azure_2023"], 1000, 10.0) | patch
    with pytest.raises(ValueError, match=message):
        parse_histogram(doc)


def test_cli_on_a_saved_histogram(
    cdfs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "hist.json"
    path.write_text(json.dumps(histogram_doc(cdfs["lmsys_chat_1m"], 100_000, 100.0)))
    assert main(["--histogram", str(path), "--json", "--exact"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["schema"] == "fleetgate.live_plan/v1"
    assert body["observed"]["arrival_rate"] == pytest.approx(1000.0, rel=1e-3)
    rec, req = body["recommended"], body["current_required"]
    # B = 4096 leaves a long tail whose P99 prefill misses 500 ms; the optimum does not
    assert rec["slo_met"] and not req["slo_met"]
    assert req["long"]["bound_by"] == "INFEASIBLE" and req["long"]["ttft_floor_ms"] > 500
    assert body["options"]["moments"] == "exact"


def test_cli_rejects_a_bad_histogram(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": SCHEMA, "window_s": 1}))
    assert main(["--histogram", str(path)]) == 2
    assert "plan histogram" in capsys.readouterr().err
