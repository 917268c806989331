"""Step 6's dispatchers (policies/dispatch.py): one conformance suite every registered
dispatcher passes, and the property that no waiter is lost or served twice."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.dispatch import DISPATCHERS as REGISTRY
from policies.dispatch import FifoDispatcher, QueuePosition, make_dispatcher
from policies.types import RequestInfo


def _req(rid: str, client: str = "default", prompt: int = 100) -> RequestInfo:
    return RequestInfo(rid, "m", 0.0, prompt, 16, entitlement=client)


def _registered(name):
    return lambda max_waiting, timeout_s: make_dispatcher(
        name, {"max_waiting": max_waiting, "timeout_s": timeout_s}
    )


# every registered dispatcher, built as configuration builds it
DISPATCHERS = [_registered(name) for name in REGISTRY.names()]
NAMES = REGISTRY.names()


@pytest.mark.parametrize("make", DISPATCHERS, ids=NAMES)
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
    assert d.expire(14.9) == [] and d.expire(15.0) == [e] and len(d) == 0
    assert d.expire(99.0) == []


ops = st.lists(
    st.one_of(
        st.tuples(st.just("wait"), st.sampled_from([("s",), ("l",), ("s", "l")])),
        st.tuples(st.just("wake"), st.sampled_from(["s", "l"])),
        st.tuples(st.just("cancel"), st.integers(0, 40)),
        st.tuples(st.just("tick"), st.floats(0.0, 5.0)),
    ),
    max_size=120,
)


@given(ops)
def test_no_waiter_is_lost_or_served_twice(ops):
    d = FifoDispatcher(max_waiting=8, timeout_s=3.0)
    now = 0.0
    queued, out = [], []
    for op, arg in ops:
        if op == "wait":
            w = d.wait(_req(f"r{len(queued)}"), arg, now)
            if w is not None:
                queued.append(w)
        elif op == "wake":
            w = d.wake(arg)
            if w is not None:
                assert arg in w.pools
                # FIFO: nobody still waiting for this pool was queued before it
                assert all(
                    q.since >= w.since or q.done or arg not in q.pools for q in queued if q is not w
                )
                out.append(w)
        elif op == "cancel" and queued:
            w = queued[arg % len(queued)]
            if not w.done:
                out.append(w)
            d.cancel(w)
        else:
            now += arg
            out.extend(d.expire(now))
        assert len(d) == sum(1 for q in queued if not q.done) <= 8
    assert len(out) == len(set(map(id, out)))  # each left once
    left = [q for q in queued if not q.done]
    assert len(left) + len(out) == len(queued)  # and none vanished


@pytest.mark.parametrize("make", DISPATCHERS, ids=NAMES)
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
