"""The gateway process's components and their life: `Gateway` starts the fleet's soft
state, the upstream client, the scrapers and health checks, metrics, the request log, the
token-pool tenancy and the driver (gateway/proxy.py), and stops them (gateway/app.py's `create_app` wraps
it in the ASGI app; the API modules are handed it).
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from gateway import __version__, drain, tokenizer_probe, tracing
from gateway.apikeys import KeyDirectory
from gateway.config import ConfigError, ConfigSource, GatewayConfig
from gateway.discovery_k8s import Discovery
from gateway.health import HealthChecker
from gateway.metrics import GatewayMetrics
from gateway.proxy import GatewayDriver
from gateway.reload import Reloader, ReloadResult
from gateway.requestlog import RequestLog
from gateway.telemetry import Scraper
from gateway.tenancy import Tenancy
from gateway.traffic import TrafficHistogram
from gateway.upstream import Timeouts, UpstreamClient
from gateway.workers import Fleet, WorkerState

log = logging.getLogger("fleetgate.gateway")

_YOUNG_GC_THRESHOLD = 10_000
# this process among the replicas sharing an entitlement store (its holds carry it)
REPLICA_ID = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


class Gateway:
    """Everything one gateway process runs: the fleet's soft state, the upstream client,
    the scrapers and health checks, metrics, the request log and the driver."""

    def __init__(self, config: GatewayConfig, source: ConfigSource | None = None) -> None:
        self.config = config
        self.source = source  # the file a reload re-reads; None: nothing to reload
        self.reloader: Reloader | None = None
        self.version = __version__
        self.fleet = Fleet(config)
        self.started_at = int(time.time())
        self.driver: GatewayDriver | None = None
        self.draining = False  # SIGTERM received: refuse new work (gateway/drain.py)
        self._api_keys = tuple(k.encode() for k in config.auth.api_keys)
        # API keys → entitlements (HMACs); replaced by the tenancy's directory at start
        self.keys = KeyDirectory.build(config.auth.key_secret, config.entitlement_keys())
        self.tenancy: Tenancy | None = None
        self.discovery: Discovery | None = None  # pools with `discovery` (started at start)

    def key_ok(self, key: str) -> bool:
        given = key.encode()
        # constant time per key, and every key compared (no early exit on a match)
        if sum(hmac.compare_digest(given, k) for k in self._api_keys) > 0:
            return True
        return self.entitlement_of(key) is not None

    def entitlement_of(self, key: str) -> str | None:
        """The entitlement an API key names (auth.keys, the admin API's keys)."""
        return self.keys.entitlement_of(key)

    def ready(self) -> bool:
        return (
            not self.draining
            and self.driver is not None
            and self.fleet.any_ready(asyncio.get_running_loop().time())
        )

    async def start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        now = loop.time
        self.metrics = GatewayMetrics(self.fleet, now)
        self.client = UpstreamClient(
            Timeouts(
                cfg.upstream.connect_timeout_s,
                cfg.upstream.first_byte_timeout_s,
                cfg.upstream.idle_timeout_s,
                cfg.upstream.pool_wait_timeout_s,
            ),
            max_connections_per_worker=cfg.upstream.max_connections_per_worker,
            max_response_bytes=cfg.upstream.max_response_bytes,
        )
        rl = cfg.request_log
        self.request_log = RequestLog(
            rl.path,
            rl.max_bytes,
            rl.backups,
            queue_max=rl.queue_max,
            on_drop=lambda reason, n: self.metrics.request_log_dropped.labels(reason).inc(n),
        )
        self.traffic = TrafficHistogram(cfg.traffic.window_s, now)
        # httpx is right for the slow side: scrapes and health checks a few times a second
        self.control = httpx.AsyncClient(
            timeout=cfg.telemetry.timeout_s, limits=httpx.Limits(max_keepalive_connections=64)
        )
        workers = list(self.fleet.workers.values())
        self.scraper = Scraper(
            workers,
            self.control,
            cfg.telemetry.scrape_interval_s,
            now,
            lambda w, reason: self.metrics.scrape_errors.labels(w.id, reason).inc(),
        )
        self.health = HealthChecker(
            workers,
            self.control,
            cfg.health,
            lambda w: self.metrics.health_failures.labels(w.id).inc(),
        )
        # one round before serving, so that /readyz and routing start from real state
        await asyncio.gather(self.health.check_all(), *(self.scraper.scrape(w) for w in workers))
        self.scraper.start()
        self.health.start()
        # from here on the loops and the metrics follow the fleet's changes
        self.fleet.listeners[:] = [self.scraper, self.health, self.metrics, self]
        if any(p.discovery for p in cfg.pools.values()):
            # the first list of every discovered pool before serving (bounded)
            self.discovery = Discovery(
                self.fleet.set_discovered, self._forget_discovered, self._count_discovery
            )
            self.discovery.reconcile(cfg)
            await self.discovery.wait_synced()
        if self.source is not None:
            self.reloader = Reloader(
                self.source,
                self.fleet,
                lambda: self.config,
                self._set_config,
                lambda result: self.metrics.config_reloads.labels(result).inc(),
            )
            self.reloader.start(cfg.listen.reload_poll_s, loop)
        self.request_log.start()
        threads = cfg.placement.compress_workers
        self.compress_pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="fleetgate-compress")
            if threads
            else None
        )
        drain.install(self, cfg.listen.drain_delay_s, loop)
        self.driver = GatewayDriver(
            cfg,
            self.fleet,
            self.client,
            self.metrics,
            self.request_log,
            self.traffic,
            self,
            self.compress_pool,
        )
        self.metrics.watch_dispatch(self.driver.core.dispatcher)
        self.metrics.watch_dp_groups(self.driver.core.groups, self.driver.core.clock.now)
        if self.driver.cache.poa is not None:  # a cache-aware router: the PoA diagnostics
            self.driver.cache.poa.start(loop)
        if self.driver.cache.kv_events is not None:  # engines' KV events feed the index
            self.driver.cache.kv_events.start(loop)
        # tokenizer: auto — which counter each pool uses, probed once, exported and logged
        await tokenizer_probe.settle_fleet(
            cfg, self.client, self.fleet, self.metrics, now, self.driver.fitter.engine
        )
        # token pools: the store (Redis: attached, published, heartbeat, control loop)
        self.tenancy = Tenancy.of(cfg, self.driver.core.admitter, REPLICA_ID)
        self.keys = self.tenancy.keys
        self.tenancy.fleet_counts = self.fleet.active_counts
        self.tenancy.fleet_listed = self.fleet.listed_counts
        await self.tenancy.start()
        if self.tenancy.active:
            self.driver.tenancy = self.tenancy
            self.tenancy.on_evict = self.driver.evict
            self.metrics.tenancy.source = self.tenancy
        # OpenTelemetry (tracing.enabled): the steps' timers wrap the pipeline's objects, so
        # after everything that holds them (the token pools hold the core's admitter)
        if cfg.tracing.enabled and not tracing.ON:
            tracing.configure(cfg.tracing)
        tracing.install(self.driver)
        # The cyclic collector, tuned for a request server (measured with wrk at 64
        # connections: 8.9 % of the CPU in collections before, < 1 % after, +14 % req/s):
        # - everything built so far (FastAPI, pydantic, compressor tables) lives as long as
        #   the process: frozen, no collection walks it again;
        # - a request's objects die by reference count when it ends, so a young collection
        #   every 700 allocations mostly finds in-flight requests' live objects and promotes
        #   them; every 10,000 it seldom runs at all.
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(_YOUNG_GC_THRESHOLD, older, oldest)
        log.info(
            "fleetgate %s: %d pools, %d workers (%d routable)",
            self.version,
            len(cfg.pools),
            len(workers),
            sum(w.routable(now()) for w in workers),
        )

    # FleetListener: a worker that left closes its idle engine connections
    def worker_added(self, worker: WorkerState) -> None:
        pass

    def worker_removed(self, worker: WorkerState) -> None:
        if not any(w.endpoint == worker.endpoint for w in self.fleet.workers.values()):
            self.client.forget(worker.endpoint)

    def _set_config(self, config: GatewayConfig) -> None:
        self.config = config
        # a reload may add, change or remove a pool's discovery
        if self.discovery is None and any(p.discovery for p in config.pools.values()):
            self.discovery = Discovery(
                self.fleet.set_discovered, self._forget_discovered, self._count_discovery
            )
        if self.discovery is not None:
            self.discovery.reconcile(config)

    def _count_discovery(self, pool: str, event: str) -> None:
        self.metrics.discovery_events.labels(pool, event).inc()

    def _forget_discovered(self, pool: str) -> None:
        self.fleet.discovered.pop(pool, None)

    async def reload(self, why: str) -> ReloadResult:
        """Re-read the configuration file and apply its fleet (ConfigError, FleetError)."""
        if self.reloader is None:
            raise ConfigError("no configuration file to reload (started without --config)")
        return await self.reloader.reload(why)

    async def stop(self) -> None:
        driver = self.driver
        if driver is None:
            return
        self.driver = None
        if driver.cache.poa is not None:
            await driver.cache.poa.stop()
        if driver.cache.kv_events is not None:
            await driver.cache.kv_events.stop()
        if self.tenancy is not None:
            await self.tenancy.stop()
        if self.reloader is not None:
            await self.reloader.stop()
        if self.discovery is not None:
            await self.discovery.stop()
        self.fleet.listeners.clear()
        await self.scraper.stop()
        await self.health.stop()
        await self.client.close()
        await self.control.aclose()
        await self.request_log.close()
        if self.compress_pool is not None:
            self.compress_pool.shutdown(wait=False, cancel_futures=True)
        if tracing.ON:  # what is left is exported (a blocking flush: on a thread)
            await asyncio.get_running_loop().run_in_executor(None, tracing.shutdown)
