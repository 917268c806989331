"""Property: the kernel runs events in (time, priority, scheduling order), whatever the
order they were scheduled in, including events scheduled by events."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.kernel import Kernel

event = st.tuples(st.integers(0, 20).map(lambda t: t / 4), st.integers(0, 3))


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=40), st.lists(st.tuples(st.integers(0, 39), event), max_size=10))
def test_events_run_in_order(initial, spawned) -> None:  # type: ignore[no-untyped-def]
    k = Kernel()
    ran: list[tuple[float, int, int]] = []
    order = 0
    children = dict(spawned)

    def fire(arg) -> None:  # type: ignore[no-untyped-def]
        nonlocal order
        t, prio, seq = arg
        ran.append((k.now(), prio, seq))
        assert k.now() == t
        if seq in children:
            dt, p = children.pop(seq)
            order += 1
            k.at(k.now() + dt, p, fire, (k.now() + dt, p, 1000 + order))

    for i, (t, p) in enumerate(initial):
        k.at(t, p, fire, (t, p, i))
    k.run()
    assert len(ran) == k.events
    times = [r[0] for r in ran]
    assert times == sorted(times)
    # Among events at one instant that were all queued before it began, priority then seq.
    for a, b in itertools.pairwise(ran):
        if a[0] == b[0] and a[2] < 1000 and b[2] < 1000:
            assert (a[1], a[2]) < (b[1], b[2])
