"""The PoA window hook (policies/poa_window.py): what it records from the core's events."""

import pytest

from policies.poa import PaperCost, poa_paper
from policies.poa_window import PoaWindow
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
    assert not w._in_flight and not w._dispatched and not w._arrived
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
    assert w._in_flight == {"w1": 1}
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
        q = req(i, (7, 8, 9, 10))
        w.on_arrival(q, float(i))
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
    assert len(w._arrived) == 2 and len(w._dispatched) <= 3
    assert w._in_flight == {"w0": len(w._dispatched)}
