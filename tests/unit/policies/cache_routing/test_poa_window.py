"""The PoA window hook (policies/poa_window.py): what it records from the core's events."""

import pytest

from policies.poa import PaperCost, poa_paper
from policies.poa_window import PoaTracker, PoaWindow
from policies.prefix_index import PrefixIndex
from policies.types import Outcome, RequestInfo, Status

OK = Outcome(Status.OK)


def req(i: int, hashes: tuple[int, ...] = ()) -> RequestInfo:
    return RequestInfo(f"r{i}", "m", 0.0, 100, 10, prefix_hashes=hashes)


def test_the_window_holds_latency_worker_and_load_at_dispatch():
    w = PoaWindow(window_s=10.0)
    a, b, c = req(1), req(2), req(3)
    for r in (a, b, c):
        w.on_arrival(r, 0.0)
    w.on_dispatch(a, "w0", 0.1)  # w0: 1 in flight
    w.on_dispatch(b, "w0", 0.2)  # w0: 2
    w.on_dispatch(c, "w1", 0.3)  # w1: 1
    w.on_complete(a, OK, 1.0)
    w.on_complete(b, OK, 2.0)
    w.on_complete(c, Outcome(Status.ERROR), 2.5)  # only ok outcomes count
    got = w.window(3.0)
    assert [(d.latency, d.worker, d.load) for d in got] == [(1.0, "w0", 1), (2.0, "w0", 2)]
    assert not w._tracker._in_flight and not w._tracker._dispatched
    # eq. 12 with n_w0 frozen at the mean of its requests' loads (1.5), w1 a column at 0
    est = w.paper(3.0, workers=["w0", "w1"])
    assert est == poa_paper([1.0, 2.0], {"w0": 1.5, "w1": 0.0}, None, PaperCost())
    assert w.window(13.5) == [] and w.paper(13.5) is None


def test_a_retry_moves_the_load_and_the_window_is_bounded():
    w = PoaWindow(max_requests=3)
    r = req(1)
    w.on_arrival(r, 0.0)
    w.on_dispatch(r, "w0", 0.0)
    w.on_dispatch(r, "w1", 0.5)  # retried elsewhere
    assert w._tracker._in_flight == {"w1": 1}
    w.on_complete(r, OK, 1.0)
    for i in range(2, 10):
        q = req(i)
        w.on_arrival(q, i)
        w.on_dispatch(q, "w0", i)
        w.on_complete(q, OK, i + 0.5)
    assert len(w.window(10.0)) == 3


def test_overlap_from_the_index_and_the_calibrated_estimate():
    index = PrefixIndex()
    index.record("w1", (7, 8), 0.0)
    w = PoaWindow(index=index)
    for i, (worker, lat) in enumerate([("w0", 0.2), ("w1", 0.3), ("w0", 0.4), ("w1", 0.5)]):
        q = RequestInfo(f"r{i}", "m", float(i), 100, 10, prefix_hashes=(7, 8, 9, 10))
        w.on_arrival(q, q.arrival)  # the core's `now` at arrival is the request's arrival
        w.on_dispatch(q, worker, float(i))
        w.on_complete(q, OK, i + lat)
    est = w.paper(5.0)
    n = {"w0": 1.0, "w1": 1.0}
    overlap = [{"w0": 0.0, "w1": 0.5}] * 4
    assert est == poa_paper([0.2, 0.3, 0.4, 0.5], n, overlap, PaperCost())
    cal = w.calibrated(5.0)
    assert cal is not None and cal.actual == pytest.approx(1.4) and cal.ratio > 0
    assert PoaWindow().calibrated(0.0) is None


def test_pending_requests_are_bounded():
    w = PoaWindow(max_pending=2)
    for i in range(5):
        q = req(i)
        w.on_arrival(q, 0.0)
        w.on_dispatch(q, "w0", 0.0)
    t = w._tracker
    assert len(t._dispatched) == 2 and t._in_flight == {"w0": 2}
    w.on_complete(req(0), OK, 1.0)  # its dispatch was dropped: nothing to record
    w.on_complete(req(4), OK, 1.0)
    assert [d.load for d in w.window(1.0)] == [2] and t._in_flight == {"w0": 1}


def test_one_tracker_feeds_every_pools_window():
    short, long = PoaWindow(window_s=10.0), PoaWindow(window_s=10.0)
    pools = {"s0": short, "s1": short, "l0": long}
    t = PoaTracker(pools.get)
    a, b, c, d = (RequestInfo(f"r{i}", "m", 0.5 * i, 100, 10) for i in range(4))
    for r, worker in ((a, "s0"), (b, "s0"), (c, "l0"), (d, "x9")):  # x9: no window's
        t.on_arrival(r, r.arrival)
        t.on_dispatch(r, worker, r.arrival)
    t.on_dispatch(b, "s1", 1.0)  # retried on s1: s0 has one in flight again
    assert t._in_flight == {"s0": 1, "s1": 1, "l0": 1}
    for r in (a, b, c, d):
        t.on_complete(r, OK, 3.0)
    assert [(x.worker, x.load, x.latency) for x in short.window(3.0)] == [
        ("s0", 1, 3.0),
        ("s1", 1, 2.5),
    ]
    assert [(x.worker, x.latency) for x in long.window(3.0)] == [("l0", 2.0)]
    assert not t._in_flight and not t._dispatched
