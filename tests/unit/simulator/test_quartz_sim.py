"""QUARTZ in the simulator: selected by a scenario, records carry features, prediction and
observed prefill, the prefill room holds every method, the model is pluggable."""

from __future__ import annotations

from typing import Any

import pytest

from policies.quantile.features import FEATURES, Quantiles
from simulator.run import run
from simulator.scenario import ScenarioError, parse

MIX = [{"family": "chat", "weight": 0.7}, {"family": "rag", "weight": 0.3}]


def scenario(
    routing: str = "quartz",
    dispatch: str = "quartz",
    quartz: dict[str, Any] | None = None,
    room: int | None = None,
    requests: int = 400,
    rate: float = 10.0,
) -> Any:
    d: dict[str, Any] = {"policy": dispatch, "capacity": "engine"}
    if room is not None:
        d["prefill_room"] = room
    policy: dict[str, Any] = {"routing": {"policy": routing}, "dispatch": d}
    if quartz is not None:
        policy["quartz"] = quartz
    return parse(
        {
            "name": "q",
            "seed": 3,
            "fleet": {
                "engine": {"max_num_seqs": 16, "num_kv_blocks": 8192},
                "pools": [{"name": "short", "workers": 2, "max_model_len": 8192}],
            },
            "policy": policy,
            "workload": {
                "requests": requests,
                "arrivals": {"kind": "poisson", "rate": rate},
                "components": MIX,
                "clients": 4,
            },
        }
    )


def test_records_carry_features_prediction_and_prefill():
    res = run(scenario())
    ok = [r for r in res.records if r.status == "ok"]
    assert len(ok) == 400 and res.predictor is not None
    for r in ok:
        assert r.features is not None and len(r.features) == len(FEATURES)
        assert r.features[0] == r.prompt_tokens
        assert r.predicted is not None and r.predicted.mean <= r.predicted.q95
        assert r.prefill_s == pytest.approx(r.first_token - r.dispatch)
    # the calibrated analytic model covers about α of prefills
    covered = sum(r.prefill_s <= r.predicted.q95 for r in ok) / len(ok)
    assert covered >= 0.85
    assert res.predictor.observed == 400 and len(res.predictor) == 0


def test_a_baseline_with_policy_quartz_is_recorded_too_and_without_it_nothing():
    res = run(scenario("least_loaded", "fifo", quartz={}))
    assert all(r.features is not None for r in res.records)
    res = run(scenario("least_loaded", "fifo"))
    assert res.predictor is None and all(r.features is None for r in res.records)


def test_the_returned_predictor_still_reads_the_fleets_worker_views():
    # run() later rebinds a local `workers` to each pool's list: the predictor's view_of, which
    # outlives the run in RunResult, must keep reading the worker map (found by mypy strict)
    res = run(scenario(requests=40))
    assert res.predictor is not None and res.predictor.view_of is not None
    served = {r.worker for r in res.records if r.status == "ok"}
    assert served
    for wid in served:
        view = res.predictor.view_of(wid)
        assert view is not None and view.capacity == 16  # fleet.engine.max_num_seqs
    assert res.predictor.view_of("no-such-worker") is None


def test_same_scenario_same_records():
    a = run(scenario(requests=200))
    b = run(scenario(requests=200))
    assert [(r.id, r.worker, r.first_token) for r in a.records] == [
        (r.id, r.worker, r.first_token) for r in b.records
    ]


@pytest.mark.parametrize("dispatch", ["fifo", "quartz", "token_fair"])
def test_the_prefill_room_holds_for_every_method(dispatch):
    """No worker is ever sent more prompt tokens without a first token than its room
    (beyond one request: an idle worker takes even a larger one)."""
    room = 6000
    sc = scenario("least_loaded", dispatch, quartz={}, room=room, rate=20.0, requests=300)
    res = run(sc)
    assert all(r.status == "ok" for r in res.records)
    events = []
    for r in res.records:
        events.append((r.dispatch, 1, r.worker, r.prompt_tokens))
        events.append((r.first_token, 0, r.worker, -r.prompt_tokens))
    backlog: dict[str, int] = {}
    for _, _, w, n in sorted(events):
        if n > 0:
            assert backlog.get(w, 0) < room  # room when it was sent
        backlog[w] = backlog.get(w, 0) + n


def test_a_model_can_be_plugged_in():
    class Oracle:
        name = "oracle"

        def predict(self, x):
            return Quantiles(0.01, 0.01, 0.01)

    res = run(scenario(requests=100), prefill_model=Oracle())
    assert res.predictor is not None and res.predictor.name == "oracle"


def test_quartz_keys_are_validated_with_their_path():
    with pytest.raises(ScenarioError, match=r"policy\.quartz"):
        scenario(quartz={"alpah": 0.9})
    with pytest.raises(ScenarioError, match=r"policy\.dispatch"):
        parse(
            {
                "name": "q",
                "fleet": {"pools": [{"name": "short", "workers": 1, "max_model_len": 8192}]},
                "policy": {"dispatch": {"policy": "quartz", "params": {"lamda": 1}}},
                "workload": {
                    "requests": 1,
                    "arrivals": {"kind": "poisson", "rate": 1},
                    "components": [{"family": "chat"}],
                },
            }
        )


class Optimist:
    """A model that predicts a tenth of a millisecond for every prefill."""

    name = "optimist"

    def predict(self, x):
        return Quantiles(0.0001, 0.0001, 0.0001)


def test_a_wrong_model_without_calibration_trips_the_fallback_and_calibration_rescues_it():
    res = run(scenario(quartz={"calibration": False}, requests=300), prefill_model=Optimist())
    cal = res.predictor.calibration
    assert cal.degraded and cal.changes >= 1 and cal.coverage() < 0.5
    res = run(scenario(quartz={}, requests=300), prefill_model=Optimist())
    cal = res.predictor.calibration
    assert not cal.degraded and cal.coverage() >= 0.85


def test_a_run_with_queued_requests_ends_at_its_last_answer():
    """A waiter's queue deadline is cancelled when it is served: the run (and the report's
    time span, its utilisation and throughput) ends with the last request, not at the
    deadline of the last request that ever waited."""
    sc = scenario("least_loaded", "fifo", quartz={}, room=2000, rate=20.0, requests=300)
    res = run(sc)
    assert any(r.dispatch is not None and r.dispatch > r.arrival for r in res.records)
    last = max(r.finish for r in res.records if r.finish is not None)
    assert last <= res.end < last + 1.0  # a last engine step or sample, not a deadline
