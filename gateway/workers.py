"""The gateway's soft state about each worker: telemetry, health, breaker, in-flight work.

All of it is per process and rebuilt within seconds after a restart (a scrape and a health
check), so nothing here is shared between replicas. Routing sees it through `view()`, a
`WorkerView` snapshot merging the engine's last telemetry with our exact in-flight counts.

Circuit breaker and health hysteresis are pure policies (policies/health.py) over the
state kept here: `breaker.failures` consecutive request failures open the circuit for
`breaker.open_s` (the core counts them, policies/core.py); a worker failing
`unhealthy_after` health checks in a row is unhealthy until `healthy_after` good checks.
Either one keeps a worker out of routing.

Live changes (`Fleet.add_worker`, `drain_worker`, `remove_worker`, `apply`, and
`set_discovered` for the workers a pool's `discovery` finds: gateway/discovery.py): every change is
made in one synchronous call, so the event loop never sees half of one. A draining worker
is out of routing at once (`views` leaves it out, it counts for no pool or readiness);
its requests in flight finish, and when the last one ends (`released`) it leaves the
fleet. Listeners (the scrape and health loops, the metrics) hear of every worker that
joins or leaves, so its loops start and stop with it and its label sets go.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gateway.config import GatewayConfig, Pool, Worker, header_safe
from gateway.upstream import Endpoint
from policies.health import Hysteresis, routable
from policies.types import PoolSpec, WorkerView

log = logging.getLogger("fleetgate.fleet")


@dataclass(slots=True)
class Telemetry:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_hit_rate: float = 0.0
    scraped_at: float | None = None  # monotonic time of the last good scrape
    kv_tokens: int | None = None  # the engine's KV cache in tokens, once it has said
    block_size: int | None = None  # its KV block size in tokens (vllm:cache_config_info)
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
    kv_overcommit: float | None = None  # dispatch.kv_overcommit (None: KV size not used)
    # prompt tokens sent with no first token yet (policies.leases.PrefillWork, counted
    # only when QUARTZ or a prefill room is configured), and `dispatch.prefill_room`
    prefill_tokens: int = 0
    prefill_capacity: int | None = None
    telemetry: Telemetry = field(default_factory=Telemetry)
    healthy: bool = True
    # answered a health check or a scrape since start: until then `healthy` is only the
    # benefit of the doubt, and readiness does not count the worker
    proven: bool = False
    health_fails: int = 0
    health_oks: int = 0
    breaker_fails: int = 0
    open_until: float = 0.0
    # out of routing: leaves the fleet when its last request in flight ends
    draining: bool = False
    api_key: str | None = None
    own_max_model_len: int | None = None  # the worker's own, else the pool's applies
    # the one endpoint of a dp_group pool: each request names its rank (the engine's
    # per-request rank selector, docs/WIRE_SPEC.md §10)
    rank_selector: bool = False
    role: str | None = None  # a `kind: pd` pool's worker: "prefill" or "decode"
    bootstrap_port: int | None = None  # an SGLang prefill's bootstrap port (None: its URL's)

    def breaker_open(self, now: float) -> bool:
        return now < self.open_until

    def routable(self, now: float) -> bool:
        return routable(self, now)

    def view(self, now: float, stale_after: float) -> WorkerView:
        t = self.telemetry
        return WorkerView(
            id=self.id,
            pool=self.pool,
            max_model_len=self.max_model_len,
            healthy=routable(self, now),  # (the method, without its frame)
            stale=t.scraped_at is None or now - t.scraped_at > stale_after,
            running=t.running,
            waiting=t.waiting,
            kv_usage=t.kv_usage,
            prefix_hit_rate=t.prefix_hit_rate,
            in_flight=self.in_flight,
            outstanding_tokens=self.outstanding_tokens,
            capacity=self.capacity,
            token_capacity=(
                None
                if self.kv_overcommit is None or t.kv_tokens is None
                else int(t.kv_tokens * self.kv_overcommit)
            ),
            prefill_tokens=self.prefill_tokens,
            prefill_capacity=self.prefill_capacity,
            block_size=t.block_size,
            role=self.role,
        )

    # the breaker (policies/health.py) is the core's, on every attempt's outcome
    def health_result(self, ok: bool, unhealthy_after: int, healthy_after: int) -> None:
        Hysteresis(unhealthy_after, healthy_after).checked(self, ok)


class FleetError(ValueError):
    """A fleet change that cannot be made; `param` names the offending field or key path."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status  # 400 bad input, 404 no such worker, 409 a clash


