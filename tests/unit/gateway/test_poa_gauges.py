"""The PoA diagnostics' gauges (gateway/poa_gauges.py): windows fed by the core's events,
estimated on the monitor's own thread while the event loop keeps running."""

from __future__ import annotations

import asyncio
import threading

from prometheus_client import CollectorRegistry

from gateway.poa_gauges import Estimates, PoaCollector, PoaMonitor, Snapshot, estimate
from policies.types import Outcome, RequestInfo, Status

OK = Outcome(Status.OK)
POOL_OF = {"w0": "short", "w1": "short", "x0": "long"}


def monitor() -> PoaMonitor:
    return PoaMonitor(
        ["short"],
        {},
        lambda pool: [w for w, p in POOL_OF.items() if p == pool],
        POOL_OF.get,
        interval_s=3600.0,
    )


def feed(m: PoaMonitor, t: float) -> None:
    """Two ok completions on w0 (at loads 1 and 2), one on the other pool's x0."""
    (window,) = m.hooks()
    rs = [RequestInfo(f"r{i}", "m", t, 100, 10) for i in range(3)]
    for r in rs:
        window.on_arrival(r, t)
    window.on_dispatch(rs[0], "w0", t)
    window.on_dispatch(rs[1], "w0", t)
    window.on_dispatch(rs[2], "x0", t)  # not this pool's: leaves the window
    window.on_complete(rs[0], OK, t + 1.0)
    window.on_complete(rs[1], OK, t + 2.0)
    window.on_complete(rs[2], OK, t + 2.0)


def test_the_estimate_runs_on_the_monitors_thread_while_the_loop_runs():
    m = monitor()
    ran: list[tuple[str, bool]] = []

    async def main() -> dict[str, Estimates]:
        loop = asyncio.get_running_loop()
        feed(m, loop.time() - 3.0)

        def on_thread(snap: Snapshot) -> Estimates:
            # completes only if the loop runs a callback while the estimate is under way:
            # an estimate on the loop's own thread would wait here in vain
            answered = threading.Event()
            loop.call_soon_threadsafe(answered.set)
            ran.append((threading.current_thread().name, answered.wait(30.0)))
            return estimate(snap)

        m.estimate = on_thread
        try:
            await m.run_once(loop)
        finally:
            await m.stop()
        return m.results

    results = asyncio.run(main())
    assert len(ran) == 1
    name, loop_answered = ran[0]
    assert name.startswith("fleetgate-poa") and loop_answered
    assert results["short"].requests == 2


def test_the_gauges_export_both_estimates_per_pool():
    m = monitor()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        feed(m, loop.time() - 3.0)
        try:
            await m.run_once(loop)
        finally:
            await m.stop()

    registry = CollectorRegistry()
    registry.register(PoaCollector(m))
    assert (
        registry.get_sample_value("fleetgate_routing_poa_window_requests", {"pool": "short"})
        is None
    )
    asyncio.run(main())
    # eq. 12 by hand: n_w0 = 1.5, n_w1 = 0; both requests' cheapest copy is w1's,
    # b + d / 64² each (no prefix index: no overlap term)
    opt = 2 * (0.020 + 0.010 / 64**2)
    paper = registry.get_sample_value(
        "fleetgate_routing_poa_ratio", {"pool": "short", "estimator": "paper"}
    )
    assert paper is not None and abs(paper - 3.0 / opt) < 1e-9
    # the fitted variant needs 3 completions: absent, not a made-up number
    calibrated = {"pool": "short", "estimator": "calibrated"}
    assert registry.get_sample_value("fleetgate_routing_poa_ratio", calibrated) is None
    assert (
        registry.get_sample_value("fleetgate_routing_poa_window_requests", {"pool": "short"}) == 2
    )
    cpu = registry.get_sample_value("fleetgate_routing_poa_estimate_seconds", {"pool": "short"})
    assert cpu is not None and cpu >= 0


def test_the_calibrated_estimate_appears_with_enough_completions():
    m = monitor()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        feed(m, now - 6.0)
        feed(m, now - 3.0)
        try:
            await m.run_once(loop)
        finally:
            await m.stop()

    asyncio.run(main())
    est = m.results["short"]
    assert est.requests == 4 and est.paper is not None and est.calibrated is not None
