"""The ordered admission queues (policies/queue/): QUARTZ's k_fair heap and TokenFair,
and the client service counters they share."""

from __future__ import annotations

import pytest

from policies.clock import ManualClock
from policies.dispatch import attach_clock, make_dispatcher
from policies.quantile.config import QuartzSettings, build_predictor
from policies.quantile.predictor import attach
from policies.queue.counters import ClientCounters
from policies.queue.quartz import QuartzDispatcher, QuartzQueueConfig
from policies.registry import ParamError
from policies.types import RequestInfo


def req(rid, prompt=100, client="c", arrival=0.0, cls="standard"):
    return RequestInfo(rid, "m", arrival, prompt, 16, entitlement=client, slo_class=cls)


def quartz(**kw):
    d = make_dispatcher("quartz", kw)
    attach(d, build_predictor(QuartzSettings(), None))
    return d


def test_short_prompts_go_before_a_long_one():
    d = quartz()
    long_ = d.wait(req("long", 8000), ("p",), 0.0)
    a = d.wait(req("a", 100), ("p",), 0.1)
    b = d.wait(req("b", 200), ("p",), 0.2)
    assert [d.wake("p"), d.wake("p"), d.wake("p")] == [a, b, long_]


def test_aging_serves_the_long_prompt_once_it_waited_long_enough():
    """k = ŝ + λ·a: a short request arriving more than (ŝ_long − ŝ_short)/λ later
    goes after the long one."""
    d = quartz(lam=0.02)
    long_ = d.wait(req("long", 8000), ("p",), 0.0)
    gap = (d.key(req("x", 8000), 0.0) - d.key(req("y", 100), 0.0)) / 0.02
    assert gap > 0
    late = d.wait(req("late", 100, arrival=gap + 1.0), ("p",), gap + 1.0)
    assert d.wake("p") is long_ and d.wake("p") is late


def test_fairness_puts_a_heavily_served_client_behind():
    d = quartz(beta=0.1)
    for i in range(20):
        d.served(req(f"s{i}", 4000, client="heavy"), 0.0)  # all the service: share 1
    h = d.wait(req("h", 100, client="heavy"), ("p",), 0.0)
    light = d.wait(req("l", 100, client="light", arrival=0.5), ("p",), 0.5)
    assert d.wake("p") is light and d.wake("p") is h
    nofair = quartz(fairness=False)
    for i in range(20):
        nofair.served(req(f"s{i}", 4000, client="heavy"), 0.0)
    h = nofair.wait(req("h", 100, client="heavy"), ("p",), 0.0)
    nofair.wait(req("l", 100, client="light"), ("p",), 0.5)
    assert nofair.wake("p") is h


def test_degraded_coverage_falls_back_to_fifo():
    d = quartz()
    long_ = d.wait(req("long", 8000), ("p",), 0.0)
    short = d.wait(req("s", 100), ("p",), 0.1)
    d.predictor.calibration.degraded = True
    assert d.wake("p") is long_ and d.wake("p") is short


def test_a_request_queued_again_keeps_its_age():
    d = quartz(lam=0.02)
    old = req("old", 100, arrival=0.0)
    d.wait(old, ("p",), 0.0)
    assert d.wake("p").request is old  # woken; the room went elsewhere: queued again
    newer = d.wait(req("new", 100, arrival=5.0), ("p",), 5.0)
    again = d.wait(old, ("p",), 6.0)
    assert d.wake("p") is again and d.wake("p") is newer


def test_point_keys_by_the_mean():
    d = quartz(point=True)
    q = d.predictor.size(req("x", 4000))
    assert d.key(req("x", 4000), 0.0) == pytest.approx(q.mean)


def test_multi_pool_waiters_leave_every_heap_once():
    d = quartz()
    a = d.wait(req("a", 5000), ("short", "long"), 0.0)
    b = d.wait(req("b", 100), ("long",), 0.0)
    assert d.waiting("short") == 1 and d.waiting("long") == 2
    assert d.wake("short") is a
    assert d.waiting("long") == 1 and d.wake("long") is b and d.wake("long") is None
    assert len(d) == 0


def test_deadlines_are_the_timeout_after_arrival_and_the_queue_is_bounded():
    d = quartz(max_waiting=2, timeout_s=5.0)
    a = d.wait(req("a", 8000), ("p",), 0.0)
    b = d.wait(req("b"), ("p",), 1.0)
    assert d.wait(req("c"), ("p",), 1.0) is None  # full: 429
    assert (a.deadline, b.deadline) == (5.0, 6.0)
    d.cancel(a)  # its deadline (the core cancels it on the driver's Deadline)
    assert len(d) == 1 and d.wake("p") is b and len(d) == 0


def test_quartz_without_a_predictor_is_fifo():
    d = QuartzDispatcher(QuartzQueueConfig())
    a = d.wait(req("a", 8000), ("p",), 0.0)
    b = d.wait(req("b", 10, arrival=1.0), ("p",), 1.0)
    assert d.wake("p") is a and d.wake("p") is b


def test_token_fair_serves_the_least_served_client_first():
    d = make_dispatcher("token_fair")
    d.served(req("x", 5000, client="heavy"), 0.0)
    h1 = d.wait(req("h1", client="heavy"), ("p",), 0.0)
    h2 = d.wait(req("h2", client="heavy"), ("p",), 0.1)
    l1 = d.wait(req("l1", client="light"), ("p",), 0.2)
    assert d.wake("p") is l1 and d.wake("p") is h1 and d.wake("p") is h2


