import pytest

from policies.clock import Clock
from simulator.kernel import PRIO_ARRIVAL, PRIO_SAMPLE, PRIO_STEP, Kernel, VirtualClock


def test_events_run_in_time_then_priority_then_schedule_order() -> None:
    k = Kernel()
    seen: list[str] = []
    k.at(2.0, PRIO_ARRIVAL, seen.append, "t2-arrival")
    k.at(1.0, PRIO_SAMPLE, seen.append, "t1-sample")
    k.at(1.0, PRIO_STEP, seen.append, "t1-step-a")
    k.at(1.0, PRIO_STEP, seen.append, "t1-step-b")
    k.at(1.0, PRIO_ARRIVAL, seen.append, "t1-arrival")
    assert k.run() == 5
    assert seen == ["t1-step-a", "t1-step-b", "t1-arrival", "t1-sample", "t2-arrival"]
    assert k.now() == 2.0
    assert k.events == 5


def test_clock_moves_to_each_event_and_callbacks_can_schedule_more() -> None:
    k = Kernel()
    times: list[float] = []

    def tick(n: int) -> None:
        times.append(k.now())
        if n:
            k.after(0.5, PRIO_STEP, tick, n - 1)

    k.at(1.0, PRIO_STEP, tick, 3)
    k.run()
    assert times == [1.0, 1.5, 2.0, 2.5]


def test_scheduling_in_the_past_raises() -> None:
    k = Kernel()
    k.at(1.0, PRIO_STEP, lambda _: None)
    k.run()
    with pytest.raises(ValueError, match="past"):
        k.at(0.5, PRIO_STEP, lambda _: None)


def test_run_until_stops_before_later_events_and_advances_the_clock() -> None:
    k = Kernel()
    seen: list[float] = []
    for t in (1.0, 2.0, 3.0):
        k.at(t, PRIO_STEP, seen.append, t)
    k.run(until=2.5)
    assert seen == [1.0, 2.0]
    assert k.now() == 2.5
    assert k.pending() == 1
    k.run(max_events=1)
    assert seen == [1.0, 2.0, 3.0]


def test_virtual_clock_is_a_policy_clock() -> None:
    clock = VirtualClock(3.0)
    assert isinstance(clock, Clock)
    assert clock.now() == 3.0


def test_a_cancelled_event_neither_runs_nor_moves_the_clock() -> None:
    k = Kernel()
    seen: list[str] = []
    k.at(1.0, PRIO_STEP, seen.append, "kept")
    timer = k.at(3600.0, PRIO_STEP, seen.append, "deadline")
    assert k.pending() == 2
    k.cancel(timer)
    assert k.pending() == 1
    assert k.run() == 1
    assert seen == ["kept"] and k.now() == 1.0 and k.events == 1
