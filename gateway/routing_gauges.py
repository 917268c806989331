"""What the cache-aware routers export (docs/CACHE_ROUTING.md), per pool, read at scrape
time from the routers the core built — nothing is computed per request but the decision
time, and only for those routers:

    fleetgate_routing_decision_seconds{pool}       histogram: one `choose` (wall clock)
    fleetgate_routing_temperature{pool}            τ now (kv_cost, regime_adaptive)
    fleetgate_routing_overlap_weight{pool}         ω now
    fleetgate_routing_regime{pool}                 0 Below, 1 Transition, 2 Saturated
    fleetgate_routing_ttft_p99_smoothed_seconds{pool}   the detector's L̄ (-1: none yet)
    fleetgate_routing_regime_changes_total{pool}
    fleetgate_prefix_index_blocks{pool}            (worker, block) entries held
    fleetgate_prefix_index_queried_blocks_total{pool}   prompt blocks dispatched
    fleetgate_prefix_index_hit_blocks_total{pool}  of them, held by the index for the
                                                   chosen worker: its hit-rate estimate

A `pd` pool's pair selector is read the same way (its decode choice's τ, ω and regime;
the prefix index of the side it keeps). The engines' own hit rate is `fleetgate_worker_engine_prefix_hit_rate` (gateway/metrics.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from policies.protocols.routing import Router
from policies.types import RequestInfo, WorkerView

_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2)


class TimedRouter:
    """A router whose decisions are timed into a histogram child; every other attribute
    is the router's own (its state, τ, ω, regime)."""

    __slots__ = ("_choose", "_observe", "_router", "name")

    def __init__(self, router: Router, observe: Callable[[float], None]) -> None:
        self._router = router
        self.name = router.name
        self._choose = router.choose
        self._observe = observe

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        t0 = time.perf_counter()
        chosen = self._choose(request, candidates)
        self._observe(time.perf_counter() - t0)
        return chosen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._router, name)


def timed(
    router_for: Callable[[str], Router], registry: CollectorRegistry
) -> Callable[[str], Router]:
    """`router_for` whose cache-aware routers (those reading request fields) are timed."""
    hist = Histogram(
        "fleetgate_routing_decision_seconds",
        "Time of one cache-aware routing decision (wall clock, the router's choose).",
        ["pool"],
        buckets=_BUCKETS,
        registry=registry,
    )

    def build(pool: str) -> Router:
        router = router_for(pool)
        if not getattr(router, "request_fields", ()):
            return router
        return TimedRouter(router, hist.labels(pool).observe)

    return build


class RoutingCollector(Collector):
    def __init__(
        self, routers: Mapping[str, Router], pairs: Mapping[str, Any] | None = None
    ) -> None:
        self.routers = routers  # the core's, filled as pools are first routed
        # the `pd` pools' pair selectors (policies/pd/), read the same way: the decode
        # side's τ, ω and regime (kv_cost_decode, regime_adaptive), a side's prefix index
        self.pairs = dict(pairs or {})

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["pool"])

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=["pool"])

        tau = gauge("fleetgate_routing_temperature", "kv_cost's softmax temperature τ now.")
        omega = gauge("fleetgate_routing_overlap_weight", "kv_cost's overlap weight ω now.")
        regime = gauge(
            "fleetgate_routing_regime",
            "regime_adaptive's saturation regime: 0 Below, 1 Transition, 2 Saturated.",
        )
        smoothed = gauge(
            "fleetgate_routing_ttft_p99_smoothed_seconds",
            "The saturation detector's EWMA of the TTFT P99 (-1: no interval with traffic yet).",
        )
        changes = counter(
            "fleetgate_routing_regime_changes", "Regime changes of the saturation detector."
        )
        blocks = gauge(
            "fleetgate_prefix_index_blocks", "(worker, block) entries the prefix index holds."
        )
        queried = counter(
            "fleetgate_prefix_index_queried_blocks", "Prompt blocks dispatched (hashed)."
        )
        hits = counter(
            "fleetgate_prefix_index_hit_blocks",
            "Dispatched prompt blocks the prefix index held for the chosen worker.",
        )
        for pool, router in [*self.routers.items(), *self.pairs.items()]:
            r: Any = router
            lv = [pool]
            if hasattr(r, "overlap_weight") and hasattr(r, "temperature"):
                tau.add_metric(lv, r.temperature)
                omega.add_metric(lv, r.overlap_weight)
            detector = getattr(r, "detector", None)
            if detector is not None:
                regime.add_metric(lv, int(getattr(r, "regime", detector.regime)))
                sm = detector.smoothed
                smoothed.add_metric(lv, -1.0 if sm is None else sm)
                changes.add_metric(lv, detector.changes)
            state = getattr(r, "state", None)
            if state is not None and hasattr(state, "hit_blocks"):
                blocks.add_metric(lv, len(state.index))
                queried.add_metric(lv, state.queried_blocks)
                hits.add_metric(lv, state.hit_blocks)
        yield from (tau, omega, regime, smoothed, changes, blocks, queried, hits)
