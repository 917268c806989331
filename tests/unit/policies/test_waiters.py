"""The waiter bookkeeping every dispatcher shares (policies/queue/waiters.py), checked
through every registered dispatcher alike: one suite, one oracle.

The oracle is a plain list of the waiters handed out, each marked when it leaves; it
knows nothing of deques, heaps or compaction. Whatever order a dispatcher serves in, the
bookkeeping must agree with it: the count, `waiting(pool)`, each waiter's deadline (its
arrival plus `timeout_s`; the core cancels it there, on the driver's `Deadline` — also
when a driver hands `wait` a time earlier than the last one), and no waiter leaving twice. Queues long enough that the
arrivals deque, QUARTZ's heaps and token_fair's client queues are compacted many times."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.dispatch import DISPATCHERS, make_dispatcher
from policies.quantile.config import QuartzSettings, build_predictor
from policies.quantile.predictor import attach
from policies.types import RequestInfo

NAMES = DISPATCHERS.names()
TIMEOUT = 3.0


def _make(name: str, bound: bool, max_waiting: int):
    d = make_dispatcher(name, {"max_waiting": max_waiting, "timeout_s": TIMEOUT})
    if bound:  # QUARTZ's size order (a predictor) instead of its FIFO fallback
        attach(d, build_predictor(QuartzSettings(), None))
    return d


VARIANTS = [(n, False) for n in NAMES] + [(n, True) for n in NAMES]
IDS = [n for n in NAMES] + [f"{n}+predictor" for n in NAMES]

ops = st.lists(
    st.one_of(
        # a time in [0, 8): mostly rising, sometimes earlier than the last (a driver that
        # went back in time)
        st.tuples(st.just("wait"), st.sampled_from([("s",), ("l",), ("s", "l")]), st.floats(0, 8)),
        st.tuples(st.just("wake"), st.sampled_from(["s", "l"]), st.just(0.0)),
        st.tuples(st.just("cancel"), st.integers(0, 10_000), st.just(0.0)),
        st.tuples(st.just("deadline"), st.just(()), st.floats(0, 12)),
    ),
    max_size=300,
)


@pytest.mark.parametrize(("name", "bound"), VARIANTS, ids=IDS)
@settings(max_examples=60, deadline=None)
@given(ops=ops, rising=st.booleans())
def test_the_bookkeeping_agrees_with_a_plain_list(name, bound, ops, rising):
    d = _make(name, bound, max_waiting=150)
    handed: list = []  # every waiter handed out, in arrival order
    left: set[int] = set()  # id() of those out of the queue
    latest = 0.0
    for op, arg, t in ops:
        if op == "wait":
            now = max(latest, t) if rising else t
            latest = max(latest, now)
            n = len(handed)
            w = d.wait(
                RequestInfo(f"r{n}", "m", now, 100 + n, 16, entitlement=f"c{n % 4}"), arg, now
            )
            live = len(handed) - len(left)
            assert (w is None) == (live >= 150)  # refused exactly when full
            if w is not None:
                assert w.deadline == now + TIMEOUT and not w.done
                handed.append(w)
        elif op == "wake":
            w = d.wake(arg)
            could = [h for h in handed if id(h) not in left and arg in h.pools]
            assert (w is None) == (not could)  # someone who could use the pool is served
            if w is not None:
                assert id(w) not in left and arg in w.pools and w.done
                left.add(id(w))
        elif op == "cancel" and handed:
            w = handed[arg % len(handed)]
            d.cancel(w)  # a no-op for one already out
            left.add(id(w))
            assert w.done
        elif op == "deadline":  # the drivers' timers: the core cancels each waiter past it
            for h in handed:
                if id(h) not in left and h.deadline <= t:
                    d.cancel(h)
                    left.add(id(h))
                    assert h.done
        live = [h for h in handed if id(h) not in left]
        assert len(d) == len(live)
        assert all(not h.done for h in live)
        for pool in ("s", "l"):
            assert d.waiting(pool) == sum(1 for h in live if pool in h.pools)


@pytest.mark.parametrize(("name", "bound"), VARIANTS, ids=IDS)
def test_thousands_of_cancellations_leave_exact_counts(name, bound):
    """Cancel four of every five waiters as they come (compaction runs again and again),
    then serve the rest: exactly the survivors, each once."""
    d = _make(name, bound, max_waiting=10_000)
    kept = []
    for i in range(3000):
        pools = ("s",) if i % 2 else ("s", "l")
        w = d.wait(
            RequestInfo(f"r{i}", "m", i / 1000, 100, 16, entitlement=f"c{i % 7}"), pools, i / 1000
        )
        if i % 5:
            d.cancel(w)
        else:
            kept.append(w)
    assert len(d) == len(kept) == 600
    assert d.waiting("s") == 600 and d.waiting("l") == 300  # i % 5 == 0: half of them odd
    served = [d.wake("s") for _ in kept]
    assert sorted(map(id, served)) == sorted(map(id, kept))
    assert len(d) == 0 and d.waiting("s") == 0 and d.wake("s") is None
