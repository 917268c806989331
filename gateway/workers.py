"""The gateway's soft state about each worker: telemetry, health, breaker, in-flight work.

All of it is per process and rebuilt within seconds after a restart (a scrape and a health
check), so nothing here is shared between replicas. Routing sees it through `view()`, a
`WorkerView` snapshot merging the engine's last telemetry with our exact in-flight counts.

Circuit breaker: `breaker.failures` consecutive request failures (connect errors, resets,
timeouts, engine 5xx) open the circuit for `breaker.open_s`; after that the worker is
half-open: it gets traffic again, and one more failure re-opens it at once while a success
closes it. Health checks are separate: a worker failing `unhealthy_after` checks in a row
is unhealthy until `healthy_after` good checks. Either one keeps a worker out of routing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.config import GatewayConfig
from gateway.upstream import Endpoint
from policies.types import PoolSpec, WorkerView


@dataclass(slots=True)
class Telemetry:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_hit_rate: float = 0.0
    scraped_at: float | None = None  # monotonic time of the last good scrape
    # previous counter values, to turn vLLM's prefix-cache counters into a hit rate
    prefix_queries: float | None = None
    prefix_hits: float | None = None


@dataclass(slots=True)
class WorkerState:
    id: str
    pool: str
    url: str
    engine: str
    max_model_len: int
    endpoint: Endpoint
    extra_headers: bytes  # pre-encoded upstream headers (the worker's API key)
    pool_header: bytes = b""  # x-fleetgate-pool and x-fleetgate-worker values, encoded once
    id_header: bytes = b""
    in_flight: int = 0
    outstanding_tokens: int = 0
    capacity: int | None = None  # max_num_seqs from configuration; None: unbounded
    telemetry: Telemetry = field(default_factory=Telemetry)
    healthy: bool = True
    # answered a health check or a scrape since start: until then `healthy` is only the
    # benefit of the doubt, and readiness does not count the worker
    proven: bool = False
    health_fails: int = 0
    health_oks: int = 0
    breaker_fails: int = 0
    open_until: float = 0.0

    def breaker_open(self, now: float) -> bool:
        return now < self.open_until

    def routable(self, now: float) -> bool:
        return self.healthy and not self.breaker_open(now)

    def view(self, now: float, stale_after: float) -> WorkerView:
        t = self.telemetry
        return WorkerView(
            id=self.id,
            pool=self.pool,
            max_model_len=self.max_model_len,
            healthy=self.routable(now),
            stale=t.scraped_at is None or now - t.scraped_at > stale_after,
            running=t.running,
            waiting=t.waiting,
            kv_usage=t.kv_usage,
            prefix_hit_rate=t.prefix_hit_rate,
            in_flight=self.in_flight,
            outstanding_tokens=self.outstanding_tokens,
            capacity=self.capacity,
        )

    # breaker bookkeeping, called on every request outcome
    def request_failed(self, now: float, failures: int, open_s: float) -> bool:
        """Count a failure; True when it (re)opens the circuit."""
        self.breaker_fails += 1
        if self.breaker_fails >= failures:
            self.open_until = now + open_s
            self.breaker_fails = failures - 1  # half-open after the wait: one failure re-opens
            return True
        return False

    def request_succeeded(self) -> None:
        self.breaker_fails = 0

    def health_result(self, ok: bool, unhealthy_after: int, healthy_after: int) -> None:
        if ok:
            self.proven = True
            self.health_fails = 0
            self.health_oks += 1
            if not self.healthy and self.health_oks >= healthy_after:
                self.healthy = True
                self.breaker_fails = 0
                self.open_until = 0.0
        else:
            self.health_oks = 0
            self.health_fails += 1
            if self.health_fails >= unhealthy_after:
                self.healthy = False


class Fleet:
    """The pools and their workers, built once from the configuration."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.pools: dict[str, list[WorkerState]] = {}
        self.specs: list[PoolSpec] = []
        self.workers: dict[str, WorkerState] = {}
        for pname, pool in config.pools.items():
            states = []
            for w in pool.workers:
                headers = b""
                if w.api_key:
                    headers = b"authorization: Bearer %s\r\n" % w.api_key.encode("latin-1")
                state = WorkerState(
                    id=w.id,
                    pool=pname,
                    url=w.url,
                    engine=w.engine,
                    max_model_len=w.max_model_len or pool.max_model_len,
                    endpoint=Endpoint.from_url(w.url),
                    extra_headers=headers,
                    pool_header=pname.encode(),
                    id_header=w.id.encode(),
                    capacity=w.max_num_seqs or pool.max_num_seqs,
                )
                states.append(state)
                self.workers[state.id] = state
            self.pools[pname] = states
            self.specs.append(PoolSpec(pname, pool.max_model_len, frozenset(pool.models)))
        self._live: frozenset[str] = frozenset(self.pools)
        self._live_at = float("-inf")
        self.models: dict[str, int] = {}  # model -> the largest context serving it
        for pool in config.pools.values():
            for m in pool.models:
                self.models[m] = max(self.models.get(m, 0), pool.max_model_len)

    def views(
        self, pool: str, now: float, exclude: frozenset[str] = frozenset()
    ) -> list[WorkerView]:
        stale_after = self.config.telemetry.stale_after_s
        return [w.view(now, stale_after) for w in self.pools.get(pool, ()) if w.id not in exclude]

    def live_pools(self, now: float) -> frozenset[str]:
        """Pools with at least one routable worker (placement treats the others as down).

        Recomputed at most every 50 ms: health changes on a scale of seconds, and a scan of
        every worker on every request would cost more than the rest of placement."""
        if now - self._live_at > 0.05:
            self._live = frozenset(
                p for p, ws in self.pools.items() if any(w.routable(now) for w in ws)
            )
            self._live_at = now
        return self._live

    def any_routable(self, now: float) -> bool:
        return any(w.routable(now) for w in self.workers.values())

    def any_ready(self, now: float) -> bool:
        """Readiness: a routable worker that has answered a health check or a scrape since
        start (a fleet nobody has heard from is not ready, whatever the benefit of the doubt
        routing gives it)."""
        return any(w.proven and w.routable(now) for w in self.workers.values())
