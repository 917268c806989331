"""Step 6's dispatchers (policies/dispatch.py): one conformance suite every registered
dispatcher passes, and the property that no waiter is lost or served twice."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.clock import ManualClock
from policies.dispatch import DISPATCHERS as REGISTRY
from policies.dispatch import FifoDispatcher, QueuePosition, attach_clock, make_dispatcher
from policies.quantile.config import QuartzSettings, build_predictor
from policies.quantile.predictor import attach
from policies.queue.counters import ClientCounters
from policies.types import RequestInfo


def _req(rid: str, client: str = "default", prompt: int = 100, arrival: float = 0.0) -> RequestInfo:
    return RequestInfo(rid, "m", arrival, prompt, 16, entitlement=client)


def _registered(name):
    return lambda max_waiting, timeout_s: make_dispatcher(
        name, {"max_waiting": max_waiting, "timeout_s": timeout_s}
    )


# every registered dispatcher, built as configuration builds it
DISPATCHERS = [_registered(name) for name in REGISTRY.names()]
NAMES = REGISTRY.names()


def _bound(name):
    """As configuration builds it, with QUARTZ's predictor bound where it uses one."""

    def make(max_waiting, timeout_s):
        d = make_dispatcher(name, {"max_waiting": max_waiting, "timeout_s": timeout_s})
        attach(d, build_predictor(QuartzSettings(), None))
        return d

    return make


def _wait_bounded(max_waiting, timeout_s):
    """QUARTZ with a wait bound (θ 1 s) and a clock standing at 2 s: every waiter is past it."""
    d = make_dispatcher(
        "quartz", {"max_waiting": max_waiting, "timeout_s": timeout_s, "wait_bound_s": 1.0}
    )
    attach(d, build_predictor(QuartzSettings(), None))
    attach_clock(d, ManualClock(t=2.0))
    return d


@pytest.mark.parametrize(
    "make",
    [*DISPATCHERS, *(_bound(n) for n in NAMES), _wait_bounded],
    ids=[*NAMES, *(f"{n}+predictor" for n in NAMES), "quartz+wait_bound"],
)
def test_dispatcher_conformance(make):
    d = make(max_waiting=3, timeout_s=10.0)
    a = d.wait(_req("a"), ("short", "long"), 0.0)
    b = d.wait(_req("b"), ("long",), 1.0)
    c = d.wait(_req("c"), ("short",), 2.0)
    assert len(d) == 3 and d.wait(_req("d"), ("short",), 3.0) is None  # full: refused at once
    assert d.waiting("short") == 2 and d.waiting("long") == 2
    assert d.wake("short") is a  # first come, first served, among those that can use it
    assert d.wake("short") is c
    assert d.wake("short") is None
    d.cancel(b)
    d.cancel(b)  # twice: no effect
    assert len(d) == 0 and d.wake("long") is None
    e = d.wait(_req("e"), ("short",), 5.0)
    assert e.deadline == 15.0 and len(d) == 1  # the Wait action's deadline: timeout_s on
    d.cancel(e)  # what the core does on the driver's Deadline
    assert len(d) == 0 and d.waiting("short") == 0 and d.wake("short") is None


