"""The `pd` pools' metrics (docs/PD.md): hand-offs, the prefill and transfer times the
gateway sees, and at scrape time the prefill queue and each role's utilisation.

    fleetgate_pd_handoffs_total{pool,outcome}   pairs by how they ended: ok (the KV left the
                                                 prefill), prefill_failed, decode_failed
    fleetgate_pd_prefill_seconds{pool}           the prefill call: sent → its answer (the
                                                 hand-off)
    fleetgate_pd_transfer_seconds{pool}          hand-off → the decode's first byte: the KV's
                                                 transfer and the decode's first step
    fleetgate_pd_prefill_queue{pool,worker}      requests on a prefill worker not handed off
    fleetgate_pd_role_in_flight{pool,role}       requests holding a slot of that role
    fleetgate_pd_role_utilisation{pool,role}     that over the role's capacity (Σ max_num_seqs;
                                                 absent when a worker has none)
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gateway.workers import Fleet

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _RoleCollector(Collector):
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily(
            "fleetgate_pd_prefill_queue",
            "Requests on a prefill worker of a pd pool not handed off yet.",
            labels=["pool", "worker"],
        )
        in_flight = GaugeMetricFamily(
            "fleetgate_pd_role_in_flight",
            "Requests holding a slot of each role of a pd pool.",
            labels=["pool", "role"],
        )
        util = GaugeMetricFamily(
            "fleetgate_pd_role_utilisation",
            "Slots held over the role's capacity (Σ max_num_seqs), per pd pool and role.",
            labels=["pool", "role"],
        )
        for pool, workers in self.fleet.pools.items():
            for role in ("prefill", "decode"):
                mine = [w for w in workers if w.role == role]
                if not mine:
                    continue
                busy = sum(w.in_flight for w in mine)
                in_flight.add_metric([pool, role], busy)
                caps = [w.capacity for w in mine]
                if all(c is not None for c in caps):
                    total = sum(c for c in caps if c is not None)
                    util.add_metric([pool, role], busy / total if total else 0.0)
                if role == "prefill":
                    for w in mine:
                        queue.add_metric([pool, w.id], w.in_flight)
        yield queue
        yield in_flight
        yield util


class PdMetrics:
    def __init__(self, registry: CollectorRegistry, fleet: Fleet) -> None:
        self.handoffs = Counter(
            "fleetgate_pd_handoffs",
            "pd pool pairs by how they ended: ok, prefill_failed, decode_failed.",
            ["pool", "outcome"],
            registry=registry,
        )
        self.prefill_seconds = Histogram(
            "fleetgate_pd_prefill_seconds",
            "A pd pool's prefill call, sent to answered (the hand-off).",
            ["pool"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.transfer_seconds = Histogram(
            "fleetgate_pd_transfer_seconds",
            "A pd pool's hand-off to the decode's first byte (KV transfer + first step).",
            ["pool"],
            buckets=_BUCKETS,
            registry=registry,
        )
        registry.register(_RoleCollector(fleet))
