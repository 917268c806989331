"""The price-of-anarchy diagnostics of the cache-aware pools, estimated off the event loop
and exported as gauges (docs/CACHE_ROUTING.md, "PoA diagnostics").

One estimate is a Hungarian assignment of a window of completions: 4–14 ms for a few
hundred requests, far too long for the event loop. So, per pool whose router is
cache-aware (`request_fields`), the driver keeps a `PoaWindow`, and one `PoaTracker` among
the core's hooks feeds them all (per request: the worker's pool looked up at dispatch, a
tuple appended at completion), and every `interval_s`:

1. on the loop, each window is cut to its last `window_s` and copied — at most
   `max_requests` tuples as the hook recorded them, microseconds;
2. on a dedicated one-thread executor (`fleetgate-poa`), both estimates are computed from
   the copies: eq. 12 with the paper's constants (`paper_estimate`; its overlap term reads
   the router's prefix index as it is then — single dictionary look-ups, atomic under the
   GIL, so a view the loop may move on while it is read, like any overlap here) and the
   fitted-cost variant (`calibrated_estimate`);
3. the results replace the last ones, read by the collector at scrape time:

    fleetgate_routing_poa_ratio{pool,estimator="paper"|"calibrated"}
    fleetgate_routing_poa_window_requests{pool}   completions in the last estimate's window
    fleetgate_routing_poa_estimate_seconds{pool}  the last estimate's thread CPU time

A ratio is absent while its estimate is undefined (an empty window; fewer than 3
completions or a fit that cannot serve the window, for `calibrated`). Nothing of this runs
on a request's path but the windows' hooks, and nothing at all without a cache-aware
router. The estimating thread still takes the GIL for its Python parts (building the
matrix), so the loop may wait up to a switch interval (5 ms) at a time while it runs —
every `interval_s`, not per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from policies.poa import PoaResult
from policies.poa_window import (
    CompletedTuple,
    PoaTracker,
    PoaWindow,
    calibrated_estimate,
    completed,
    paper_estimate,
)
from policies.prefix_index import PrefixIndex
from policies.protocols.routing import Router

log = logging.getLogger("fleetgate.poa")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one pool's estimate reads, copied on the loop."""

    pool: str
    now: float
    done: tuple[CompletedTuple, ...]  # as recorded: built into `Completed`s on the thread
    workers: tuple[str, ...]
    index: PrefixIndex | None
    capacity: float


@dataclass(frozen=True, slots=True)
class Estimates:
    paper: PoaResult | None
    calibrated: PoaResult | None
    requests: int
    cpu_s: float


def estimate(snap: Snapshot) -> Estimates:
    """Both estimates of one snapshot (run on the executor's thread)."""
    t0 = time.thread_time()
    done = completed(snap.done)
    paper = paper_estimate(done, snap.now, snap.workers, snap.index)
    calibrated = calibrated_estimate(done, snap.workers, snap.capacity)
    return Estimates(paper, calibrated, len(snap.done), time.thread_time() - t0)


class PoaMonitor:
    """The windows of the cache-aware pools, estimated every `interval_s` off the loop."""

    def __init__(
        self,
        pools: Sequence[str],
        routers: Mapping[str, Router],
        workers_of: Callable[[str], list[str]],
        pool_of: Callable[[str], str | None],
        interval_s: float = 5.0,
        window_s: float = 60.0,
        max_requests: int = 512,
    ) -> None:
        self.routers = routers  # the core's, filled as pools are first routed
        self.workers_of = workers_of
        self.interval_s = interval_s
        self.windows = {
            pool: PoaWindow(window_s=window_s, max_requests=max_requests) for pool in pools
        }
        windows = self.windows

        def window_of(worker: str) -> PoaWindow | None:
            pool = pool_of(worker)
            return None if pool is None else windows.get(pool)

        # one hook for every pool's window: the worker's pool looked up once per request
        self.tracker = PoaTracker(window_of)
        self.results: dict[str, Estimates] = {}
        self.estimate: Callable[[Snapshot], Estimates] = estimate  # what the thread runs
        self.executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    def hooks(self) -> tuple[PoaTracker, ...]:
        return (self.tracker,) if self.windows else ()

    def snapshots(self, now: float) -> list[Snapshot]:
        """Each window's completions now (on the loop: a bounded copy)."""
        out = []
        for pool, window in self.windows.items():
            state: Any = getattr(self.routers.get(pool), "state", None)
            index = getattr(state, "index", None)
            out.append(
                Snapshot(
                    pool,
                    now,
                    window.recent(now),
                    tuple(self.workers_of(pool)),
                    index if isinstance(index, PrefixIndex) else None,
                    window.capacity,
                )
            )
        return out

    async def run_once(self, loop: asyncio.AbstractEventLoop) -> None:
        """One round: snapshot on the loop, estimate on the executor."""
        if self.executor is None:
            self.executor = ThreadPoolExecutor(1, thread_name_prefix="fleetgate-poa")
        for snap in self.snapshots(loop.time()):
            self.results[snap.pool] = await loop.run_in_executor(self.executor, self.estimate, snap)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._task is None and self.windows:
            self._task = loop.create_task(self._run(loop))

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.run_once(loop)
            except Exception:  # a diagnostic must never take the gateway down
                log.exception("PoA estimate failed")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None


class PoaCollector(Collector):
    def __init__(self, monitor: PoaMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        ratio = GaugeMetricFamily(
            "fleetgate_routing_poa_ratio",
            "Price-of-anarchy diagnostic over the last window of completions: eq. 12 with"
            " the paper's constants (paper) or a cost model fitted to the window (calibrated)."
            " A regime indicator, not an efficiency.",
            labels=["pool", "estimator"],
        )
        size = GaugeMetricFamily(
            "fleetgate_routing_poa_window_requests",
            "Completions in the last PoA estimate's window.",
            labels=["pool"],
        )
        cpu = GaugeMetricFamily(
            "fleetgate_routing_poa_estimate_seconds",
            "Thread CPU time of the last PoA estimate (both estimators, off the event loop).",
            labels=["pool"],
        )
        for pool, est in list(self.monitor.results.items()):
            for name, result in (("paper", est.paper), ("calibrated", est.calibrated)):
                if result is not None:
                    ratio.add_metric([pool, name], result.ratio)
            size.add_metric([pool], est.requests)
            cpu.add_metric([pool], est.cpu_s)
        yield from (ratio, size, cpu)
