"""The Redis entitlement store: token-pool counters shared by every gateway replica.

Implements policies/tenancy/store.py's `EntitlementStore` with redis-py's asyncio client
(hiredis parses replies). Every check-and-reserve and every settle-and-release is ONE Lua
script (gateway/store_redis_lua.py, the ledger's algorithm line for line), so admission
costs one round trip and completion one, atomic across replicas. Keys are hash-tagged per
pool (`fg:{pool}:…`), so each script touches one Redis Cluster slot.

Holds never leak: each carries a TTL (`hold_ttl_s`, longer than any request) and its
replica's id; replicas heartbeat every `heartbeat_ttl_s / 3`, and a replica silent for
`heartbeat_ttl_s` (crashed, partitioned) has its holds reaped by the next reserve in that
pool (a bounded sweep on the hot path) or by `expire`. A reserve cancelled in flight (the
client left) releases its grant when it arrives.

Redis unreachable — a per-class posture, never a hang, and a stated bound:
- every call has a timeout (`timeout_s`); a call that fails on a connection opened before
  (Redis restarted: every pooled connection is dead) drops the idle pooled connections
  and is sent once more on a fresh one before anything falls back — while Redis answers,
  no request is admitted outside it;
- a deadline does not count time this process did not run (`RedisDeadline`): a replica
  held up past a call's timeout takes the answer waiting in its socket;
- a circuit breaker opens after `failures` consecutive errors (calls in flight together
  count once); while it is open no request waits on Redis: a background probe (the
  heartbeat, every `probe_s`) finds Redis back and closes it — only once Redis holds every
  request this replica runs (`_probe`), so Redis never grants past what it counts (a store
  not started, with no heartbeat: open for `cooldown_s`, then one call probes); a call that
  fails while it is closed is refused (429 `store_unavailable`), never admitted outside
  Redis: Redis is not judged away;
- while it is open a request of a class that *fails open* is admitted
  against a local ledger whose pools and entitlements are the shared ones divided by n =
  the larger of the replica count the heartbeat last saw and `expected_replicas` (the
  configured count: all a replica has when it never saw Redis). That local ledger mirrors
  every request this replica has in flight (Redis's grants included), so a replica admits
  while ITS OWN in flight is under its share ⌊limit / n⌋. With N ≤ n replicas the fleet
  holds at most limit + (N − 1)·⌊limit / n⌋ during the outage, falling to N·⌊limit / n⌋
  ≤ limit as the requests Redis admitted before it end (tokens/s: each replica's local
  bucket is λ/n deep and refilling, so at most one window's depth more than the budget).
  A class that *fails closed* is refused with `store_unavailable` and a Retry-After of the
  breaker's remaining cooldown. Default: dedicated, guaranteed and elastic fail open
  (protected work keeps flowing), spot and preemptible fail closed;
- Redis back (or restarted empty): a reserve that finds the pool gone publishes the
  definitions again and re-registers this replica's requests in flight before it is
  answered; a replica Redis does not know as alive while it has requests in flight is
  answered `replica_unknown` and registers them (one heartbeat) before it asks again; the
  first reserve after an outage registers the fallback's grants first (`register_live`):
  Redis counts every request running again, not only those admitted after it came back;
  and for `rejoin_s` after Redis answers it again (the time the other replicas' probes
  take to find it: until then they admit on their shares, uncounted in Redis) a reserve
  must fit this replica's share too (`_within_share`), so the fleet holds L, not L plus
  the others' shares;
- hold ids are the replica's own (`<replica run id>#<counter>`, set by the admitter):
  never reused across Redis's lifetimes, so a completion from before a restart cannot
  release a hold granted after it; a reserve that timed out (Redis stalled: it may still
  run it later) is cancelled by its id, and Redis keeps released ids as "gone" for a hold
  TTL so that a late reserve or registration of one does nothing;
- a stalled Redis does not reap the holds of replicas that lived through it (time in which
  no replica reached Redis does not count against heartbeats: ledger.py `_touch`);
- completions (`finish_soon`) queue (at most `OUTBOX_MAX`, the oldest dropped: their holds
  expire by TTL), go to Redis in order up to `FINISH_BATCH` per round trip (a pipeline),
  and are retried in the background until Redis acknowledges them (or the hold would have
  expired by its TTL anyway).
- one log line per breaker transition; `transitions`, `state`, `degraded_admissions` and
  `share` (n) for metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError

from gateway import store_redis_lua as lua
from policies.tenancy.bucket import to_us
from policies.tenancy.capacity import PoolCapacity
from policies.tenancy.classes import ServiceClass
from policies.tenancy.control import Dynamics, PoolView, Usage
from policies.tenancy.entitlement import Entitlement, EntitlementState
from policies.tenancy.ledger import SWEEP_MAX, Ledger, StoreConfig
from policies.tenancy.verdict import Check, Claim, Denied, Granted, Verdict

log = logging.getLogger("fleetgate.tenancy")
# set in the prober's task (`RedisStore._probe`): its calls go to Redis while the breaker
# is open, and their success does not close it (the probe does, once Redis counts all)
_PROBING: contextvars.ContextVar[bool] = contextvars.ContextVar("probing", default=False)

LOCAL = "local:"  # the prefix of a fallback grant's id when its claim named none
FINISH_BATCH = 64  # completions sent to Redis in one round trip (one pipeline), at most
OUTBOX_MAX = 50_000  # completions queued for Redis at most (the oldest dropped: TTL)
REGISTER_BATCH = 256  # holds re-registered per round trip
FAIL_OPEN_DEFAULT: Mapping[ServiceClass, bool] = {
    ServiceClass.DEDICATED: True,
    ServiceClass.GUARANTEED: True,
    ServiceClass.ELASTIC: True,
    ServiceClass.SPOT: False,
    ServiceClass.PREEMPTIBLE: False,
}


class RedisDeadline:
    """`asyncio.timeout(timeout_s)` around one Redis call, except that time in which this
    process did not run does not count as Redis's.

    A replica whose event loop was held up (a CPU-starved host, a long callback) runs its
    timers late: when it runs again, Redis's answer may be waiting in the socket, and a
    plain timeout would cancel the call anyway — the store would then treat a Redis that
    answered as away and admit on its local share (over the limit: the other replicas
    admit up to it in Redis meanwhile). So the deadline expires only when it is checked on
    time: a check that runs more than `late_s` after it was due gives the call another
    `timeout_s / 4` (the loop reads what arrived first), up to `cap` timeouts in all. A
    stalled Redis still times out after `timeout_s` on a loop that runs on time."""

    __slots__ = ("_cap", "_cm", "_handle", "_late", "_loop", "_timeout", "_until")

    def __init__(self, timeout_s: float, late_s: float = 0.02, cap: float = 4.0) -> None:
        self._timeout = timeout_s
        self._late = late_s
        self._cap = cap

    async def __aenter__(self) -> RedisDeadline:
        self._loop = asyncio.get_running_loop()
        self._cm = asyncio.timeout(None)
        await self._cm.__aenter__()
        now = self._loop.time()
        due = now + self._timeout
        self._until = now + self._timeout * self._cap
        self._handle = self._loop.call_at(due, self._check, due)
        return self

    def _check(self, due: float) -> None:
        now = self._loop.time()
        if now - due > self._late and now < self._until:  # this process was not running
            again = now + self._timeout / 4
            self._handle = self._loop.call_at(again, self._check, again)
        else:
            self._cm.reschedule(now)  # expired: the call is cancelled (TimeoutError)

    async def __aexit__(self, *exc: Any) -> None:
        self._handle.cancel()
        await self._cm.__aexit__(*exc)


class StoreUnavailable(Exception):
    """Redis did not answer (timeout, connection, script error) or the breaker is open.
    `sent`: the call may have reached Redis (it may still run it)."""

    def __init__(self, message: str, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(slots=True)
class _Live:
    """A request of this replica holding its slots: what re-registering it takes."""

    claim: Claim  # its hold id in `claim.hold`
    in_redis: bool  # Redis granted it, or a registration of it was acknowledged
    since: float  # when it was granted (local clock): past the hold TTL it is forgotten
    sending: bool = False  # a registration of it is on its way
    # a registration of it went out unanswered (a timeout): Redis may hold it, so its
    # completion goes to Redis too (a release of a hold Redis lacks marks its id gone)
    sent: bool = False


@dataclass(slots=True)
class CircuitBreaker:
    """closed → (`failures` consecutive errors) → open. Calls that were in flight together
    when one failed count as that one failure: a single hiccup (Redis or this host held up
    for a moment) fails every call in flight at once, and is not an outage; `failures`
    calls failing one after another are.

    Open → closed, two ways. A started store (one that heartbeats: `prober` set) probes in
    the background every `probe_s` (`RedisStore._probe`) and closes the breaker only once
    Redis answers AND counts every request this replica has in flight; calls never probe.
    Without a prober: open for `cooldown_s`, then half-open: the next call is the probe,
    its success closes, its failure opens again."""

    failures: int = 3
    cooldown_s: float = 2.0
    probe_s: float = 0.2  # with a prober: the background probe's period while open
    prober: bool = False  # a background prober runs (set by `RedisStore.start`)
    state: str = "closed"
    errors: int = 0
    open_until: float = 0.0
    transitions: int = 0
    last_failed: float = float("-inf")  # when the last counted failure was seen
    on_move: Callable[[str], None] | None = None  # told each new state (wakes the prober)

    def allow(self, now: float) -> bool:
        if self.state == "closed":
            return True
        if self.state == "open" and not self.prober and now >= self.open_until:
            self._move("half_open", "probing")
            return True
        return False

    def succeeded(self) -> None:
        self.errors = 0
        if self.state != "closed":
            self._move("closed", "Redis answers again")

    def failed(self, now: float, why: str, since: float | None = None) -> None:
        """A call started at `since` failed at `now`."""
        if since is not None and since < self.last_failed and self.state == "closed":
            return  # in flight when the last failure was counted: the same observation
        self.last_failed = now
        self.errors += 1
        if self.state == "half_open" or (self.state == "closed" and self.errors >= self.failures):
            self.open_until = now + self.cooldown_s
            self._move("open", why)

    def retry_in(self, now: float) -> float:
        if self.prober:
            return self.probe_s
        return max(0.001, self.open_until - now) if self.state == "open" else self.cooldown_s

    def _move(self, state: str, why: str) -> None:
        log.warning("entitlement store breaker %s → %s: %s", self.state, state, why)
        self.state = state
        self.transitions += 1
        if self.on_move is not None:
            self.on_move(state)


def _scaled_pool(cap: PoolCapacity, n: int) -> PoolCapacity:
    return replace(
        cap,
        tokens_per_s=cap.tokens_per_s / n,
        kv_bytes=max(1, cap.kv_bytes // n),
        slots=max(1, cap.slots // n),
    )


def _scaled_entitlement(ent: Entitlement, n: int) -> Entitlement:
    return replace(
        ent,
        tokens_per_s=ent.tokens_per_s / n,
        kv_bytes=max(1, ent.kv_bytes // n) if ent.kv_bytes else 0,
        concurrency=max(1, ent.concurrency // n) if ent.concurrency else 0,
    )


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


@dataclass(eq=False)
class RedisStore:
    client: aioredis.Redis
    config: StoreConfig = field(default_factory=StoreConfig)
    prefix: str = "fg"
    timeout_s: float = 0.25
    # the store's clock: None → the Redis server's (production); a function → tests
    clock: Callable[[], float] | None = None
    fail_open: Mapping[ServiceClass, bool] = field(default_factory=lambda: dict(FAIL_OPEN_DEFAULT))
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    live_replicas: int = 0  # the last count a heartbeat saw (0: never saw Redis)
    # the fallback's divisor when it never saw Redis, and its floor: the replicas expected
    expected_replicas: int = 1
    rejoin_window_s: float | None = None  # `rejoin_s`; None: from the probe and timeout
    local: Ledger = field(init=False)
    capacities: dict[str, PoolCapacity] = field(default_factory=dict)
    definitions: dict[tuple[str, str], tuple[Entitlement, float]] = field(default_factory=dict)
    # this replica's requests holding slots (granted by Redis or by the fallback), by hold
    live: dict[str, _Live] = field(default_factory=dict)
    degraded_admissions: int = 0  # requests admitted by the local fallback (a counter)
    _scaled_for: int = 0
    # called when Redis answers but has lost a pool or entitlement this replica published
    # (restarted without persistence): the owner publishes the definitions again; the
    # store then re-registers its holds and sends the request once more
    republish: Callable[[], Awaitable[None]] | None = None
    # called with this replica's hold ids that another replica's grant named for eviction
    # (notices ride on this replica's reserve, finish and heartbeat replies)
    on_evict: Callable[[tuple[str, ...]], object] | None = None
    _outbox: deque[tuple[float, str, str, int | None, float | None]] = field(default_factory=deque)
    _drainer: asyncio.Task[None] | None = None
    _beater: asyncio.Task[None] | None = None
    _replica: str = ""
    _recovering: asyncio.Lock = field(default_factory=asyncio.Lock)
    _recoveries: int = 0
    _pending_local: bool = False  # the fallback granted holds Redis has not been told of
    _registering: asyncio.Lock = field(default_factory=asyncio.Lock)
    _rejoins: int = 0
    # pools where Redis did not know this replica alive while it ran requests there: until
    # a registration of all of them succeeds, Redis may hold none (restarted, reaped)
    _unknown_to: set[str] = field(default_factory=set)
    # until then (local clock) a reserve must fit this replica's share too (`_within_share`)
    _share_until: float = float("-inf")
    _local_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.local = Ledger(self.config)
        c = self.client
        self._reserve = c.register_script(lua.RESERVE)
        self._finish = c.register_script(lua.FINISH)
        self._expire = c.register_script(lua.EXPIRE)
        self._heartbeat = c.register_script(lua.HEARTBEAT)
        self._register = c.register_script(lua.REGISTER)
        self._define_pool = c.register_script(lua.DEFINE_POOL)
        self._put = c.register_script(lua.PUT_ENTITLEMENT)
        self._view = c.register_script(lua.VIEW)
        self._apply = c.register_script(lua.APPLY_STEP)

    @classmethod
    def from_url(cls, url: str, timeout_s: float = 0.25, **kw: Any) -> RedisStore:
        # no socket_timeout: every call is bounded by `timeout_s` around it (`_call`), and
        # redis-py would spend a task per command on its own (asyncio.wait_for on each send).
        # No redis-py retries: their backoff would outlast `timeout_s`, and the one retry
        # worth making (a dead pooled connection) is `_call`'s, on a fresh connection
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=None,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            retry=Retry(NoBackoff(), 0),
        )
        return cls(client, timeout_s=timeout_s, **kw)

    # --- plumbing ------------------------------------------------------------------------
    def keys(self, pool: str) -> list[str]:
        base = f"{self.prefix}:{{{pool}}}:"
        return [
            base + k
            for k in (
                "state",
                "holds",
                "admitted",
                "evictable",
                "expiry",
                "owners",
                "replicas",
                "notices",
                "gone",
            )
        ]

    def _now_arg(self) -> str:
        return "" if self.clock is None else str(to_us(self.clock()))

    def _local_now(self) -> float:
        return self.clock() if self.clock is not None else time.monotonic()

    @property
    def _grace_us(self) -> int:
        return to_us(self.config.heartbeat_ttl_s / 2)

    @property
    def share(self) -> int:
        """n: what the local fallback divides the shared limits by."""
        return max(1, self.live_replicas, self.expected_replicas)

    async def _call(self, script: Any, pool: str, *args: Any) -> Any:
        now = self._local_now()
        probing = _PROBING.get()  # the prober's calls go out while the breaker is open
        if not probing and not self.breaker.allow(now):
            raise StoreUnavailable("the entitlement store's breaker is open")
        for attempt in (1, 2):
            try:
                # a timeout, not wait_for: no task per call on the hot path
                async with RedisDeadline(self.timeout_s):
                    result = await script(keys=self.keys(pool), args=[self._now_arg(), *args])
            except RedisConnectionError as exc:
                if attempt == 1:  # a pooled connection Redis has forgotten: a fresh one
                    await self._drop_idle_connections()
                    continue
                self.breaker.failed(self._local_now(), f"{type(exc).__name__}: {exc}", now)
                raise StoreUnavailable(str(exc), sent=True) from exc
            except (RedisError, OSError, TimeoutError) as exc:
                self.breaker.failed(self._local_now(), f"{type(exc).__name__}: {exc}", now)
                raise StoreUnavailable(str(exc) or type(exc).__name__, sent=True) from exc
            if not probing:  # the probe closes the breaker itself, once Redis counts all
                self._answered()
            return result
        raise AssertionError("unreachable")

    def _answered(self) -> None:
        """A call Redis answered (not the probe's): after failures, Redis is back for
        this replica, and the others may not have found it yet (`_within_share`)."""
        if self.breaker.errors:
            self._share_until = self._local_now() + self.rejoin_s
        self.breaker.succeeded()

    async def _drop_idle_connections(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.connection_pool.disconnect(inuse_connections=False)

    # --- definitions -----------------------------------------------------------------
    async def define_pool(self, name: str, capacity: PoolCapacity) -> None:
        self.capacities[name] = capacity
        self._scaled_for = 0
        await self._call(
            self._define_pool,
            name,
            capacity.slots,
            repr(float(capacity.tokens_per_s)),
            capacity.kv_bytes,
            capacity.bytes_per_token,
            repr(float(capacity.window_s)),
            repr(float(capacity.typical_request_s)),
        )

    async def put_entitlement(self, ent: Entitlement, priority: float) -> None:
        self.definitions[(ent.pool, ent.name)] = (ent, priority)
        self._scaled_for = 0
        await self._call(
            self._put,
            ent.pool,
            ent.name,
            ent.service_class.value,
            ent.state.value,
            repr(float(ent.tokens_per_s)),
            ent.kv_bytes,
            ent.concurrency,
            repr(float(ent.window_s)),
            repr(float(priority)),
        )

    # --- the local ledger: this replica's share, mirroring its requests in flight ------
    def _local_ledger(self, now: float) -> Ledger:
        """The local ledger at this replica's share (rebuilt when n or a definition
        changed; its holds and counters are kept)."""
        n = self.share
        if self._scaled_for != n:
            self._scaled_for = n
            for pool, cap in self.capacities.items():
                self.local.define_pool(pool, _scaled_pool(cap, n), now)
            for ent, prio in self.definitions.values():
                if ent.pool in self.capacities:
                    self.local.put_entitlement(_scaled_entitlement(ent, n), prio, now)
        return self.local

    def _held(self, claim: Claim, in_redis: bool) -> None:
        self.live[claim.hold] = _Live(claim, in_redis, self._local_now())
        if in_redis:  # the fallback must count it: mirrored, without the local checks
            self._local_ledger(self._local_now()).register(claim, self._local_now())

    # --- the hot path --------------------------------------------------------------------
    async def reserve(self, claim: Claim) -> Verdict:
        task = asyncio.ensure_future(self._reserve_or_fallback(claim))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: self._drop_grant(claim.pool, t))
            raise

    def _drop_grant(self, pool: str, task: asyncio.Task[Verdict]) -> None:
        if not task.cancelled() and task.exception() is None:
            verdict = task.result()
            if isinstance(verdict, Granted):
                self.finish_soon(pool, verdict.reservation, None, None)

    async def _register_pending(self) -> None:
        """Before the first reserve Redis answers after an outage: the requests this
        replica admitted on its own meanwhile, registered (Redis must count them before it
        grants more). Once, for any number of reserves waiting for it; it may be the
        breaker's half-open probe (the reserve then takes the fallback, once)."""
        if not self._pending_local:
            return
        async with self._registering:
            if not self._pending_local:
                return
            with contextlib.suppress(StoreUnavailable):  # a lost pool: the reserve recovers
                await self.register_live(only_local=True)
                self._pending_local = any(not e.in_redis for e in self.live.values())

    @property
    def rejoin_s(self) -> float:
        """How long a replica keeps to its share after Redis answered it again: the time
        the others' probes take to find Redis too (by default two probe periods and a
        timeout)."""
        if self.rejoin_window_s is not None:
            return self.rejoin_window_s
        return 2 * self.breaker.probe_s + self.timeout_s

    def _within_share(self, claim: Claim) -> Verdict | None:
        """Right after Redis came back (until `_share_until`) the other replicas may still
        admit on their local shares, not yet counted in Redis: a reserve must then fit
        this replica's share too — held in the local ledger before Redis is asked, so that
        reserves in flight together see each other. None: no share to keep (or no id)."""
        now = self._local_now()
        if now >= self._share_until or not claim.hold or claim.hold in self.live:
            return None
        verdict = self._local_ledger(now).reserve(claim, now)
        if isinstance(verdict, Denied) and verdict.check is Check.UNKNOWN:
            return None
        return verdict

    def _drop_share(self, claim: Claim) -> None:
        """The placeholder `_within_share` held, given back (Redis did not grant it)."""
        if claim.hold and claim.hold not in self.live:
            now = self._local_now()
            self.local.settle(claim.pool, claim.hold, 0, None, now)  # its tokens refunded
            self.local.release(claim.pool, claim.hold)

    async def _reserve_or_fallback(self, claim: Claim) -> Verdict:
        _PROBING.set(False)  # its own task: not the probe's, even if one made it
        await self._register_pending()
        share = self._within_share(claim)
        if isinstance(share, Denied):
            return share
        verdict = await self._ask_redis(claim, share is not None)
        if share is not None and not (
            isinstance(verdict, Granted) and verdict.reservation == claim.hold
        ):
            self._drop_share(claim)
        return verdict

    async def _ask_redis(self, claim: Claim, placeholder: bool) -> Verdict:
        for attempt in (1, 2):
            try:
                raw = await self._call(
                    self._reserve,
                    claim.pool,
                    claim.entitlement,
                    claim.request,
                    claim.tokens,
                    claim.replica,
                    to_us(self.config.hold_ttl_s),
                    repr(float(self.config.state_retry_s)),
                    SWEEP_MAX,
                    claim.hold,
                    claim.slots,
                    self._grace_us,
                    # only a started replica (heartbeating) says: Redis then asks it to
                    # register what it runs before granting it more
                    len(self.live) if self._replica else 0,
                )
            except StoreUnavailable as exc:
                if placeholder:  # the fallback counts this replica's share itself
                    self._drop_share(claim)
                if exc.sent and claim.hold:
                    # Redis may run it yet (stalled, the answer lost): cancelled by its id,
                    # and a local grant takes another id (it is registered when Redis is back)
                    self._queue(claim.pool, claim.hold, None, None)
                    claim = replace(claim, hold=LOCAL + claim.hold)
                return self._fallback(claim, str(exc))
            out = [_s(x) for x in raw]
            if out[0] == "ok":
                n = int(out[4])
                self._noticed(out[5 + n :])
                granted = Granted(out[1], float(out[2]), out[3] == "1", tuple(out[5 : 5 + n]))
                if claim.hold:
                    self._held(claim, in_redis=True)
                return granted
            self._noticed(out[4:])
            if out[1] == "replica_unknown":
                if attempt == 1 and await self._rejoin():
                    continue  # its requests in flight registered: once more
                return self._fallback(claim, "Redis does not know this replica as alive")
            known = (claim.pool, claim.entitlement) in self.definitions
            if out[1] != Check.UNKNOWN.value or not known:
                return Denied(Check(out[1]), float(out[2]), out[3])
            if attempt == 1 and await self.recover():
                continue  # published again, this replica's holds registered: once more
            return self._fallback(claim, "Redis has lost the pool's state (restarted?)")
        raise AssertionError("unreachable")

    async def recover(self) -> bool:
        """Redis answers without a pool this replica published (restarted empty): publish
        the definitions again and re-register this replica's requests in flight, once for
        any number of callers that found it so. True if Redis has them now."""
        if self.republish is None:
            return False
        seen = self._recoveries
        async with self._recovering:
            if self._recoveries != seen:
                return True  # another caller recovered while this one waited
            log.warning("entitlement store: Redis has lost the pools; publishing them again")
            try:
                await self.republish()
                if self._replica:  # alive again in Redis, so that its reserves are answered
                    for pool in self.capacities:
                        self._noticed((await self._beat(pool, self._replica))[2])
                await self.register_live()
            except StoreUnavailable:
                return False
            self._recoveries += 1
            self._pending_local = any(not e.in_redis for e in self.live.values())
            return True

    async def _rejoin(self) -> bool:
        """Redis does not know this replica as alive while it has requests in flight
        (Redis restarted, or its heartbeat lapsed): a heartbeat, which registers them
        (`heartbeat`), once for any number of reserves that found it so."""
        seen = self._rejoins
        async with self._registering:
            if self._rejoins != seen:
                return True
            try:
                # strict: a registration that failed must not let the reserve through
                self._noticed(list(await self.heartbeat(self._replica, strict=True)))
            except StoreUnavailable:
                return False
            self._rejoins += 1
            return True

    def _noticed(self, holds: list[str]) -> None:
        if holds and self.on_evict is not None:
            self.on_evict(tuple(holds))

    def _fallback(self, claim: Claim, why: str) -> Verdict:
        """Redis is away (the breaker is open): fail open at this replica's share, or fail
        closed. A call that failed while the breaker is closed — Redis answered just before
        and is not judged away — is refused (429, retry after one timeout), never admitted
        outside Redis: the other replicas admit up to the limit in Redis meanwhile, so a
        local grant then is over the limit."""
        known = self.definitions.get((claim.pool, claim.entitlement))
        now = self._local_now()
        if self.breaker.state == "closed":
            return Denied(
                Check.STORE_UNAVAILABLE,
                self.timeout_s,
                f"the entitlement store did not answer ({why}); Redis is not judged away "
                "(its breaker is closed), so nothing is admitted outside it",
            )
        if known is None or not self.fail_open.get(known[0].service_class, False):
            return Denied(
                Check.STORE_UNAVAILABLE,
                self.breaker.retry_in(now),
                f"the entitlement store is unavailable ({why}) and "
                f"{known[0].service_class if known else 'an unknown entitlement'} fails closed",
            )
        if not claim.hold:
            claim = replace(claim, hold=f"{LOCAL}{claim.replica}#{next(self._local_ids)}")
        verdict = self._local_ledger(now).reserve(claim, now)
        if isinstance(verdict, Granted):
            self.degraded_admissions += 1
            self.live[claim.hold] = _Live(claim, False, now)
            self._pending_local = True
        return verdict

    async def settle(
        self, pool: str, hold: str, used_tokens: int, latency: float | None = None
    ) -> bool:
        return (await self._finish_call(pool, hold, used_tokens, latency, release=False))[0]

    async def release(self, pool: str, hold: str) -> bool:
        return (await self._finish_call(pool, hold, None, None, release=True))[1]

    async def finish(
        self, pool: str, hold: str, used_tokens: int | None, latency: float | None = None
    ) -> bool:
        return (await self._finish_call(pool, hold, used_tokens, latency, release=True))[1]

    def _end_locally(
        self, pool: str, hold: str, used: int | None, latency: float | None, release: bool
    ) -> tuple[bool, bool, bool]:
        """The local ledger's part of a completion: (settled, released there, whether
        Redis may hold it — then Redis must be told too)."""
        now = self._local_now()
        settled = used is not None and self.local.settle(pool, hold, used, latency, now)
        released = release and self.local.release(pool, hold)
        entry = self.live.pop(hold, None) if release else self.live.get(hold)
        to_redis = entry is None or entry.in_redis or entry.sending or entry.sent
        return settled, released, to_redis

    async def _finish_call(
        self, pool: str, hold: str, used: int | None, latency: float | None, release: bool
    ) -> tuple[bool, bool]:
        settled, released, to_redis = self._end_locally(pool, hold, used, latency, release)
        if not to_redis:
            return settled, released
        out = await self._call(
            self._finish,
            pool,
            hold,
            "" if used is None else used,
            "" if latency is None else repr(float(latency)),
            "1" if release else "0",
            to_us(self.config.hold_ttl_s),
        )
        self._noticed([_s(x) for x in out[2:]])
        return bool(int(out[0])), bool(int(out[1]))

    def finish_soon(
        self, pool: str, hold: str, used_tokens: int | None, latency: float | None = None
    ) -> None:
        _, _, to_redis = self._end_locally(pool, hold, used_tokens, latency, True)
        if to_redis:
            self._queue(pool, hold, used_tokens, latency)

    def _queue(self, pool: str, hold: str, used: int | None, latency: float | None) -> None:
        if len(self._outbox) >= OUTBOX_MAX:  # Redis away for long: the oldest go (TTL)
            self._outbox.popleft()
        self._outbox.append((self._local_now(), pool, hold, used, latency))
        if self._drainer is None or self._drainer.done():
            with contextlib.suppress(RuntimeError):  # no running loop: `drained` sends them
                self._drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Completions in order, up to `FINISH_BATCH` per round trip (a pipeline of FINISH
        calls: under load completions arrive faster than one round trip each would
        clear, and a hold released late is a slot refused for nothing); while Redis is
        away, retried until acknowledged — or until the hold would have expired by its
        TTL anyway (then dropped: the TTL gives it back)."""
        _PROBING.set(False)  # its own task: not the probe's, even if one made it
        while self._outbox:
            batch = list(itertools.islice(self._outbox, FINISH_BATCH))
            try:
                await self._finish_batch(batch)
            except StoreUnavailable:
                now = self._local_now()
                while self._outbox and now - self._outbox[0][0] > self.config.hold_ttl_s:
                    self._outbox.popleft()
                if self._outbox:
                    await asyncio.sleep(min(self.breaker.retry_in(now), self.timeout_s))
                continue
            for _ in batch:
                self._outbox.popleft()

    async def _finish_batch(
        self, batch: list[tuple[float, str, str, int | None, float | None]]
    ) -> None:
        now = self._local_now()
        if not self.breaker.allow(now):
            raise StoreUnavailable("the entitlement store's breaker is open")
        gone_us = to_us(self.config.hold_ttl_s)
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for _, pool, hold, used, latency in batch:
                keys = self.keys(pool)
                # EVALSHA itself, not the Script object: a pipeline with scripts first asks
                # SCRIPT EXISTS (a round trip more); a Redis without it answers NOSCRIPT below
                pipe.evalsha(
                    self._finish.sha, len(keys), *keys, self._now_arg(), hold,
                    "" if used is None else used,
                    "" if latency is None else repr(float(latency)), "1", gone_us,
                )  # fmt: skip
            try:
                async with RedisDeadline(self.timeout_s):
                    results = await pipe.execute(raise_on_error=False)
            except RedisConnectionError as exc:
                if attempt == 1:
                    await self._drop_idle_connections()
                    continue
                self.breaker.failed(self._local_now(), f"{type(exc).__name__}: {exc}", now)
                raise StoreUnavailable(str(exc), sent=True) from exc
            except (RedisError, OSError, TimeoutError) as exc:
                self.breaker.failed(self._local_now(), f"{type(exc).__name__}: {exc}", now)
                raise StoreUnavailable(str(exc) or type(exc).__name__, sent=True) from exc
            break
        self._answered()
        for (_, pool, hold, used, latency), out in zip(batch, results, strict=True):
            if isinstance(out, NoScriptError):  # Redis restarted: the script loads again
                await self._finish_call(pool, hold, used, latency, release=True)
            elif isinstance(out, Exception):
                log.error("entitlement store: finishing hold %s failed: %s", hold, out)
            else:
                self._noticed([_s(x) for x in out[2:]])

    async def drained(self) -> None:
        """Wait until every queued completion has reached Redis (tests, shutdown)."""
        if self._outbox and (self._drainer is None or self._drainer.done()):
            self._drainer = asyncio.get_running_loop().create_task(self._drain())
        while self._drainer is not None and not self._drainer.done():
            await asyncio.shield(self._drainer)

    # --- re-registration -----------------------------------------------------------------
    async def register_live(self, pool: str | None = None, only_local: bool = False) -> int:
        """Hold in Redis this replica's requests in flight it does not hold (all of them:
        Redis restarted or reaped them; `only_local`: those the fallback granted). Returns
        how many Redis made; raises StoreUnavailable when it cannot (a pool it lost: -1
        from the script, then `recover`)."""
        pools = [pool] if pool is not None else list(self.capacities)
        made = 0
        for p in pools:
            todo = [
                e for e in self.live.values()
                if e.claim.pool == p and not e.sending and not (only_local and e.in_redis)
            ]  # fmt: skip
            for i in range(0, len(todo), REGISTER_BATCH):
                batch = todo[i : i + REGISTER_BATCH]
                args: list[Any] = [self._replica or batch[0].claim.replica,
                                   to_us(self.config.hold_ttl_s), self._grace_us]  # fmt: skip
                for e in batch:
                    c = e.claim
                    args += [c.hold, c.entitlement, c.request, c.tokens, c.slots]
                    e.sending = True
                try:
                    got = int(await self._call(self._register, p, *args))
                except StoreUnavailable as exc:
                    for e in batch:
                        e.sent = e.sent or exc.sent
                    raise
                finally:
                    for e in batch:
                        e.sending = False
                if got < 0:  # nothing made: Redis lacks the pool or an entitlement
                    raise StoreUnavailable(f"Redis has lost pool {p!r} or its entitlements")
                for e in batch:
                    if self.live.get(e.claim.hold) is e:  # not ended meanwhile
                        e.in_redis = True
                made += got
            if not only_local:
                self._unknown_to.discard(p)  # Redis holds all of this pool's now
        if made:
            log.warning("entitlement store: %d requests in flight registered again", made)
        return made

    # --- expiry ----------------------------------------------------------------------
    async def heartbeat(self, replica: str, strict: bool = False) -> tuple[str, ...]:
        """Tell Redis this replica is alive, and register what it runs that Redis lacks:
        all of it in a pool where Redis did not know it alive (restarted empty, or its
        heartbeat lapsed: kept in `_unknown_to` until a registration of all succeeded),
        else what the fallback granted. `strict`: raise when that registration cannot be
        made (the probe must not close the breaker then)."""
        self._forget_expired()
        alive, named = 1, []
        for pool in self.capacities:
            count, lapsed, notes = await self._beat(pool, replica)
            alive = max(alive, count)
            named += notes
            if lapsed and any(e.claim.pool == pool for e in self.live.values()):
                self._unknown_to.add(pool)
            unregistered = any(not e.in_redis for e in self.live.values())
            if pool in self._unknown_to or unregistered:
                try:
                    await self.register_live(pool, only_local=pool not in self._unknown_to)
                except StoreUnavailable:
                    if not await self.recover() and strict:
                        raise
        self.live_replicas = alive
        return tuple(named)

    async def _beat(self, pool: str, replica: str) -> tuple[int, bool, list[str]]:
        """One pool's heartbeat: (replicas alive, whether Redis did not know this one as
        alive, notices)."""
        out = await self._call(
            self._heartbeat, pool, replica, to_us(self.config.heartbeat_ttl_s), self._grace_us
        )
        return int(out[0]), int(out[1]) == 1, [_s(x) for x in out[2:]]

    def _forget_expired(self) -> None:
        """Requests whose completion never came (a bug elsewhere) stop being re-registered
        once their hold would have expired: `live` cannot grow without bound."""
        cutoff = self._local_now() - self.config.hold_ttl_s
        for hold in [h for h, e in self.live.items() if e.since < cutoff]:
            del self.live[hold]

    def start(self, replica: str) -> None:
        """Heartbeat `replica` every heartbeat_ttl_s / 3 until `close`; while the breaker
        is open, probe Redis every `breaker.probe_s` instead (`_probe`)."""
        self._replica = replica
        opened = asyncio.Event()
        self.breaker.prober = True
        self.breaker.on_move = lambda state: opened.set() if state == "open" else None

        async def beat() -> None:
            while True:
                opened.clear()
                period = self.config.heartbeat_ttl_s / 3
                try:
                    if self.breaker.state == "closed":
                        with contextlib.suppress(StoreUnavailable):
                            self._noticed(list(await self.heartbeat(replica)))
                    else:
                        await self._probe(replica)
                except Exception:  # never ends: only the probe closes the breaker
                    log.exception("entitlement store: heartbeat failed")
                if self.breaker.state != "closed":
                    period = min(period, self.breaker.probe_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(opened.wait(), period)  # or woken: it opened

        self._beater = asyncio.get_running_loop().create_task(beat())

    async def _probe(self, replica: str) -> bool:
        """The breaker is open: is Redis back? One heartbeat per pool, sent past the
        breaker (every `probe_s`, however long the cooldown: for as long as the breaker is
        open this replica admits on its local share while the others admit up to the limit
        in Redis, so it must rejoin as soon as Redis answers). The heartbeat registers what
        this replica runs that Redis lacks — all of it when Redis did not know it alive
        (restarted empty: the pools published again first, `recover`), else what the
        fallback granted — and only once Redis holds every request in flight is the
        breaker closed: Redis grants nothing new to this replica before it counts what
        it runs. (Requests the fallback grants during the probe are registered by the
        first reserve after, `_register_pending`.) False: not yet (the breaker stays
        open, the next probe in `probe_s`)."""
        token = _PROBING.set(True)
        try:
            self._noticed(list(await self.heartbeat(replica, strict=True)))
            if any(not e.in_redis and not e.sending for e in self.live.values()):
                await self.register_live(only_local=True)  # raises if Redis cannot yet
        except StoreUnavailable:
            return False
        finally:
            _PROBING.reset(token)
        self._pending_local = any(not e.in_redis for e in self.live.values())
        self._share_until = self._local_now() + self.rejoin_s
        self.breaker.succeeded()
        return True

    async def expire(self) -> int:
        gone = 0
        for pool in self.capacities:
            gone += int(await self._call(self._expire, pool, 1 << 40, self._grace_us))
        return gone

    # --- the control step --------------------------------------------------------------
    async def view(self, pool: str) -> PoolView:
        out = [_s(x) for x in await self._call(self._view, pool)]
        now_us, step_us, in_flight, kv = (int(float(x)) for x in out[:4])
        typical, threshold, holds = float(out[4]), out[5], int(float(out[6]))
        usages = []
        for i in range(7, len(out), 18):
            name, rec = out[i], out[i + 1 : i + 18]
            definition = self.definitions.get((pool, name), (None, 0.0))[0]
            cls, state = ServiceClass(rec[0]), EntitlementState(rec[1])
            num = [float(x) for x in rec[2:16]]
            if definition is None:
                definition = Entitlement(
                    name, pool, cls, num[0], int(num[1]), int(num[2]), None, "", state, num[3]
                )
            refusals = dict(
                (k, int(float(v))) for k, v in (p.split("=") for p in rec[16].split(",") if p)
            )
            usages.append(
                Usage(
                    definition,
                    int(num[4]),
                    int(num[5]),
                    int(num[6]),
                    int(num[7]),
                    int(num[8]),
                    int(num[9]),
                    num[10],
                    num[11],
                    num[12],
                    int(num[13]),
                    refusals,
                )
            )
        return PoolView(
            pool,
            now_us,
            step_us,
            in_flight,
            kv,
            float(threshold) if threshold else None,
            typical,
            tuple(sorted(usages, key=lambda u: u.definition.name)),
            holds,
        )

    async def apply_step(self, view: PoolView, dynamics: Mapping[str, Dynamics]) -> bool:
        args: list[Any] = [f"{view.step_us:.17g}", view.now_us]
        for name, d in dynamics.items():
            args += [name, repr(d.debt), repr(d.burst), repr(d.priority)]
            args += [d.charged_mark, d.refused_mark]
        return bool(int(await self._call(self._apply, view.pool, *args)))

    async def close(self) -> None:
        for task in (self._beater, self._drainer):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.client.aclose()
