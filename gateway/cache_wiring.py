"""The gateway's side of cache-aware routing (docs/CACHE_ROUTING.md): the composition
root's routers told the size of the gateway's hashed blocks, what the routers read of a
request filled before the core starts it (gateway/cache_routing.py), the routers' gauges,
the PoA diagnostics computed off the loop (gateway/poa_gauges.py) and the engines' KV
events feeding the prefix index (gateway/kv_events.py).

With the default routing no router reads a request field: `route_fields` is empty, the
driver reads nothing and nothing here runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

from compressor.served import load_served
from gateway import cache_routing, routing_gauges
from gateway.config import ConfigError, GatewayConfig
from gateway.kv_events import KvEventCollector, KvEventConsumer, Stream, endpoint_for
from gateway.metrics import GatewayMetrics
from gateway.openai_request import ParsedRequest
from gateway.poa_gauges import PoaCollector, PoaMonitor
from gateway.workers import Fleet
from policies.build import Choice, CoreSpec, request_fields
from policies.core import Core
from policies.events import Request
from policies.hooks import Hook
from policies.prefix_index import PrefixIndex


def _hashed_blocks(choice: Choice, tokens: int) -> Choice:
    """A cache-aware router reads the gateway's prefix hashes (gateway/cache_routing.py): a
    hashed block stands for `tokens` tokens unless configured."""
    fields = request_fields(CoreSpec(routing=choice))
    if "prefix_hashes" not in fields or "hash_block_tokens" in choice.params:
        return choice
    return Choice(choice.policy, {**choice.params, "hash_block_tokens": tokens})


def hashed_block_tokens(config: GatewayConfig) -> int:
    """Tokens per hashed block of a request's prefix hashes: the engines' KV block when
    some pool follows their KV events (token-id chains), else a byte chunk's ~128."""
    events = config.kv_events_pools()
    if events:
        return next(iter(events.values())).block_size
    return cache_routing.HASH_BLOCK_TOKENS


def cache_pools(config: GatewayConfig, spec: CoreSpec) -> list[str]:
    """The worker pools whose router is cache-aware (reads request fields)."""
    return [
        name
        for name, pool in config.pools.items()
        if pool.kind == "workers"
        and request_fields(CoreSpec(routing=spec.pool_routing.get(name, spec.routing)))
    ]


def gateway_core_spec(config: GatewayConfig) -> CoreSpec:
    """The configuration's `CoreSpec` (the simulator's translation, policies/spec.py), its
    cache-aware routers told the size of the gateway's hashed blocks."""
    spec = config.core_spec()
    tokens = hashed_block_tokens(config)
    return replace(
        spec,
        routing=_hashed_blocks(spec.routing, tokens),
        pool_routing={name: _hashed_blocks(c, tokens) for name, c in spec.pool_routing.items()},
    )


def kv_event_streams(config: GatewayConfig, fleet: Fleet) -> list[Stream]:
    """One stream per worker of each pool with `kv_events`."""
    streams = []
    for name, ev in config.kv_events_pools().items():
        own = {w.url: w.kv_events_endpoint for w in config.pools[name].workers}
        for w in fleet.pools.get(name, ()):
            endpoint = endpoint_for(ev.endpoint, w.url, own.get(w.url))
            streams.append(Stream(name, w.id, endpoint, ev.topic, ev.max_message_bytes))
    return streams


