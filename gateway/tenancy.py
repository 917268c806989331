"""Token-pool entitlements at the gateway: keys, the store, the control loop, run-time
changes, and what the metrics read (the policy itself is policies/tenancy/).

    start   `store: memory` — nothing to start: the admitter's in-memory ledger answers
            synchronously (the core's `admit`), and steps its control on its own clock.
            `store: redis` — a `RedisStore` (gateway/store_redis.py) attached to the
            admitter (the core then awaits `admit_async`: one round trip), run-time changes
            read back from Redis, the definitions published, the replica's heartbeat
            started, and a background task every `control_interval_s`: read changes made on
            other replicas, reap expired holds, view each pool, apply one control step
            (Eq. 1–3; with N replicas the store keeps one step per interval).
            With `follow_workers` (memory only): a task every 0.1 s resizing each such
            token pool to its fleet pool's workers in service, discovered ones included
            (`follow_fleet`).
    stop    the loops cancelled, queued completions flushed (bounded), the store closed.

Run-time changes (`/admin/entitlements`) go to the admitter's definitions and ledger, and
with Redis to the pool's state (atomic, so every replica admits on it at once) and to a
registry hash `<prefix>:entitlements` whose version counter every replica polls each
control interval: it learns the definition (class, SLO, keys) for claims, fallback and the
control step. A replica that starts later reads the registry before publishing, so an
entitlement changed at run time keeps its change over a configuration's definition.
API keys created at run time are stored only as HMACs (gateway/apikeys.py).

Failure posture: Redis unreachable at start is logged and the gateway serves anyway (the
store's per-class fail-open/closed applies, at this replica's share of every limit:
`expected_replicas`); Redis found without the pools (restarted empty) gets the
definitions and this replica's requests in flight again before it admits more
(`RedisStore.recover`); an admin change that cannot reach Redis is a 503 and changes
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.apikeys import KeyDirectory, stored_form
from gateway.config import GatewayConfig
from gateway.store_redis import FAIL_OPEN_DEFAULT, CircuitBreaker, RedisStore, StoreUnavailable
from policies.admission import Admitter
from policies.tenancy.admitter import TokenCharge, TokenPoolsAdmitter
from policies.tenancy.bucket import MICRO, MILLI
from policies.tenancy.classes import ServiceClass
from policies.tenancy.control import PoolView, step
from policies.tenancy.entitlement import Entitlement, EntitlementState

log = logging.getLogger("fleetgate.tenancy")

# a token pool following a fleet pool (`follow_workers`) sees a worker drained or added
# this soon (reading the fleet's counts costs next to nothing)
FOLLOW_PERIOD_S = 0.1
DRAIN_ON_STOP_S = 2.0  # completions still queued for Redis at shutdown: this long at most


def entitlement_dict(ent: Entitlement) -> dict[str, Any]:
    """An entitlement in the configuration's (and the admin API's) terms."""
    return {
        "name": ent.name,
        "pool": ent.pool,
        "class": ent.service_class.value,
        "tokens_per_s": ent.tokens_per_s,
        "kv_bytes": ent.kv_bytes,
        "concurrency": ent.concurrency,
        "slo_target_ms": None if ent.slo_target_s is None else ent.slo_target_s * 1000.0,
        "tenant": ent.tenant,
        "state": ent.state.value,
        "window_s": ent.window_s,
    }


def entitlement_from(d: Mapping[str, Any]) -> Entitlement:
    """The inverse of `entitlement_dict` (ValueError on a bad definition)."""
    slo = d.get("slo_target_ms")
    return Entitlement(
        str(d["name"]),
        str(d["pool"]),
        ServiceClass(d.get("class", "elastic")),
        float(d.get("tokens_per_s", 0.0)),
        int(d.get("kv_bytes", 0)),
        int(d.get("concurrency", 0)),
        None if slo is None else float(slo) / 1000.0,
        str(d.get("tenant", "")),
        EntitlementState(d.get("state", "bound")),
        float(d.get("window_s", 60.0)),
    )


@dataclass(frozen=True, slots=True)
class Demand:
    """One pool's capacity as the autoscaler sees it: what bound entitlements are promised
    (Σ baselines) and that plus the observed demand above baselines (bursts and refused
    work), per resource."""

    pool: str
    capacity: Mapping[str, float]
    promised: Mapping[str, float]
    demand: Mapping[str, float]


@dataclass(slots=True)
class _Rate:
    now_us: int
    charged: dict[str, int]
    refused: dict[str, int]


class EntitlementError(Exception):
    """An admin change that cannot be made: `status` 400, 404, 409 or 503."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


