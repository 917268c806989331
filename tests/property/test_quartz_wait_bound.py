"""QUARTZ's wait bound (policies/queue/quartz.py `wait_bound_s`, `wait_bound_slo`): whatever
the arrivals, sizes, clients, wakes, cancellations, timeouts and re-queues,

- bounded wait: once a waiter has waited its θ, every wake of one of its pools serves a
  waiter that aged no later than it did — so it waits at most θ plus the time to serve
  the aged requests ahead of it (with one θ for all: those that arrived before it);
- no waiter is lost or served twice, the counts are exact, and the clock-less dispatcher
  (the latest time it was told) keeps both.

Virtual time only: a ManualClock the test moves."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies.clock import ManualClock
from policies.dispatch import Waiter, attach_clock, make_dispatcher
from policies.quantile.config import QuartzSettings, build_predictor
from policies.quantile.predictor import attach
from policies.types import RequestInfo

SLO_S = {"interactive": 2.0, "long": 4.0}
PARAMS = st.sampled_from(
    [
        {"wait_bound_s": 1.0},
        {"wait_bound_s": 0.2, "lam": 1.0},
        {"wait_bound_s": 3.0, "beta": 1.0},
        {"wait_bound_slo": 0.5, "slo_s": SLO_S},
        {"wait_bound_slo": 0.25, "slo_s": {"long": 4.0}, "wait_bound_s": 1.5},
    ]
)
arrive = st.tuples(
    st.just("wait"),
    st.sampled_from([("s",), ("l",), ("s", "l")]),
    st.sampled_from([50, 500, 4_000, 16_000]),  # sizes far apart: the size order differs
    st.sampled_from(["interactive", "long", "standard"]),
)
wake = st.tuples(st.just("wake"), st.sampled_from(["s", "l"]), st.booleans(), st.just(""))
tick = st.tuples(st.just("tick"), st.floats(0.0, 2.0), st.just(0), st.just(""))
ops = st.lists(
    st.one_of(
        arrive,
        arrive,  # weighted: queues long enough for aged and fresh waiters to meet
        wake,
        tick,
        st.tuples(st.just("cancel"), st.integers(0, 60), st.just(0), st.just("")),
        st.tuples(st.just("served"), st.integers(0, 60), st.just(0), st.just("")),
    ),
    max_size=60,
)


def _theta(params: dict, request: RequestInfo) -> float:
    if "wait_bound_slo" in params and request.slo_class in params["slo_s"]:
        return float(params["wait_bound_slo"] * params["slo_s"][request.slo_class])
    return float(params.get("wait_bound_s", float("inf")))  # no θ for it: never aged


@settings(max_examples=500, deadline=None)
@given(params=PARAMS, ops=ops, clocked=st.booleans())
@example(  # a long prompt aged while a short one arrived: the long one goes first
    params={"wait_bound_s": 1.0},
    ops=[
        ("wait", ("s",), 16_000, ""),
        ("tick", 1.5, 0, ""),
        ("wait", ("s",), 50, ""),
        ("wake", "s", False, ""),
    ],
    clocked=False,
)
def test_an_aged_waiter_is_overtaken_only_by_waiters_aged_before_it(params, ops, clocked):
    d = make_dispatcher("quartz", {"max_waiting": 12, "timeout_s": 8.0, **params})
    attach(d, build_predictor(QuartzSettings(), None))
    clock = ManualClock()
    if clocked:
        attach_clock(d, clock)
    now = 0.0
    seen = 0.0  # without a clock the dispatcher's time is the latest it was told
    queued: list[Waiter] = []
    out: list[Waiter] = []
    n = 0
    for op, arg, size, cls in ops:
        if op == "wait":
            n += 1
            r = RequestInfo(f"r{n}", "m", now, size, 16, entitlement=f"c{n % 3}", slo_class=cls)
            seen = now
            w = d.wait(r, arg, now)
            if w is not None:
                queued.append(w)
        elif op == "wake":
            w = d.wake(arg)
            t = now if clocked else seen
            if w is not None:
                assert arg in w.pools and w not in out
                out.append(w)
                due = w.request.arrival + _theta(params, w.request)
                for q in queued:  # nobody who aged strictly earlier was passed over
                    if q is w or q.done or arg not in q.pools:
                        continue
                    q_due = q.request.arrival + _theta(params, q.request)
                    if q_due <= t:
                        assert due <= q_due, (w.key, q.key, due, q_due, t)
                if size:  # the room went elsewhere: queued again, keeping its arrival
                    seen = now
                    again = d.wait(w.request, w.pools, now)
                    if again is not None:
                        queued.append(again)
        elif op == "cancel" and queued:
            w = queued[arg % len(queued)]
            if not w.done:
                out.append(w)
            d.cancel(w)
        elif op == "served" and queued:
            d.served(queued[arg % len(queued)].request, now)
            seen = now
        elif op == "tick":
            now += arg
            clock.set(now)  # unclocked, the queue hears of the time only with a request
            for q in queued:  # each waiter's deadline timer (the core cancels it)
                if not q.done and q.deadline <= now:
                    out.append(q)
                    d.cancel(q)
        live = [q for q in queued if not q.done]
        assert len(d) == len(live) <= 12
        for pool in ("s", "l"):
            assert d.waiting(pool) == sum(1 for q in live if pool in q.pools)
    assert len(out) == len(set(map(id, out)))  # each left once
    assert len(out) + len([q for q in queued if not q.done]) == len(queued)  # none vanished
    while len(d):  # and the rest drain
        assert d.wake("s") is not None or d.wake("l") is not None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.integers(1, 16_000), st.booleans()),
        min_size=1,
        max_size=150,
    ),
    st.floats(0.1, 3.0),
)
def test_with_one_server_no_request_waits_past_theta_plus_the_aged_work_ahead(arrivals, theta):
    """One slot, service times known: a request's wait is at most θ plus the service of
    the requests that arrived before it and were served after it aged (the aged ones
    ahead of it) plus the one in service when it aged."""
    d = make_dispatcher("quartz", {"wait_bound_s": theta, "max_waiting": 10_000, "timeout_s": 1e9})
    attach(d, build_predictor(QuartzSettings(), None))
    clock = ManualClock()
    attach_clock(d, clock)
    service = {}  # request id → its service time on the one slot
    pending = list(arrivals)
    now, busy_until, n = 0.0, 0.0, 0
    started: dict[str, float] = {}
    order: list[RequestInfo] = []
    while pending or len(d):
        next_arrival = now + pending[0][0] if pending else float("inf")
        if len(d) and busy_until <= next_arrival:
            now = max(now, busy_until)
            clock.set(now)
            w = d.wake("p")
            assert w is not None and w.request is not None
            started[w.request.id] = now
            order.append(w.request)
            busy_until = now + service[w.request.id]
            continue
        _, size, slow = pending.pop(0)
        now = next_arrival
        clock.set(now)
        n += 1
        r = RequestInfo(f"r{n}", "m", now, size, 16)
        service[r.id] = 1.5 if slow else 0.05 + size / 100_000
        d.wait(r, ("p",), now)
    longest = max(service.values())
    for r in order:
        aged = r.arrival + theta
        ahead = sum(
            service[q.id]
            for q in order
            if q is not r and q.arrival <= r.arrival and started[q.id] >= aged
        )
        # the aged work ahead, θ, and whatever was in service when it aged
        assert started[r.id] - r.arrival <= theta + ahead + longest + 1e-9
