"""The dp_group pools' series (policies/dp_group.py), read from the core's groups at scrape
time: each rank's load and requests, the group's imbalance and estimated barrier idle,
its holding pool, and the assignments per rank. The pool wait is a histogram observed at
each assignment (gateway/forward.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from policies.dp_group import DpGroup

# the pool wait's buckets: a request assigned at once, to one held for the pool's timeout
POOL_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class DpGroupCollector(Collector):
    def __init__(
        self, groups: Mapping[str, DpGroup], clock: Callable[[], float] | None = None
    ) -> None:
        self.groups = groups
        self.clock = clock  # the core's: a whole answer's estimated tokens grow with it

    def collect(self) -> Iterator[Metric]:
        load = GaugeMetricFamily(
            "fleetgate_dp_rank_load_tokens",
            "A data-parallel rank's load L_g: Σ over its requests in flight of prompt"
            " tokens + tokens streamed so far (a whole answer's: estimated at the group's"
            " decode rate).",
            labels=["pool", "rank"],
        )
        running = GaugeMetricFamily(
            "fleetgate_dp_rank_requests",
            "Requests this gateway has in flight on a data-parallel rank.",
            labels=["pool", "rank"],
        )
        assigned = CounterMetricFamily(
            "fleetgate_dp_assignments",
            "Requests the assignment policy gave each data-parallel rank.",
            labels=["pool", "rank"],
        )
        imbalance = GaugeMetricFamily(
            "fleetgate_dp_imbalance_tokens",
            "G·max_g L_g − Σ_g L_g over a dp_group's ranks now (BF-IO's imbalance).",
            labels=["pool"],
        )
        idle = GaugeMetricFamily(
            "fleetgate_dp_barrier_idle_ratio",
            "Estimated share of rank time idle at the barrier now, were a rank's step time"
            " proportional to its load: imbalance / (G·max_g L_g).",
            labels=["pool"],
        )
        pooled = GaugeMetricFamily(
            "fleetgate_dp_pool_length",
            "Requests waiting in a dp_group's holding pool for a rank.",
            labels=["pool"],
        )
        for name, group in list(self.groups.items()):
            loads = group.loads(self.clock() if self.clock is not None else None)
            counts = group.counts()
            for g, (L, n) in enumerate(zip(loads, counts, strict=True)):
                load.add_metric([name, str(g)], L)
                running.add_metric([name, str(g)], n)
                assigned.add_metric([name, str(g)], group.assigned[g])
            top = max(loads)
            imb = len(loads) * top - sum(loads)
            imbalance.add_metric([name], imb)
            idle.add_metric([name], imb / (len(loads) * top) if top else 0.0)
            pooled.add_metric([name], len(group.pooled))
        yield from (load, running, assigned, imbalance, idle, pooled)
