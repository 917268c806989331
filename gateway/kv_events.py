"""The engines' KV-cache events consumed into the cache-aware routers' prefix index
(docs/WIRE_SPEC.md §8, docs/CACHE_ROUTING.md "KV events"). Optional, off by default: a
pool with `kv_events`, pyzmq and msgpack installed (`pip install fleetgate[kv-events]`).

One ZMQ SUB socket per worker of such a pool, connected to the worker's endpoint (the
pool's `kv_events.endpoint` with `{host}` the worker URL's host, or the worker's own
`kv_events_endpoint`), subscribed to the pool's topic. Each message is `(topic, seq,
payload)`; the payload, msgpack of vLLM's `KVEventBatch` (`[ts, events, …]`), is applied
in order to the pool router's index by `KvEventApplier` (policies/kv_events.py: stored
blocks re-hashed from their token ids, removals, clears). A `seq` that skips numbers means
lost batches (the PUB socket drops at its high-water mark, or the consumer started late):
the worker's blocks are forgotten and rebuilt from the following events — the replay
socket is not used. A malformed or oversized batch (`max_message_bytes`, enforced by ZMQ)
is counted and resynchronises the same way, and so does an engine restarted without
AllBlocksCleared: its publisher numbers batches from 0 again (ZMQ's SUB reconnects by
itself), which breaks the sequence at its first batch heard.

Bounds: the index keeps its bound and its TTL for event-fed entries too; the applier's
engine → own maps age with the same TTL and hold at most the index's bound over all
workers (policies/kv_events.py).
ZMQ here has no authentication: the endpoints are on the engines' own network, like their
/metrics that the gateway scrapes.

    fleetgate_kv_events_total{pool,event}   stored / removed blocks, cleared caches,
                                            unplaced blocks (parent unknown)
    fleetgate_kv_event_gaps_total{pool}     batches lost (seq gaps) or refused (malformed)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from policies.kv_events import KvEventApplier
from policies.prefix_index import PrefixIndex

log = logging.getLogger("fleetgate.kv_events")


@dataclass(frozen=True, slots=True)
class Stream:
    pool: str
    worker: str
    endpoint: str
    topic: str
    max_message_bytes: int


def endpoint_for(template: str, worker_url: str, own: str | None) -> str:
    """A worker's event endpoint: its own, else the pool's template for its host."""
    if own:
        return own
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    return template.replace("{host}", f"[{host}]" if ":" in host else host)


class KvEventConsumer:
    """Follows every stream; `appliers[pool]` applies a pool's events to its index."""

    def __init__(self, streams: list[Stream], index_of: Callable[[str], PrefixIndex | None]):
        import msgpack  # noqa: F401  optional, as zmq: only with kv_events (ImportError)
        import zmq.asyncio

        self.streams = streams
        self.index_of = index_of
        self.appliers: dict[str, KvEventApplier] = {}
        self.gaps: dict[str, int] = {}
        self._ctx = zmq.asyncio.Context()
        self._tasks: list[asyncio.Task[None]] = []

    def applier(self, pool: str) -> KvEventApplier | None:
        found = self.appliers.get(pool)
        if found is None:
            index = self.index_of(pool)
            if index is None:
                return None
            found = self.appliers[pool] = KvEventApplier(index, index.max_blocks)
        return found

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        for stream in self.streams:
            self._tasks.append(loop.create_task(self._follow(stream, loop)))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._ctx.destroy(linger=0)

    async def _follow(self, s: Stream, loop: asyncio.AbstractEventLoop) -> None:
        import msgpack
        import zmq

        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.MAXMSGSIZE, s.max_message_bytes)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, s.topic.encode())
        sock.connect(s.endpoint)
        expected: int | None = None
        try:
            while True:
                frames = await sock.recv_multipart()
                applier = self.applier(s.pool)
                if applier is None:
                    continue  # the pool's router keeps no index
                if len(frames) == 3 and len(frames[1]) == 8:
                    seq = int.from_bytes(frames[1], "big")
                    if expected is not None and seq != expected:  # batches lost
                        self._resync(s, applier, f"seq {seq}, expected {expected}")
                    expected = seq + 1
                else:
                    self._resync(s, applier, "not a (topic, seq, payload) message")
                    expected = None
                    continue
                try:
                    batch: Any = msgpack.unpackb(frames[2], strict_map_key=False)
                    if not isinstance(batch, list) or len(batch) < 2:
                        raise ValueError("a KV event batch is [ts, events, ...]")
                    events = batch[1]
                    if not isinstance(events, list):
                        raise ValueError("a KV event batch's events are an array")
                    applier.apply(s.worker, events, loop.time())
                except (ValueError, TypeError, msgpack.UnpackException) as exc:
                    self._resync(s, applier, str(exc))
        finally:
            sock.close(0)

    def _resync(self, s: Stream, applier: KvEventApplier, why: str) -> None:
        """Events were lost or refused: forget the worker's blocks, rebuild from the next."""
        self.gaps[s.pool] = self.gaps.get(s.pool, 0) + 1
        log.warning("kv events of %s (%s): %s; resynchronising", s.worker, s.endpoint, why)
        applier.reset(s.worker)


class KvEventCollector(Collector):
    def __init__(self, consumer: KvEventConsumer) -> None:
        self.consumer = consumer

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "fleetgate_kv_events",
            "KV-cache events applied to the prefix index: stored and removed blocks,"
            " cleared caches, stored blocks whose parent was unknown (unplaced).",
            labels=["pool", "event"],
        )
        gaps = CounterMetricFamily(
            "fleetgate_kv_event_gaps",
            "KV event batches lost (sequence gaps) or refused (malformed): the worker's"
            " blocks were forgotten and rebuilt from later events.",
            labels=["pool"],
        )
        appliers: Mapping[str, KvEventApplier] = dict(self.consumer.appliers)
        for pool, a in appliers.items():
            for name, value in (
                ("stored", a.stored),
                ("removed", a.removed),
                ("cleared", a.cleared),
                ("unplaced", a.unplaced),
            ):
                events.add_metric([pool, name], value)
        for pool, n in dict(self.consumer.gaps).items():
            gaps.add_metric([pool], n)
        yield from (events, gaps)