ops = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), st.sampled_from([("s",), ("l",), ("s", "l")])),
        st.tuples(st.just("wake"), st.sampled_from(["s", "l"])),
        st.tuples(st.just("cancel"), st.integers(0, 40)),
        st.tuples(st.just("tick"), st.floats(0.0, 5.0)),
        st.tuples(st.just("served"), st.integers(0, 40)),
        st.tuples(st.just("degrade"), st.booleans()),
    ),
    max_size=120,
)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=120, deadline=None)
@given(ops=ops, sizes=st.lists(st.integers(1, 16_000), min_size=1, max_size=8))
def test_no_waiter_is_lost_or_served_twice(name, ops, sizes):
    """Random arrive / wake / cancel / timeout / first-token sequences (and QUARTZ's
    fallback switching on and off): each waiter leaves exactly once, none vanishes, the
    count is exact and bounded."""
    d = _bound(name)(max_waiting=8, timeout_s=3.0)
    predictor = getattr(d, "predictor", None)
    now = 0.0
    queued, out = [], []
    for op, arg in ops:
        if op == "wait":
            n = len(queued)
            r = _req(f"r{n}", client=f"c{n % 3}", prompt=sizes[n % len(sizes)])
            w = d.wait(r, arg, now)
            if w is not None:
                assert w.request is r
                queued.append(w)
        elif op == "wake":
            w = d.wake(arg)
            if w is not None:
                assert arg in w.pools
                if name == "fifo":  # nobody still waiting for this pool was queued before it
                    assert all(
                        q.since >= w.since or q.done or arg not in q.pools
                        for q in queued
                        if q is not w
                    )
                out.append(w)
        elif op == "cancel" and queued:
            w = queued[arg % len(queued)]
            if not w.done:
                out.append(w)
            d.cancel(w)
        elif op == "served" and queued:
            d.served(queued[arg % len(queued)].request, now)
        elif op == "degrade":
            if predictor is not None:
                predictor.calibration.degraded = arg
        elif op == "tick":
            now += arg
            for q in queued:  # each waiter's deadline timer (the core cancels it)
                if not q.done and q.deadline <= now:
                    out.append(q)
                    d.cancel(q)
        assert len(d) == sum(1 for q in queued if not q.done) <= 8
        for pool in ("s", "l"):
            assert d.waiting(pool) == sum(1 for q in queued if not q.done and pool in q.pools)
    assert len(out) == len(set(map(id, out)))  # each left once
    left = [q for q in queued if not q.done]
    assert len(left) + len(out) == len(queued)  # and none vanished


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 2.0), st.integers(1, 16_000), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=150,
    )
)
def test_aging_bounds_how_long_anyone_is_overtaken(arrivals):
    """QUARTZ's key k = ŝα + λ·a + β·u: a waiter q is never overtaken by a request that
    arrived more than (ŝα(q) + β·u(q))/λ seconds after it, so with room freeing and a
    finite arrival rate nobody waits forever (no starvation)."""
    lam = 0.02
    d = make_dispatcher("quartz", {"lam": lam, "max_waiting": 10_000, "timeout_s": 1e9})
    attach(d, build_predictor(QuartzSettings(), None))
    now = 0.0
    slack = {}  # waiter → (ŝα + β·u)/λ, its key less the aging term, in seconds of arrival
    live = []
    for i, (gap, size, client, serve) in enumerate(arrivals):
        now += gap
        r = _req(f"r{i}", client=f"c{client}", prompt=size, arrival=now)
        k = d.key(r, now)
        w = d.wait(r, ("p",), now)
        slack[id(w)] = (k - lam * now) / lam
        live.append(w)
        if serve:
            got = d.wake("p")
            d.served(got.request, now)
            for q in live:
                if not q.done:
                    assert got.since <= q.since + slack[id(q)] + 1e-6
    while len(d):
        got = d.wake("p")
        assert got is not None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.1, 30.0), st.integers(0, 20), st.integers(1, 20_000)), max_size=200
    )
)
def test_client_counters_stay_bounded(events):
    """S(c) ≤ (largest service / unit) / (1 − 2^(−gap_min/half-life)) with arrivals at
    least gap_min apart, QUARTZ's share u(c) ∈ [0, clients held]; idle clients are
    forgotten; at most max_clients are held."""
    c = ClientCounters(half_life_s=10.0, unit_tokens=1000.0, idle_s=60.0, max_clients=8)
    now = 0.0
    bound = (20_000 / 1000.0) / (1 - 2 ** (-0.1 / 10.0))
    for gap, client, tokens in events:
        now += gap
        c.add(f"c{client}", tokens, now)
        assert len(c) <= 8
        assert all(c.value(k, now) <= bound for k in list(c._w))
        assert all(0.0 <= c.share(k, now) <= len(c) + 1e-9 for k in list(c._w))
    c.sweep(now + 10_000.0)
    assert len(c) == 0


@pytest.mark.parametrize(
    "make",
    [*DISPATCHERS, *(_bound(n) for n in NAMES), _wait_bounded],
    ids=[*NAMES, *(f"{n}+predictor" for n in NAMES), "quartz+wait_bound"],
)
def test_a_queue_position_is_a_lease(make):
    d = make(max_waiting=3, timeout_s=10.0)
    waiter = d.wait(_req("a"), ("short",), 0.0)
    with QueuePosition(d, waiter) as position:
        assert len(d) == 1
    assert len(d) == 0 and waiter.done
    position.release()  # again: nothing
    assert len(d) == 0 and d.wake("short") is None


def test_unknown_dispatch_policy_and_parameters_are_refused():
    with pytest.raises(ValueError, match="fifo"):
        make_dispatcher("lifo")
    with pytest.raises(ValueError, match="unknown parameter"):
        make_dispatcher("fifo", {"depth": 3})
    assert isinstance(make_dispatcher("fifo"), FifoDispatcher)