class CacheRouting:
    """What cache-aware routing adds to the gateway's driver, built with it."""

    def __init__(
        self,
        core: Core,
        config: GatewayConfig,
        fleet: Fleet,
        metrics: GatewayMetrics,
        spec: CoreSpec,
        executor: Executor | None,
    ) -> None:
        self.core = core
        # what the configured routers read of a request (the cache-aware ones: prefix
        # hashes, session, a (τ, ω) override); empty by default, and then nothing is read
        self.route_fields = request_fields(spec)
        self.poa: PoaMonitor | None = None
        self.kv_events: KvEventConsumer | None = None
        # prefix hashes: byte chunks, or token-id chains where engines publish KV events
        self.hasher: Callable[[ParsedRequest], tuple[int, ...]] = cache_routing.prompt_hashes
        # token-id hashing (kv_events) of a long prompt runs on a thread (tiktoken releases
        # the GIL): ~80 µs a KiB would stall the loop (bench/prompt_hashing.py)
        self.hash_off_loop = False
        self.hash_executor = executor  # None: the loop's default executor
        if self.route_fields:  # cache-aware routing: its gauges, its decisions timed
            core.router_for = routing_gauges.timed(core.router_for, metrics.registry)
            pairs = {name: pd.selector for name, pd in core.pd_pools.items()}
            metrics.registry.register(routing_gauges.RoutingCollector(core.routers, pairs))
            pools = cache_pools(config, spec)
            if pools and config.telemetry.poa_interval_s > 0:
                # the PoA diagnostics: windows among the hooks, estimates off the loop
                self.poa = PoaMonitor(
                    pools,
                    core.routers,
                    lambda pool: [w.id for w in fleet.pools.get(pool, ())],
                    lambda worker: getattr(fleet.workers.get(worker), "pool", None),
                    config.telemetry.poa_interval_s,
                )
                core.hooks = (*core.hooks, *self.poa.hooks())
                metrics.registry.register(PoaCollector(self.poa))
            if config.kv_events_pools() and "prefix_hashes" in self.route_fields:
                self._follow_kv_events(config, fleet, metrics, spec)

    async def describe(
        self,
        request: Request,
        parsed: ParsedRequest,
        raw: bytes,
        routing: tuple[bytes | None, bytes | None, bytes | None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Fill what the routers read of `request` (its prefix hashes — a long prompt's
        token ids on a thread —, its session, a (τ, ω) override) before the core starts it."""
        if self.hash_off_loop and len(raw) > cache_routing.OFF_LOOP_BYTES:
            request.prefix_hashes = await loop.run_in_executor(
                self.hash_executor, self.hasher, parsed
            )
        cache_routing.describe(request, parsed, self.route_fields, *routing, hasher=self.hasher)

    def hooks(self) -> tuple[Hook, ...]:
        """The PoA windows' hooks (kept when the driver's hooks are set again)."""
        return () if self.poa is None else self.poa.hooks()

    def _follow_kv_events(
        self, config: GatewayConfig, fleet: Fleet, metrics: GatewayMetrics, spec: CoreSpec
    ) -> None:
        """The pools with `kv_events`: requests hashed as token-id chains, the pools'
        routers built now and their indexes fed by the engines' events."""
        events = config.kv_events_pools()
        first = next(iter(events))
        self.hasher = cache_routing.token_hasher(
            load_served(config.pools[first].tokenizer), hashed_block_tokens(config)
        )
        self.hash_off_loop = True
        core = self.core
        followed = cache_pools(config, spec)
        for pool in events:
            if pool not in followed:
                continue
            router = core.routers.get(pool)
            if router is None:
                router = core.routers[pool] = core.router_for(pool)
            state: Any = getattr(router, "state", None)
            if state is not None and hasattr(state, "fed"):
                state.fed = True  # the events (and dispatches) keep the index, not choices
        try:
            self.kv_events = KvEventConsumer(kv_event_streams(config, fleet), self._index_of)
        except ImportError:
            raise ConfigError(
                "pools.*.kv_events: needs pyzmq and msgpack (pip install fleetgate[kv-events])"
            ) from None
        metrics.registry.register(KvEventCollector(self.kv_events))

    def _index_of(self, pool: str) -> PrefixIndex | None:
        state: Any = getattr(self.core.routers.get(pool), "state", None)
        index = getattr(state, "index", None)
        return index if isinstance(index, PrefixIndex) else None
