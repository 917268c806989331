"""QUARTZ's predictor as a hook, its routers (quartz, point_pred, locality), and the
routing conformance suite with a predictor bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.quantile.analytic import AnalyticModel
from policies.quantile.config import QuartzSettings, build_predictor
from policies.quantile.features import Quantiles
from policies.quantile.predictor import Predictor, attach
from policies.routing import make_router, names
from policies.types import Category, Outcome, RequestInfo, Status, WorkerView


def req(rid="r", prompt=1000, hashes=(), client="c"):
    return RequestInfo(
        rid, "m", 0.0, prompt, 64, entitlement=client, category=Category.CHAT, prefix_hashes=hashes
    )


def view(i, **kw):
    return WorkerView(id=f"w{i}", pool="p", max_model_len=8192, **kw)


def predictor(views=None, **settings_kw):
    p = build_predictor(QuartzSettings(**settings_kw), None)
    if views is not None:
        by_id = {v.id: v for v in views}
        p.view_of = by_id.get
    return p


class Fixed:
    """A model answering a fixed quantile per prompt size (for scoring tests)."""

    name = "fixed"

    def predict(self, x):
        m = x[0] / 1000
        return Quantiles(m, 1.5 * m, 2 * m)


def test_backlog_is_the_sum_of_pending_means_and_decays_at_first_token():
    vs = [view(0), view(1)]
    p = predictor(vs)
    a, b = req("a", 1000), req("b", 4000)
    p.on_dispatch(a, "w0", 0.0)
    p.on_dispatch(b, "w0", 0.0)
    ma, mb = p.pending("a").q.mean, p.pending("b").q.mean
    assert p.backlog("w0") == pytest.approx(ma + mb) and p.backlog("w1") == 0.0
    p.on_first_token(a, 0.05)
    assert p.backlog("w0") == pytest.approx(mb) and p.observed == 1
    p.on_complete(b, Outcome(Status.ERROR), 0.1)  # never had a first token
    assert p.backlog("w0") == 0.0 and len(p) == 0
    p.on_first_token(a, 0.2)  # again / unknown: nothing
    p.on_complete(req("zzz"), Outcome(Status.OK), 0.3)
    assert p.observed == 1


def test_a_retry_moves_the_backlog_to_the_new_worker():
    vs = [view(0), view(1)]
    p = predictor(vs)
    a = req("a")
    p.on_dispatch(a, "w0", 0.0)
    p.on_dispatch(a, "w1", 0.1)
    assert p.backlog("w0") == 0.0 and p.backlog("w1") > 0 and len(p) == 1


def test_features_at_dispatch_do_not_count_the_request_itself():
    v = view(0, running=2, in_flight=3, prefill_tokens=1500)
    p = predictor([v])
    r = req("a", 1000)
    before = p.features(r, view(0, running=2, in_flight=2, prefill_tokens=500))
    p.on_dispatch(r, "w0", 0.0)  # the view already counts r's slot and prefill lease
    assert p.pending("a").features == before


def test_the_index_learns_what_was_sent_where():
    p = predictor([view(0), view(1)])
    r = req("a", 144, hashes=tuple(range(11, 20)))  # 9 blocks: indexed 0 and 8
    p.on_dispatch(r, "w1", 0.0)
    assert p.locality(r, "w1") == 144 and p.locality(r, "w0") == 0
    off = predictor([view(0)], locality=False)
    off.on_dispatch(r, "w0", 0.0)
    assert off.locality(r, "w0") == 0


def test_size_is_the_request_alone():
    p = predictor()
    assert p.size(req(prompt=8000)).q95 > p.size(req(prompt=100)).q95 > 0


def test_quartz_scores_backlog_plus_quantile_over_k_candidates():
    p = Predictor(Fixed())
    r = make_router("quartz", {"k": 3})
    assert attach(r, p)
    vs = [view(0), view(1), view(2)]
    p._backlog["w0"] = 3.0  # expected work queued there
    p._backlog["w1"] = 0.5
    assert r.choose(req(), vs).id == "w2"
    # KV pressure: ψ pushes away from a nearly full cache
    vs[2].kv_usage = 0.99
    assert r.choose(req(), vs).id == "w1"


def test_point_pred_and_quartz_differ_only_in_the_quantile():
    """Worker w0: mean low, tail high (wide spread); w1 the reverse, by backlog."""

    class Spread:
        name = "spread"

        def predict(self, x):
            if x[9] > 0:  # waiting on the worker: uncertain
                return Quantiles(0.1, 2.0, 3.0)
            return Quantiles(0.5, 0.6, 0.7)

    vs = [view(0, waiting=1), view(1)]
    for name, want in (("quartz", "w1"), ("point_pred", "w0")):
        r = make_router(name, {"k": 2})
        attach(r, Predictor(Spread()))
        assert r.choose(req(), vs).id == want


def test_degraded_coverage_falls_back_to_least_loaded():
    p = Predictor(Fixed())
    r = make_router("quartz", {"k": 2})
    attach(r, p)
    p.calibration.degraded = True
    vs = [view(0, in_flight=5), view(1, in_flight=1)]
    p._backlog["w1"] = 100.0
    assert r.choose(req(), vs).id == "w1"


def test_locality_router_prefers_the_prefix_within_the_load_slack():
    p = predictor()
    r = make_router("locality", {"load_slack": 2})
    attach(r, p)
    hashes = (1, 2, 3)
    p.index.add("w1", hashes, 0.0)
    vs = [view(0), view(1, in_flight=2)]
    assert r.choose(req(prompt=48, hashes=hashes), vs).id == "w1"
    vs[1].in_flight = 3  # beyond the slack: load wins
    assert r.choose(req(prompt=48, hashes=hashes), vs).id == "w0"
    assert r.choose(req(prompt=48), vs).id == "w0"  # no hashes: least loaded


@pytest.mark.parametrize("name", names())
def test_conformance_every_router_with_a_predictor_bound(name):
    r = make_router(name)
    attach(r, predictor())
    q = req()
    assert r.choose(q, []) is None
    assert r.choose(q, [view(0, healthy=False)]) is None
    for _ in range(20):
        got = r.choose(q, [view(0, healthy=False), view(1), view(2, stale=True)])
        assert got is not None and got.id == "w1"
    assert r.choose(q, [view(0, capacity=1, in_flight=1)]) is None  # no room
    assert r.choose(q, [view(0, prefill_capacity=100, prefill_tokens=100)]) is None


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "first_token", "complete"]),
        st.integers(0, 6),
        st.integers(0, 2),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(EVENTS)
def test_hook_conformance_any_event_order(events):
    """Whatever order events come in (a retry, a first token twice, a completion without a
    dispatch), the predictor never raises and Ŵ(w) is exactly Σ pending means on w."""
    vs = [view(0), view(1), view(2)]
    p = predictor(vs, min_samples=2)
    now = 0.0
    for kind, i, w in events:
        now += 0.01
        r = req(f"r{i}", 100 * (i + 1), hashes=(i, i + 1))
        if kind == "dispatch":
            p.on_dispatch(r, f"w{w}", now)
        elif kind == "first_token":
            p.on_first_token(r, now)
        else:
            p.on_complete(r, Outcome(Status.OK), now)
        for v in vs:
            mine = sum(pr.q.mean for pr in p._pending.values() if pr.worker == v.id)
            assert p.backlog(v.id) == pytest.approx(mine, abs=1e-9) and p.backlog(v.id) >= 0
    assert len(p._chosen) <= len(p._pending) + 7


def test_analytic_name_is_reported():
    assert predictor().name == "analytic"
    assert Predictor(AnalyticModel()).degraded is False