class FleetListener(Protocol):
    def worker_added(self, worker: WorkerState) -> None: ...

    def worker_removed(self, worker: WorkerState) -> None: ...


@dataclass(frozen=True, slots=True)
class FleetDiff:
    """What `Fleet.apply` changed (worker ids)."""

    added: tuple[str, ...] = ()
    draining: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    pools_added: tuple[str, ...] = ()
    pools_removed: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.added or self.draining or self.pools_added or self.pools_removed)


def _same_worker(state: WorkerState, pool: str, w: Worker) -> bool:
    """A configured worker is the running one when pool, URL, engine and key agree (its
    context may change in place)."""
    return (
        state.pool == pool
        and state.url == w.url
        and state.engine == w.engine
        and state.api_key == w.api_key
    )


class Fleet:
    """The pools and their workers: built from the configuration, changed live by the
    admin API and by a configuration reload (always synchronously: see the module doc)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.pools: dict[str, list[WorkerState]] = {}
        self.pool_configs: dict[str, Pool] = dict(config.pools)
        self.specs: list[PoolSpec] = []
        self.workers: dict[str, WorkerState] = {}
        self.models: dict[str, int] = {}  # model -> the largest context serving it
        self.listeners: list[FleetListener] = []
        # pool -> the workers its `discovery` found (gateway/discovery.py); `apply` adds
        # them to the pool's listed workers, so a reload keeps them and they change
        # through the same diff as a reload
        self.discovered: dict[str, tuple[Worker, ...]] = {}
        self._live: frozenset[str] = frozenset()
        self._live_at = float("-inf")
        for pname, pool in config.pools.items():
            self.pools[pname] = []
            for w in pool.workers:
                self._insert(self._state(pname, pool, w))
        self._reindex()

    # --- reading ---------------------------------------------------------------------------
    def views(
        self, pool: str, now: float, exclude: frozenset[str] = frozenset()
    ) -> list[WorkerView]:
        stale_after = self.config.telemetry.stale_after_s
        return [
            w.view(now, stale_after)
            for w in self.pools.get(pool, ())
            if not w.draining and w.id not in exclude
        ]

    def live_pools(self, now: float) -> frozenset[str]:
        """Pools with at least one routable worker (placement treats the others as down).

        Recomputed at most every 50 ms: health changes on a scale of seconds, and a scan of
        every worker on every request would cost more than the rest of placement."""
        if now - self._live_at > 0.05:
            self._live = frozenset(
                p
                for p, ws in self.pools.items()
                if p in self.pool_configs and any(_serving(w, now) for w in ws)
            )
            self._live_at = now
        return self._live

    def any_routable(self, now: float) -> bool:
        return any(_serving(w, now) for w in self.workers.values())

    def any_ready(self, now: float) -> bool:
        """Readiness: a routable worker that has answered a health check or a scrape since
        start (a fleet nobody has heard from is not ready, whatever the benefit of the doubt
        routing gives it)."""
        return any(w.proven and _serving(w, now) for w in self.workers.values())

    def active_counts(self) -> dict[str, int]:
        """Workers taking new requests, per configured pool (listed, discovered and added
        at run time alike)."""
        return {p: sum(not w.draining for w in self.pools.get(p, ())) for p in self.pool_configs}

    def listed_counts(self) -> dict[str, int]:
        """Workers the running configuration lists, per pool (not those discovered)."""
        return {p: len(c.workers) for p, c in self.pool_configs.items()}

    # --- changing --------------------------------------------------------------------------
    def add_worker(self, pool: str, worker: Worker) -> WorkerState:
        """Add a worker to a configured pool; it takes traffic at once (its loops start
        with it). Raises FleetError: 400 for an unknown pool or a bad name, 409 when a
        worker of that id is in the fleet (draining ones included)."""
        pconf = self.pool_configs.get(pool)
        if pconf is None:
            raise FleetError(
                f"pool: no pool named {pool!r} (the pools are {', '.join(map(repr, self.pool_configs))})",
                param="pool",
            )
        if not header_safe(worker.id):
            raise FleetError("name: printable ASCII, no spaces (a header value)", param="name")
        if worker.id in self.workers:
            raise FleetError(
                f"name: worker {worker.id!r} is already in the fleet"
                f" ({'draining' if self.workers[worker.id].draining else 'active'})",
                param="name",
                status=409,
            )
        state = self._state(pool, pconf, worker)
        self._insert(state)
        self._reindex()
        for listener in self.listeners:
            listener.worker_added(state)
        log.info("worker %s (%s) added to pool %s", state.id, state.url, pool)
        return state

    def drain_worker(self, worker_id: str) -> WorkerState:
        """Take a worker out of routing; it leaves the fleet when its last request in flight
        ends (at once when it has none). Draining twice is a no-op. Raises FleetError 404."""
        state = self.workers.get(worker_id)
        if state is None:
            raise FleetError(f"no worker {worker_id!r}", param="id", status=404)
        if not state.draining:
            state.draining = True
            self._live_at = float("-inf")
            log.info("worker %s draining (%d in flight)", state.id, state.in_flight)
        if state.in_flight <= 0:
            self._remove(state)
        return state

    def remove_worker(self, worker_id: str) -> WorkerState:
        """Drain, then remove once idle: in-flight requests are never cut."""
        return self.drain_worker(worker_id)

    def released(self, state: WorkerState) -> None:
        """A request on `state` ended: a draining worker with none left leaves the fleet."""
        if state.draining and state.in_flight <= 0 and self.workers.get(state.id) is state:
            self._remove(state)

    def apply(self, config: GatewayConfig) -> FleetDiff:
        """Make the fleet the one `config` describes, as a diff: new workers are added,
        workers no longer configured are drained (then removed), the others are kept with
        their in-flight counts, breakers and telemetry. Pools and models follow. Checked
        whole before anything changes: a FleetError (naming the key path) changes nothing."""
        keep: dict[str, tuple[str, Worker]] = {}
        for pname, where, w in self._configured(config):
            current = self.workers.get(w.id)
            if current is not None and not _same_worker(current, pname, w):
                raise FleetError(
                    f"{where}: worker {w.id!r} is running"
                    f" in pool {current.pool!r} at {current.url}; give the changed worker"
                    " another name, or remove it first",
                    param=where,
                    status=409,
                )
            if current is not None and current.role != w.role:
                raise FleetError(
                    f"{where}.role: worker {w.id!r} serves {current.role or 'no role'};"
                    " a pd worker's role is fixed while it runs: give it another name",
                    param=f"{where}.role",
                    status=409,
                )
            keep[w.id] = (pname, w)
        for pname, pconf in config.pools.items():
            # the core builds its `pd` pools (protocol, pair selector) at start
            old = self.pool_configs.get(pname)
            was = ("workers", None) if old is None else (old.kind, old.pd)
            if (pconf.kind, pconf.pd) != was and "pd" in (pconf.kind, was[0]):
                raise FleetError(
                    f"pools.{pname}: a pool of kind: pd is made at start (its kind and pd"
                    " settings cannot change, nor such a pool be added, while running):"
                    " restart the gateway",
                    param=f"pools.{pname}.pd",
                    status=409,
                )
        added: list[str] = []
        kept: list[str] = []
        pools_added = tuple(p for p in config.pools if p not in self.pool_configs)
        pools_removed = tuple(p for p in self.pool_configs if p not in config.pools)
        # from here on nothing raises: the change is made in one go
        self.config = config
        self.pool_configs = dict(config.pools)
        for pname in config.pools:
            self.pools.setdefault(pname, [])
        new_states = []
        for wid, (pname, w) in keep.items():
            current = self.workers.get(wid)
            pconf = config.pools[pname]
            if current is None:
                state = self._state(pname, pconf, w)
                self._insert(state)
                new_states.append(state)
                added.append(wid)
            else:
                current.own_max_model_len = w.max_model_len
                current.max_model_len = w.max_model_len or pconf.max_model_len
                if current.draining:  # configured again: back in routing
                    current.draining = False
                    log.info("worker %s is configured again: no longer draining", wid)
                kept.append(wid)
        leaving = [s for wid, s in self.workers.items() if wid not in keep]
        for state in leaving:
            state.draining = True
        for pname in pools_removed:
            if not self.pools.get(pname):
                self.pools.pop(pname, None)
        self._reindex()
        for state in new_states:
            for listener in self.listeners:
                listener.worker_added(state)
        for state in leaving:
            if state.in_flight <= 0:
                self._remove(state)
        diff = FleetDiff(
            tuple(added),
            tuple(s.id for s in leaving),
            tuple(kept),
            pools_added,
            pools_removed,
        )
        if diff.changed:
            log.info(
                "fleet changed: added %s, draining %s, pools added %s, pools removed %s",
                list(diff.added),
                list(diff.draining),
                list(pools_added),
                list(pools_removed),
            )
        return diff

    def set_discovered(self, pool: str, workers: tuple[Worker, ...]) -> FleetDiff:
        """The workers `pool`'s discovery finds now, applied as a diff of the running
        configuration (`apply`: the same as a reload). Raises FleetError and changes
        nothing when the change cannot be made."""
        before = self.discovered.get(pool)
        self.discovered[pool] = workers
        try:
            return self.apply(self.config)
        except FleetError:
            if before is None:
                self.discovered.pop(pool, None)
            else:
                self.discovered[pool] = before
            raise

    def _configured(self, config: GatewayConfig) -> list[tuple[str, str, Worker]]:
        """(pool, key path, worker) for every worker `config` lists, and those the
        discovery of a pool that still has one found (one that names a listed worker is
        left out: the listed one stands)."""
        out: list[tuple[str, str, Worker]] = []
        for pname, pool in config.pools.items():
            out += [(pname, f"pools.{pname}.workers.{i}", w) for i, w in enumerate(pool.workers)]
        listed = {w.id for _, _, w in out}
        for pname, pool in config.pools.items():
            if pool.discovery is None:
                continue
            for w in self.discovered.get(pname, ()):
                if w.id in listed:
                    log.warning("pool %s: discovered worker %s is listed already", pname, w.id)
                    continue
                out.append((pname, f"pools.{pname}.discovery", w))
        return out

    # --- internals -------------------------------------------------------------------------
    def _state(self, pname: str, pool: Pool, w: Worker) -> WorkerState:
        headers = b""
        if w.api_key:
            headers = b"authorization: Bearer %s\r\n" % w.api_key.encode("latin-1")
        return WorkerState(
            id=w.id,
            pool=pname,
            url=w.url,
            engine=w.engine,
            max_model_len=w.max_model_len or pool.max_model_len,
            endpoint=Endpoint.from_url(w.url),
            extra_headers=headers,
            pool_header=pname.encode(),
            id_header=w.id.encode(),
            api_key=w.api_key,
            own_max_model_len=w.max_model_len,
            capacity=w.max_num_seqs or pool.max_num_seqs,
            kv_overcommit=self.config.dispatch.kv_overcommit,
            prefill_capacity=self.config.dispatch.prefill_room,
            rank_selector=pool.kind == "dp_group" and len(pool.workers) == 1,
            role=w.role,
            bootstrap_port=w.bootstrap_port,
        )

    def _insert(self, state: WorkerState) -> None:
        # new lists, not appends: a caller iterating the old one is not disturbed
        self.pools[state.pool] = [*self.pools.get(state.pool, ()), state]
        self.workers[state.id] = state

    def _remove(self, state: WorkerState) -> None:
        if self.workers.get(state.id) is not state:
            return
        del self.workers[state.id]
        rest = [w for w in self.pools.get(state.pool, ()) if w is not state]
        if rest or state.pool in self.pool_configs:
            self.pools[state.pool] = rest
        else:
            self.pools.pop(state.pool, None)  # a removed pool's last worker left
        self._live_at = float("-inf")
        for listener in self.listeners:
            listener.worker_removed(state)
        log.info("worker %s left the fleet", state.id)

    def _reindex(self) -> None:
        self.specs = [
            PoolSpec(p, pool.max_model_len, frozenset(pool.models))
            for p, pool in self.pool_configs.items()
        ]
        models: dict[str, int] = {}
        for pool in self.pool_configs.values():
            for m in pool.models:
                models[m] = max(models.get(m, 0), pool.max_model_len)
        self.models = models
        self._live_at = float("-inf")


def _serving(w: WorkerState, now: float) -> bool:
    return not w.draining and w.routable(now)


def worker_dicts(states: Mapping[str, WorkerState], now: float) -> list[dict[str, object]]:
    """The admin API's view of the fleet (GET /admin/workers)."""
    return [
        {
            "pool": w.pool,
            "id": w.id,
            "url": w.url,
            "engine": w.engine,
            "state": "draining" if w.draining else "active",
            "healthy": w.routable(now),
            "in_flight": w.in_flight,
        }
        for w in states.values()
    ]
