from collections import Counter

import pytest

from policies.routing import eligible, make_router, names
from policies.routing.profile import (
    DEFAULT_FILTERS,
    InTurn,
    Load,
    LowestScore,
    Profile,
    TwoChoices,
    fresh_unless_all_stale,
    has_room,
    healthy,
)
from policies.types import RequestInfo, WorkerView

REQ = RequestInfo(id="r", model="m", arrival=0.0, prompt_tokens=10, max_tokens=10)


def w(i: int, **kw) -> WorkerView:
    return WorkerView(id=f"w{i}", pool="short", max_model_len=8192, **kw)


@pytest.mark.parametrize("name", names())
def test_conformance_every_router(name):
    """Every registered router: never an unhealthy worker, None on no candidates, prefers fresh."""
    r = make_router(name)
    assert r.choose(REQ, []) is None
    assert r.choose(REQ, [w(0, healthy=False)]) is None
    for _ in range(20):
        got = r.choose(REQ, [w(0, healthy=False), w(1), w(2, stale=True)])
        assert got is not None and got.id == "w1"
    # all stale: still served (stale counts as saturated, not as down)
    got = r.choose(REQ, [w(0, stale=True), w(1, stale=True, healthy=False)])
    assert got is not None and got.id == "w0"


def test_least_loaded_picks_least_and_spreads_ties():
    r = make_router("least_loaded")
    assert (
        r.choose(REQ, [w(0, running=3), w(1, in_flight=1), w(2, running=2, waiting=1)]).id == "w1"
    )
    picks = Counter(r.choose(REQ, [w(0), w(1), w(2, in_flight=5)]).id for _ in range(100))
    assert picks["w0"] == picks["w1"] == 50 and "w2" not in picks


def test_load_merges_engine_and_gateway_counts():
    assert w(0, running=2, waiting=1, in_flight=1).load == 3
    assert w(0, running=0, waiting=0, in_flight=4).load == 4


def test_power_of_two_is_seeded_and_prefers_less_loaded():
    a = [
        make_router("power_of_two", {"seed": 7}).choose(REQ, [w(i, running=i) for i in range(5)]).id
        for _ in range(1)
    ]
    b = [
        make_router("power_of_two", {"seed": 7}).choose(REQ, [w(i, running=i) for i in range(5)]).id
        for _ in range(1)
    ]
    assert a == b
    r = make_router("power_of_two")
    picks = Counter(r.choose(REQ, [w(0, running=0), w(1, running=100)]).id for _ in range(50))
    assert picks == {"w0": 50}


def test_round_robin_cycles():
    r = make_router("round_robin")
    assert [r.choose(REQ, [w(0), w(1), w(2)]).id for _ in range(6)] == ["w0", "w1", "w2"] * 2


def test_unknown_router_and_param_fail_at_start():
    with pytest.raises(ValueError, match="unknown router 'nope'"):
        make_router("nope")
    with pytest.raises(ValueError, match="unknown parameter"):
        make_router("least_loaded", {"x": 1})


def test_eligible_posture():
    assert [v.id for v in eligible([w(0, stale=True), w(1)])] == ["w1"]
    assert [v.id for v in eligible([w(0, stale=True), w(1, healthy=False)])] == ["w0"]


# --- one conformance suite per extension point of a profile ------------------------------

FILTERS = [healthy, fresh_unless_all_stale, has_room]
PICKERS = [LowestScore, InTurn, TwoChoices]
SCORERS = [Load]
MIXED = [w(0, healthy=False), w(1, stale=True), w(2, running=3), w(3, waiting=1), w(4)]


@pytest.mark.parametrize("keep", FILTERS, ids=lambda f: f.__name__)
def test_filter_conformance(keep):
    """A filter keeps a subset, in candidate order, and never invents or drops everything
    it was not asked to (an empty input gives an empty output)."""
    assert keep(REQ, []) == []
    kept = keep(REQ, list(MIXED))
    assert all(k in MIXED for k in kept)
    assert [MIXED.index(k) for k in kept] == sorted(MIXED.index(k) for k in kept)
    assert keep(REQ, list(MIXED)) == kept  # pure: the same input, the same output


@pytest.mark.parametrize("make", SCORERS, ids=lambda c: c.__name__)
def test_scorer_conformance(make):
    import math

    scorer = make()
    assert scorer.name
    for v in MIXED:
        assert math.isfinite(scorer.score(REQ, v))


@pytest.mark.parametrize("make", PICKERS, ids=lambda c: c.__name__)
def test_picker_conformance(make):
    picker = make()
    assert picker.pick(REQ, []) is None
    scored = [(float(i), v) for i, v in enumerate(MIXED)]
    for _ in range(20):
        assert picker.pick(REQ, scored) in MIXED
    one = [(5.0, MIXED[2])]
    assert picker.pick(REQ, one) is MIXED[2]


def test_filters_run_once_before_scoring():
    """The shared posture is applied by the profile, so a scorer never sees a sick worker."""
    seen = []

    class Spy:
        name = "spy"

        def score(self, request, worker):
            seen.append(worker.id)
            return 0.0

    p = Profile("spy", LowestScore(), ((Spy(), 1.0),))
    assert p.filters == DEFAULT_FILTERS
    p.choose(REQ, MIXED)
    assert set(seen) == {"w2", "w3", "w4"}  # not w0 (unhealthy) nor w1 (stale)


def test_has_room_counts_requests_and_outstanding_tokens():
    def view(**kw):
        return WorkerView("w", "p", 8192, **kw)

    req = RequestInfo("r", "m", 0.0, 100, 10)
    assert has_room(req, [view(capacity=2, in_flight=1)])
    assert not has_room(req, [view(capacity=2, in_flight=2)])
    # the KV cache's size × overcommit bounds outstanding tokens; an empty worker takes
    # even a request larger than that bound
    assert has_room(req, [view(token_capacity=1000, outstanding_tokens=999)])
    assert not has_room(req, [view(token_capacity=1000, outstanding_tokens=1000)])
    assert has_room(req, [view(token_capacity=10)])