def test_shares_are_relative_to_the_average_client():
    c = ClientCounters(half_life_s=10.0)
    c.add("a", 3000, 0.0)
    c.add("b", 1000, 0.0)
    assert c.share("a", 0.0) == pytest.approx(1.5) and c.share("b", 0.0) == pytest.approx(0.5)
    assert c.share("nobody", 0.0) == 0.0
    c.add("b", 2000, 10.0)  # a's 3000 decayed to 1500, b's to 500 + 2000
    assert c.share("a", 10.0) == pytest.approx(2 * 1500 / 4000)
    # far later: the common scale is moved (no overflow), shares unchanged by it
    c.add("a", 1, 100_000.0)
    assert 0.0 <= c.share("b", 100_000.0) <= 2.0 and c.value("b", 100_000.0) == 0.0


def test_counters_decay_and_forget_idle_clients():
    c = ClientCounters(half_life_s=10.0, unit_tokens=1000.0, idle_s=30.0, sweep_every=1)
    c.add("a", 2000, 0.0)
    assert c.value("a", 0.0) == pytest.approx(2.0) and c.value("a", 10.0) == pytest.approx(1.0)
    c.add("b", 1, 1000.0)  # a sweep: "a" idle for 1000 s, decayed to nothing
    assert len(c) == 1 and c.value("a", 1000.0) == 0.0
    bounded = ClientCounters(max_clients=3)
    for i in range(10):
        bounded.add(f"c{i}", 10, float(i))
    assert len(bounded) == 3


@pytest.mark.parametrize("params", [{"lam": -1.0}, {"alpha": 0.5}, {"timeout_s": 0}, {"nope": 1}])
def test_bad_parameters_are_refused(params):
    with pytest.raises(ValueError):
        make_dispatcher("quartz", params)


def bounded(clock=None, **kw):
    d = quartz(**kw)
    if clock is not None:
        attach_clock(d, clock)
    return d


def test_a_waiter_past_the_wait_bound_goes_before_the_size_order():
    clock = ManualClock()
    d = bounded(clock, wait_bound_s=1.0)
    long_ = d.wait(req("long", 8000), ("p",), 0.0)
    clock.set(0.5)
    a = d.wait(req("a", 100, arrival=0.5), ("p",), 0.5)
    assert d.wake("p") is a  # the long one has not waited θ yet: size order
    b = d.wait(req("b", 100, arrival=0.6), ("p",), 0.6)
    clock.set(1.0)  # now it has
    assert d.wake("p") is long_ and d.wake("p") is b


def test_aged_waiters_go_in_arrival_order_and_keep_their_age_when_queued_again():
    clock = ManualClock()
    d = bounded(clock, wait_bound_s=1.0)
    old = req("old", 8000, arrival=0.0)
    first = d.wait(old, ("p",), 0.0)
    clock.set(0.2)
    mid = d.wait(req("mid", 4000, arrival=0.2), ("p",), 0.2)
    clock.set(2.0)
    assert d.wake("p") is first  # woken; the room went elsewhere: queued again at 2.0
    again = d.wait(old, ("p",), 2.0)
    fresh = d.wait(req("fresh", 10, arrival=2.0), ("p",), 2.0)
    assert [d.wake("p"), d.wake("p"), d.wake("p")] == [again, mid, fresh]


def test_the_bound_per_class_is_a_fraction_of_its_slo():
    clock = ManualClock()
    d = bounded(clock, wait_bound_slo=0.5, slo_s={"interactive": 2.0, "long": 4.0})
    rag = d.wait(req("rag", 8000, cls="long"), ("p",), 0.0)  # ages at 2.0
    chat = d.wait(req("chat", 3000, cls="interactive", arrival=0.5), ("p",), 0.5)  # at 1.5
    other = d.wait(req("other", 6000, cls="standard", arrival=0.5), ("p",), 0.5)  # never
    clock.set(2.5)
    small = d.wait(req("small", 10, arrival=2.5), ("p",), 2.5)
    assert [d.wake("p"), d.wake("p")] == [chat, rag]  # aged first, earliest aged first
    assert [d.wake("p"), d.wake("p")] == [small, other]  # then the size order


def test_without_a_clock_the_bound_reads_the_latest_time_it_was_told():
    d = bounded(None, wait_bound_s=1.0)
    long_ = d.wait(req("long", 8000), ("p",), 0.0)
    d.wait(req("a", 100, arrival=0.5), ("p",), 0.5)
    d.served(req("x", 10), 1.2)  # a first token at 1.2: the long one has waited θ
    assert d.wake("p") is long_


def test_the_wait_bound_is_off_by_default_and_fifo_when_degraded():
    clock = ManualClock(t=100.0)
    d = bounded(clock)
    long_ = d.wait(req("long", 8000), ("p",), 0.0)
    short = d.wait(req("s", 100, arrival=0.1), ("p",), 0.1)
    assert d.wake("p") is short and d.wake("p") is long_  # the paper's key alone
    d = bounded(clock, wait_bound_s=1.0)
    long_ = d.wait(req("long", 8000), ("p",), 0.0)
    short = d.wait(req("s", 100, arrival=0.1), ("p",), 0.1)
    d.predictor.calibration.degraded = True
    assert d.wake("p") is long_ and d.wake("p") is short


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"wait_bound_s": 0}, "wait_bound_s"),
        ({"wait_bound_s": -1.0}, "wait_bound_s"),
        ({"wait_bound_slo": 0.5}, "slo_s"),
        ({"wait_bound_slo": 0, "slo_s": {"long": 4.0}}, "wait_bound_slo"),
        ({"wait_bound_slo": 0.5, "slo_s": {"long": -4.0}}, "slo_s.long"),
        ({"wait_bound_slo": 0.5, "slo_s": [4.0]}, "slo_s"),
    ],
)
def test_bad_wait_bounds_name_their_key(params, path):
    with pytest.raises(ParamError) as err:
        make_dispatcher("quartz", params)
    assert err.value.path == path