@dataclass(eq=False)
class Tenancy:
    config: GatewayConfig
    admitter: TokenPoolsAdmitter | None
    replica: str
    keys: KeyDirectory = field(init=False)
    store: RedisStore | None = None
    sources: dict[str, str] = field(default_factory=dict)  # entitlement → config | admin
    views: dict[str, PoolView] = field(default_factory=dict)  # the last view of each pool
    demands: dict[str, Demand] = field(default_factory=dict)
    _rates: dict[str, _Rate] = field(default_factory=dict)
    # cancels this replica's requests by hold id (the pipeline's `evict`): the store's
    # notices of holds another replica's grant named for eviction go there
    on_evict: Callable[[tuple[str, ...]], object] | None = None
    _version: int = -1  # the registry's version last read
    # the fleet's workers in service per pool (gateway/workers.py `Fleet.active_counts`),
    # for token pools whose capacity follows them (`follow_workers`), and the workers the
    # running configuration lists (`Fleet.listed_counts`: a reload may change them)
    fleet_counts: Callable[[], Mapping[str, int]] | None = None
    fleet_listed: Callable[[], Mapping[str, int]] | None = None
    _followed: dict[str, float] = field(default_factory=dict)  # token pool → fraction applied
    _follower: asyncio.Task[None] | None = None
    _task: asyncio.Task[None] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.keys = KeyDirectory.build(self.config.auth.key_secret, self.config.entitlement_keys())
        if self.admitter is not None:
            self.sources = {n: "config" for n in self.admitter.definitions}

    @classmethod
    def of(cls, config: GatewayConfig, admitter: Admitter, replica: str) -> Tenancy:
        pools = admitter if isinstance(admitter, TokenPoolsAdmitter) else None
        return cls(config, pools, replica)

    @property
    def active(self) -> bool:
        return self.admitter is not None

    @property
    def registry_key(self) -> str:
        return f"{self.config.admission.store_settings().key_prefix}:entitlements"

    # --- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        adm = self.admitter
        if adm is None:
            return
        s = self.config.admission.store_settings()
        if s.store == "redis":
            fail_open = dict(FAIL_OPEN_DEFAULT)
            fail_open.update({ServiceClass(k): v for k, v in s.fail_open.items()})
            store = RedisStore.from_url(
                s.redis_url,
                s.timeout_s,
                config=adm.config.store_config(),
                prefix=s.key_prefix,
                fail_open=fail_open,
                breaker=CircuitBreaker(
                    s.breaker_failures, s.breaker_cooldown_s, probe_s=s.breaker_probe_s
                ),
                expected_replicas=s.expected_replicas,
            )
            self.store = store
            store.republish = self.republish
            store.on_evict = self._evicted
            adm.attach(store, store, self.replica)
            try:
                await self._read_registry()
                await adm.publish()
            except StoreUnavailable as exc:
                log.error("entitlement store unreachable at start (%s): serving on the "
                          "per-class fail-open/closed posture until it answers", exc)  # fmt: skip
                self._remember_definitions()
            store.start(self.replica)
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._control_loop())
        if s.follow_workers:
            self._follower = loop.create_task(self._follow_loop())
        log.info(
            "token pools: %d pools, %d entitlements, store %s (replica %s)",
            len(adm.config.capacities),
            len(adm.definitions),
            s.store,
            self.replica,
        )

    def _evicted(self, holds: tuple[str, ...]) -> None:
        if self.on_evict is not None:
            self.on_evict(holds)

    def typical_s(self, pool: str) -> float:
        """The pool's typical request length (the Retry-After of a wait for a slot)."""
        adm = self.admitter
        if adm is None or pool not in adm.config.capacities:
            return 1.0
        if self.store is None and pool in adm.ledger.pools:
            return adm.ledger.pools[pool].typical_s
        view = self.views.get(pool)
        return view.typical_s if view is not None else adm.config.capacities[pool].typical_request_s

    def _remember_definitions(self) -> None:
        """What publish would have written, kept by the store for its local fallback."""
        assert self.admitter is not None and self.store is not None
        for name, cap in self.admitter.config.capacities.items():
            self.store.capacities[name] = cap
        for ent in self.admitter.definitions.values():
            self.store.definitions[(ent.pool, ent.name)] = (ent, 0.0)

    async def stop(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.store is not None:
            with contextlib.suppress(TimeoutError, StoreUnavailable):
                await asyncio.wait_for(self.store.drained(), DRAIN_ON_STOP_S)
            await self.store.close()
            self.store = None

    async def _control_loop(self) -> None:
        assert self.admitter is not None
        interval = self.admitter.config.control_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                await self.tick()
            except StoreUnavailable:
                pass  # the breaker logged it; the next interval tries again
            except Exception:
                log.exception("token pools: control step failed")

    async def tick(self) -> None:
        """One control interval: changes from other replicas, expiry, views, the step."""
        adm = self.admitter
        if adm is None:
            return
        store = self.store
        if store is None:
            now = asyncio.get_running_loop().time()
            for pool in adm.config.capacities:
                self._observe(adm.ledger.view(pool, now))
            return
        await self._read_registry()
        for pool in adm.config.capacities:
            if not await self._call(store.client.exists(store.keys(pool)[0])):
                # Redis lost its state (restarted, flushed): the definitions again, and
                # this replica's requests in flight registered again
                await store.recover()
                break
        await store.expire()
        config = adm.config.priority_config()
        for pool in adm.config.capacities:
            view = await store.view(pool)
            await store.apply_step(view, step(view, config))
            self._observe(view)

    async def _follow_loop(self) -> None:
        while True:
            self.follow_fleet(asyncio.get_running_loop().time())
            await asyncio.sleep(FOLLOW_PERIOD_S)

    def follow_fleet(self, now: float) -> None:
        """Token pools that follow a fleet pool (`follow_workers`) take the configured
        capacity × its workers in service / its listed workers (§3.1: Λ_p, χ_p and r_p
        are replica count × one replica's). In service counts every worker taking requests
        — listed, discovered (Kubernetes) or added through the admin API; a pool that
        lists none (its workers all discovered or added) has its configured capacity as
        one worker's. Holds are kept (`scale_pool`)."""
        adm, counts = self.admitter, self.fleet_counts
        follow = self.config.admission.store_settings().follow_workers
        if adm is None or counts is None or not follow:
            return
        active = counts()
        listed = (
            self.fleet_listed()
            if self.fleet_listed is not None
            else {p: len(c.workers) for p, c in self.config.pools.items()}
        )
        for token_pool, fleet_pool in follow.items():
            configured = listed.get(fleet_pool, 0) or 1
            fraction = active.get(fleet_pool, 0) / configured
            if self._followed.get(token_pool, 1.0) != fraction:
                adm.scale_pool(token_pool, fraction, now)
                self._followed[token_pool] = fraction
                log.info("token pool %s: capacity × %.3g (%d of %d workers of pool %s)",
                         token_pool, fraction, active.get(fleet_pool, 0), configured,
                         fleet_pool)  # fmt: skip

    async def _call(self, awaitable: Any) -> Any:
        """A plain Redis call (registry, existence checks) with the store's timeout."""
        assert self.store is not None
        try:
            return await asyncio.wait_for(awaitable, self.store.timeout_s * 4)
        except Exception as exc:  # Redis away, a timeout
            raise StoreUnavailable(str(exc)) from exc

    async def republish(self) -> None:
        """Write every definition back (Redis restarted without its data): the pools, the
        entitlements, and the registry of run-time changes this replica knows. The store
        calls it (`RedisStore.recover`), then registers this replica's holds again."""
        adm, store = self.admitter, self.store
        if adm is None or store is None:
            return
        await adm.publish()
        admin = [n for n, src in self.sources.items() if src == "admin"]
        if admin:
            pipe = store.client.pipeline(transaction=True)
            for name in admin:
                hashes = [h for h, n in self.keys.managed.items() if n == name]
                ent = entitlement_dict(adm.definitions[name]) | {"keys": hashes}
                pipe.hsetnx(self.registry_key, name, orjson.dumps(ent))
            pipe.incr(self.registry_key + ":version")
            await self._call(pipe.execute())

    # --- what the metrics read -------------------------------------------------------------
    def snapshot(self) -> list[PoolView]:
        """Every pool's latest view: the ledger's now (memory), else the control loop's."""
        adm = self.admitter
        if adm is None:
            return []
        if self.store is None:
            now = asyncio.get_running_loop().time()
            for pool in adm.config.capacities:
                self._observe(adm.ledger.view(pool, now))
        return [self.views[p] for p in adm.config.capacities if p in self.views]

    def _observe(self, view: PoolView) -> None:
        """Keep the view, and the pool's capacity demand from its rates since the last."""
        assert self.admitter is not None
        self.views[view.pool] = view
        last = self._rates.get(view.pool)
        rate = _Rate(
            view.now_us,
            {u.definition.name: u.charged for u in view.entitlements},
            {u.definition.name: u.refused for u in view.entitlements},
        )
        if last is not None and view.now_us - last.now_us < 100_000 and view.pool in self.demands:
            return  # too close to the last one to measure a rate (a scrape right after)
        self._rates[view.pool] = rate
        dt = (view.now_us - last.now_us) / MICRO if last is not None else 0.0
        led = self.admitter.ledger.pools.get(view.pool) if self.store is None else None
        cap = led.capacity if led is not None else self.admitter.config.capacities[view.pool]
        promised = {"tokens_per_s": 0.0, "kv_bytes": 0.0, "slots": 0.0}
        extra = dict.fromkeys(promised, 0.0)
        for u in view.entitlements:
            e = u.definition
            if e.state is not EntitlementState.BOUND:
                continue
            promised["tokens_per_s"] += e.tokens_per_s
            promised["kv_bytes"] += e.kv_bytes
            promised["slots"] += e.concurrency
            if dt > 0 and last is not None:
                name = e.name
                used = (u.charged - last.charged.get(name, u.charged)) / MILLI / dt
                unmet = (u.refused - last.refused.get(name, u.refused)) / MILLI / dt
                extra["tokens_per_s"] += max(0.0, used + unmet - e.tokens_per_s)
            extra["kv_bytes"] += max(0, u.kv - e.kv_bytes)
            extra["slots"] += max(0, u.in_flight - e.concurrency)
        self.demands[view.pool] = Demand(
            view.pool,
            {"tokens_per_s": cap.tokens_per_s, "kv_bytes": cap.kv_bytes, "slots": cap.slots},
            promised,
            {k: promised[k] + extra[k] for k in promised},
        )

    def labels(self, entitlement: str) -> tuple[str, str, str] | None:
        """(entitlement, class, pool) for metrics, of the entitlement a request naming
        `entitlement` is claimed against (`default_entitlement` for an unknown name); None
        when there is none."""
        ent = self.admitter.entitlement_of(entitlement) if self.admitter else None
        if ent is None:
            return None
        return (ent.name, ent.service_class.value, ent.pool)

    # --- the admin API ---------------------------------------------------------------------
    def entitlements(self) -> list[dict[str, Any]]:
        adm = self._require()
        return [self.describe(n) for n in sorted(adm.definitions)]

    def describe(self, name: str) -> dict[str, Any]:
        adm = self._require()
        ent = adm.definitions.get(name)
        if ent is None:
            raise EntitlementError(404, f"no entitlement {name!r}", "name")
        out = entitlement_dict(ent)
        out["keys"] = self.keys.count(name)
        out["source"] = self.sources.get(name, "config")
        if self.store is None:
            self.snapshot()  # the in-memory ledger: as of now
        view = self.views.get(ent.pool)
        usage = (
            next((u for u in view.entitlements if u.definition.name == name), None)
            if view
            else None
        )
        out["usage"] = None if usage is None else {
            "in_flight": usage.in_flight,
            "kv_bytes": usage.kv,
            "debt": usage.debt,
            "burst": usage.burst,
            "priority": usage.priority,
            "admitted": usage.admitted,
            "refused": dict(usage.refusals or {}),
        }  # fmt: skip
        return out

    async def create(self, spec: Mapping[str, Any], keys: list[str]) -> dict[str, Any]:
        adm = self._require()
        name = str(spec["name"])
        if name in adm.definitions:
            raise EntitlementError(409, f"entitlement {name!r} exists; PATCH it", "name")
        await self._put(self._build(spec), keys)
        return self.describe(name)

    async def update(
        self, name: str, changes: Mapping[str, Any], keys: list[str] | None
    ) -> dict[str, Any]:
        adm = self._require()
        ent = adm.definitions.get(name)
        if ent is None:
            raise EntitlementError(404, f"no entitlement {name!r}", "name")
        if "pool" in changes and changes["pool"] != ent.pool:
            raise EntitlementError(400, "an entitlement cannot change pool: expire it and "
                                   "create another", "pool")  # fmt: skip
        await self._put(self._build(entitlement_dict(ent) | dict(changes)), keys)
        return self.describe(name)

    async def expire(self, name: str) -> dict[str, Any]:
        return await self.update(name, {"state": EntitlementState.EXPIRED.value}, None)

    def _require(self) -> TokenPoolsAdmitter:
        if self.admitter is None:
            raise EntitlementError(
                400, "entitlements need admission.policy: token_pools", "admission.policy"
            )
        return self.admitter

    def _build(self, spec: Mapping[str, Any]) -> Entitlement:
        adm = self._require()
        try:
            ent = entitlement_from(spec)
        except (ValueError, KeyError) as exc:
            raise EntitlementError(400, str(exc)) from None
        if ent.pool not in adm.config.capacities:
            raise EntitlementError(
                400,
                f"no pool {ent.pool!r}; the pools are {', '.join(sorted(adm.config.capacities))}",
                "pool",
            )
        return ent

    async def _put(self, ent: Entitlement, keys: list[str] | None) -> None:
        """Apply a definition here, and with Redis on every replica (the pool's state,
        then the registry the others poll)."""
        adm = self._require()
        secret = self.config.auth.key_secret
        if keys and not secret:
            raise EntitlementError(400, "keys need auth.key_secret", "keys")
        hashes = None if keys is None else [stored_form(secret or "", k) for k in keys]
        async with self._lock:
            previous = adm.definitions.get(ent.name)
            store = self.store
            if store is not None:
                if hashes is None:
                    hashes = [h for h, n in self.keys.managed.items() if n == ent.name]
                try:
                    priority = self._define(ent)
                    await store.put_entitlement(ent, priority)
                    record = orjson.dumps(entitlement_dict(ent) | {"keys": hashes})
                    pipe = store.client.pipeline(transaction=True)
                    pipe.hset(self.registry_key, ent.name, record)
                    pipe.incr(self.registry_key + ":version")
                    await asyncio.wait_for(pipe.execute(), store.timeout_s * 4)
                except Exception as exc:  # Redis away, a timeout, a script error
                    if previous is not None:
                        self._define(previous)
                    else:
                        adm.definitions.pop(ent.name, None)
                    raise EntitlementError(
                        503, f"the entitlement store is unreachable ({exc}); nothing changed"
                    ) from None
            else:
                self._define(ent)
            if hashes is not None:
                self.keys.set_managed(ent.name, hashes)
            self.sources[ent.name] = "admin"
        log.info("entitlement %s: %s", ent.name, entitlement_dict(ent))

    def _define(self, ent: Entitlement) -> float:
        adm = self._require()
        priority = adm.define(ent, asyncio.get_running_loop().time())
        if self.store is not None:
            self.store.definitions[(ent.pool, ent.name)] = (ent, priority)
            self.store.capacities.setdefault(ent.pool, adm.config.capacities[ent.pool])
            self.store._scaled_for = 0  # the fallback's local limits are rebuilt
        return priority

    async def _read_registry(self) -> None:
        """Definitions changed at run time (by any replica), if the version moved."""
        store = self.store
        if store is None:
            return
        version = int(await self._call(store.client.get(self.registry_key + ":version")) or 0)
        if version == self._version:
            return
        records = await self._call(store.client.hgetall(self.registry_key))
        for _, value in sorted(records.items()):
            d = orjson.loads(value)
            try:
                ent = entitlement_from(d)
            except (ValueError, KeyError):
                log.warning("entitlement registry: skipping a bad record %r", d)
                continue
            if self.admitter is None or ent.pool not in self.admitter.config.capacities:
                continue
            self._define(ent)
            self.keys.set_managed(ent.name, d.get("keys") or ())
            self.sources[ent.name] = "admin"
        self._version = version


def header_value(value: str) -> bytes | None:
    """A name as a header value, or None when it cannot be one."""
    if value and value.isascii() and value.isprintable() and len(value) <= 256:
        return value.encode()
    return None


def charge_of(reservation: object) -> TokenCharge | None:
    return reservation if isinstance(reservation, TokenCharge) else None
