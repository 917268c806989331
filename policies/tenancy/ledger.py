"""The ledger: a pool's shared counters and the §4.3 check-and-reserve over them.

This is the in-memory store's heart (store.py wraps it) and the specification the Redis
store's Lua scripts (gateway/store_redis_lua.py) implement line for line; one contract
suite (tests/unit/policies/tenancy/test_store_contract.py) runs both.

Per pool: slots in flight, KV bytes held, a throughput bucket of Λ_p, the unused baseline
of dedicated entitlements (held even when idle), the priorities of admitted requests (the
admission threshold is their minimum), the preemptible requests that may be evicted.
Per entitlement: its definition, slots in flight, KV bytes held, a throughput bucket of λ_e,
debt, burst and priority (written by the control step, control.py), and cumulative
counters (tokens charged, tokens refused) the control step differentiates.
Per reservation: what it took, so that settle and release give back exactly that, once.

`reserve` checks in the paper's order (§4.3), the first failing check refusing:
  0. the entitlement is known;                       → unknown_entitlement
  1. its state is bound;                             → entitlement_state
  3. in flight + slots ≤ r_e;                        → concurrency   (burst classes: go on, bursting)
  4. prompt + max_tokens ≤ its bucket's level;       → token_budget  (burst classes: go on, bursting)
     KV (prompt + max_tokens)·c + held ≤ χ_e;         → kv_bytes      (burst classes: go on, bursting)
  5. the pool has idle room in all three resources → admitted (work-conserving backfill).
     Otherwise the pool is contended:
       a reserved class within baseline            → admitted; preemptible holds are
                                                     named for eviction to make the room
                                                     (the grant names the caller's own; a
                                                     hold of another replica becomes a
                                                     notice that replica collects);
       a burst                                     → pool_contention (bursts take idle room only);
       within baseline, priority > threshold       → admitted (the threshold: the lowest
                                                     priority among admitted requests);
       else                                        → pool_contention.
(Check 2, the output-length default, is applied to the request before it gets here.)
A claim's slots are the sequences the engine runs for it (n or best_of per prompt, every
prompt of a batch): slots in flight, r_e and r_p count sequences, not requests.
Spot and preemptible have no baseline, so every request of theirs is a burst: surplus only.

A reservation expires `hold_ttl_s` after admission, or earlier when its replica's
heartbeat lapses; every `reserve` first reaps up to `SWEEP_MAX` expired holds, so a
crashed replica's holds come back without anyone calling release. Time in which nobody
reached the store (a stalled Redis) does not count against heartbeats (`_touch`).
A hold's id may be the caller's (`Claim.hold`): a reserve retried under the same id gets
the same grant, and `register` re-creates a replica's holds in a store that lost them.

Retry-After, from the state: the token wait is exact ((need − level)/λ_e); a wait for a
slot or KV is the pool's typical request length (an EWMA of observed latencies, seeded by
`PoolCapacity.typical_request_s`); a state refusal waits `state_retry_s`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.tenancy.bucket import MILLI, Bucket, to_us
from policies.tenancy.capacity import PoolCapacity
from policies.tenancy.classes import ClassRules
from policies.tenancy.control import Dynamics, PoolView, Usage
from policies.tenancy.entitlement import Entitlement, EntitlementState
from policies.tenancy.verdict import Check, Claim, Denied, Granted, Verdict

SWEEP_MAX = 64  # expired holds reaped per reserve call (bounded work on the hot path)
LATENCY_GAMMA = 0.8  # the typical request length's EWMA memory


@dataclass(frozen=True, slots=True)
class StoreConfig:
    hold_ttl_s: float = 900.0  # a reservation's hard lifetime: longer than any request
    heartbeat_ttl_s: float = 15.0  # a replica silent this long has its holds reaped
    state_retry_s: float = 5.0  # Retry-After for an entitlement not bound (a control interval)

    def __post_init__(self) -> None:
        if min(self.hold_ttl_s, self.heartbeat_ttl_s, self.state_retry_s) <= 0:
            raise ValueError(
                "store: hold_ttl_s, heartbeat_ttl_s and state_retry_s must be positive"
            )


@dataclass(slots=True)
class Hold:
    """One reservation: what it took, so that settle and release give back exactly that."""

    id: str
    request: str
    entitlement: str
    kv: int
    cost: int  # milli-tokens reserved: (prompt + max_tokens)·1000
    own: int  # milli-tokens taken from the entitlement's bucket
    pooled: int  # milli-tokens taken from the pool's bucket
    priority: float
    evictable: bool
    replica: str
    expires: int  # µs
    settled: bool = False
    named: bool = False  # named for eviction: its slots and KV count as coming back
    slots: int = 1  # sequences the engine runs for it (n or best_of × prompts)


@dataclass(slots=True)
class EntitlementLedger:
    definition: Entitlement
    bucket: Bucket
    priority: float
    # the definition's class rules, read on every reserve and release (kept in step with
    # `definition` by `Ledger.put_entitlement`)
    rules: ClassRules = field(init=False, repr=False)
    in_flight: int = 0
    kv: int = 0
    debt: float = 0.0
    burst: float = 0.0
    charged: int = 0  # milli-tokens charged, cumulative (reserved, then corrected at settle)
    refused: int = 0  # milli-tokens of refused requests, cumulative (unmet demand)
    charged_mark: int = 0  # `charged` at the last control step
    refused_mark: int = 0
    admitted_count: int = 0
    refusals: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.rules = self.definition.rules

    def idle_slots(self) -> int:
        """Its unused baseline slots, if its class holds them even when idle."""
        d = self.definition
        return max(0, d.concurrency - self.in_flight) if self.rules.holds_idle else 0

    def idle_kv(self) -> int:
        d = self.definition
        return max(0, d.kv_bytes - self.kv) if self.rules.holds_idle else 0


@dataclass(slots=True)
class PoolLedger:
    capacity: PoolCapacity
    bucket: Bucket
    typical_s: float
    in_flight: int = 0
    kv: int = 0
    idle_slots: int = 0  # Σ over dedicated entitlements of unused baseline slots
    idle_kv: int = 0
    entitlements: dict[str, EntitlementLedger] = field(default_factory=dict)
    holds: dict[str, Hold] = field(default_factory=dict)
    admitted: Counter[float] = field(default_factory=Counter)  # priority → holds
    evictable: dict[str, float] = field(default_factory=dict)  # hold id → priority
    named_slots: int = 0  # holds named for eviction, still held until their request ends
    named_kv: int = 0
    # replica → its hold ids named for eviction by another replica's grant, until collected
    notices: dict[str, list[str]] = field(default_factory=dict)
    replicas: dict[str, int] = field(default_factory=dict)  # replica → alive until (µs)
    by_replica: dict[str, dict[str, None]] = field(default_factory=dict)  # its hold ids
    step_us: int = -1  # the last control step's time (µs; -1: never)
    seq: int = 0  # reservation ids
    active_us: int | None = None  # the last reserve, heartbeat or expiry (µs): `_touch`

    def threshold(self) -> float | None:
        """The admission threshold: the lowest priority among admitted requests."""
        return min(self.admitted) if self.admitted else None


@dataclass(slots=True)
class Ledger:
    config: StoreConfig = field(default_factory=StoreConfig)
    pools: dict[str, PoolLedger] = field(default_factory=dict)

    # --- definitions -----------------------------------------------------------------
    def define_pool(self, name: str, capacity: PoolCapacity, now: float) -> None:
        """Create a pool, or change its capacity (counters and holds are kept)."""
        now_us = to_us(now)
        bucket = Bucket.full(capacity.tokens_per_s, capacity.window_s, now_us)
        pool = self.pools.get(name)
        if pool is None:
            self.pools[name] = PoolLedger(capacity, bucket, capacity.typical_request_s)
            return
        pool.bucket.refill(now_us)
        bucket.level = min(bucket.depth, pool.bucket.level)
        pool.capacity, pool.bucket = capacity, bucket

    def put_entitlement(self, ent: Entitlement, priority: float, now: float) -> None:
        """Create or change an entitlement (its counters and holds are kept)."""
        pool = self._pool(ent.pool)
        now_us = to_us(now)
        bucket = Bucket.full(ent.tokens_per_s, ent.window_s, now_us)
        led = pool.entitlements.get(ent.name)
        if led is None:
            led = pool.entitlements[ent.name] = EntitlementLedger(ent, bucket, priority)
        else:
            pool.idle_slots -= led.idle_slots()
            pool.idle_kv -= led.idle_kv()
            led.bucket.refill(now_us)
            bucket.level = min(bucket.depth, led.bucket.level)
            led.definition, led.bucket, led.priority = ent, bucket, priority
            led.rules = ent.rules
        pool.idle_slots += led.idle_slots()
        pool.idle_kv += led.idle_kv()

    def set_priority(self, pool: str, name: str, priority: float) -> None:
        self._pool(pool).entitlements[name].priority = priority

    # --- the control step (control.py) ---------------------------------------------------
    def view(self, pool_name: str, now: float) -> PoolView:
        pool = self._pool(pool_name)
        return PoolView(
            pool_name,
            to_us(now),
            pool.step_us,
            pool.in_flight,
            pool.kv,
            pool.threshold(),
            pool.typical_s,
            tuple(
                Usage(
                    led.definition,
                    led.in_flight,
                    led.kv,
                    led.charged,
                    led.refused,
                    led.charged_mark,
                    led.refused_mark,
                    led.debt,
                    led.burst,
                    led.priority,
                    led.admitted_count,
                    dict(led.refusals),
                )
                for _, led in sorted(pool.entitlements.items())
            ),
            len(pool.holds),
        )

    def apply_step(self, view: PoolView, dynamics: Mapping[str, Dynamics]) -> bool:
        """Write a step computed from `view`, unless the pool was stepped since (then
        another replica's step stands and this one is dropped)."""
        pool = self._pool(view.pool)
        if pool.step_us != view.step_us:
            return False
        pool.step_us = view.now_us
        for name, d in dynamics.items():
            led = pool.entitlements.get(name)
            if led is not None:
                led.debt, led.burst, led.priority = d.debt, d.burst, d.priority
                led.charged_mark, led.refused_mark = d.charged_mark, d.refused_mark
        return True

    # --- the hot path ------------------------------------------------------------------
    def reserve(self, claim: Claim, now: float) -> Verdict:
        now_us = to_us(now)
        pool = self.pools.get(claim.pool)
        if pool is not None:
            held = pool.holds.get(claim.hold) if claim.hold else None
            if held is not None:  # a retried reserve whose first answer was lost: the grant
                return Granted(held.id, held.priority, False, ())
            self._touch(pool, now_us)
            if pool.replicas or _oldest_expired(pool.holds, now_us):
                self._sweep(pool, now_us, SWEEP_MAX)
        led = pool.entitlements.get(claim.entitlement) if pool is not None else None
        if pool is None or led is None:
            return Denied(
                Check.UNKNOWN,
                self.config.state_retry_s,
                f"no entitlement {claim.entitlement!r} in pool {claim.pool!r}",
            )
        ent = led.definition
        cost = claim.tokens * MILLI
        kv = pool.capacity.kv_of(claim.tokens)
        denied = self._own_checks(pool, led, cost, kv, claim.slots, now_us)
        if isinstance(denied, Denied):
            led.refused += cost
            led.refusals[denied.check] += 1
            return denied
        bursting = denied
        evict: tuple[str, ...] = ()
        if not self._room(pool, cost, kv, claim.slots, now_us):
            threshold = pool.threshold()
            if led.rules.reserved and not bursting:
                evict = self._victims(pool, kv, claim.slots, claim.replica)
            elif bursting or (threshold is not None and not led.priority > threshold):
                led.refused += cost
                led.refusals[Check.POOL_CONTENTION] += 1
                why = (
                    "above its baseline, and bursts take only idle pool capacity"
                    if bursting
                    else f"priority {led.priority:.4g} is not above the pool's admission "
                    f"threshold {threshold:.4g}"
                )
                return Denied(
                    Check.POOL_CONTENTION,
                    self._pool_wait(pool, cost, kv, claim.slots),
                    f"pool {claim.pool!r} is full; entitlement {ent.name!r} ({ent.service_class}): {why}",
                )
        return self._take(pool, led, claim, cost, kv, bursting, evict, now_us)

    def finish(
        self,
        pool_name: str,
        hold_id: str,
        used_tokens: int | None,
        latency: float | None,
        now: float,
    ) -> None:
        """`settle` (unless `used_tokens` is None) then `release`: a request's end, in one
        call (the in-memory finisher's)."""
        pool = self.pools.get(pool_name)
        if pool is None:
            return
        if used_tokens is not None:
            self._settle(pool, pool.holds.get(hold_id), used_tokens, latency, now)
        self.release_hold(pool, hold_id)

    def settle(
        self, pool_name: str, hold_id: str, used_tokens: int, latency: float | None, now: float
    ) -> bool:
        """Charge what the request really used (refund the rest of its reservation, or
        charge the overrun down to an empty bucket); once per hold."""
        pool = self.pools.get(pool_name)
        if pool is None:
            return False
        return self._settle(pool, pool.holds.get(hold_id), used_tokens, latency, now)

    def _settle(
        self,
        pool: PoolLedger,
        hold: Hold | None,
        used_tokens: int,
        latency: float | None,
        now: float,
    ) -> bool:
        if hold is None or hold.settled:
            return False
        hold.settled = True
        now_us = to_us(now)
        led = pool.entitlements[hold.entitlement]
        led.bucket.refill(now_us)
        pool.bucket.refill(now_us)
        diff = hold.cost - used_tokens * MILLI
        if diff > 0:
            led.bucket.give(min(diff, hold.own))
            pool.bucket.give(min(diff, hold.pooled))
        elif diff < 0:
            led.bucket.take(-diff)
            pool.bucket.take(-diff)
        led.charged -= diff
        if latency is not None and latency > 0:
            pool.typical_s = LATENCY_GAMMA * pool.typical_s + (1 - LATENCY_GAMMA) * latency
        return True

    def release(self, pool_name: str, hold_id: str) -> bool:
        """Give back the hold's slot and KV bytes; once per hold."""
        pool = self.pools.get(pool_name)
        return pool is not None and self.release_hold(pool, hold_id)

    def release_hold(self, pool: PoolLedger, hold_id: str) -> bool:
        hold = pool.holds.pop(hold_id, None)
        if hold is None:
            return False
        if hold.replica:
            theirs = pool.by_replica[hold.replica]
            del theirs[hold_id]
            if not theirs:
                del pool.by_replica[hold.replica]
        led = pool.entitlements[hold.entitlement]
        holds_idle = led.rules.holds_idle
        if holds_idle:
            pool.idle_slots -= led.idle_slots()
            pool.idle_kv -= led.idle_kv()
        led.in_flight -= hold.slots
        led.kv -= hold.kv
        if holds_idle:
            pool.idle_slots += led.idle_slots()
            pool.idle_kv += led.idle_kv()
        pool.in_flight -= hold.slots
        pool.kv -= hold.kv
        admitted = pool.admitted
        left = admitted[hold.priority] - 1
        if left:
            admitted[hold.priority] = left
        else:
            admitted.pop(hold.priority)
        if hold.evictable:
            pool.evictable.pop(hold_id, None)
        if hold.named:
            pool.named_slots -= hold.slots
            pool.named_kv -= hold.kv
        return True

    # --- expiry ------------------------------------------------------------------------
    def heartbeat(self, replica: str, now: float) -> tuple[str, ...]:
        """The replica is alive: its holds survive `heartbeat_ttl_s` more (in every pool:
        the Redis store keeps one replica table per pool, in the pool's hash slot).
        Returns (and forgets) its holds other replicas' grants named for eviction."""
        now_us = to_us(now)
        alive = now_us + to_us(self.config.heartbeat_ttl_s)
        named: list[str] = []
        for pool in self.pools.values():
            self._touch(pool, now_us)
            pool.replicas[replica] = alive
            named += pool.notices.pop(replica, ())
        return tuple(named)

    def notices(self, pool_name: str, replica: str) -> tuple[str, ...]:
        """The replica's holds in the pool named for eviction by other replicas' grants,
        each returned once."""
        pool = self.pools.get(pool_name)
        return tuple(pool.notices.pop(replica, ())) if pool is not None else ()

    def expire(self, now: float, limit: int | None = None) -> int:
        """Release, in every pool, holds past their TTL or whose replica's heartbeat lapsed;
        returns how many."""
        now_us = to_us(now)
        gone = 0
        for pool in self.pools.values():
            self._touch(pool, now_us)
            gone += self._sweep(pool, now_us, limit)
        return gone

    def _touch(self, pool: PoolLedger, now_us: int) -> None:
        """Time in which nobody reached the store does not count against heartbeats.

        Live replicas heartbeat every heartbeat_ttl_s / 3, so a pool untouched for more than
        half the TTL means the store itself was stalled (or every replica cut off): on the
        first call after such a gap every replica's deadline moves on by the gap, and a
        replica that lived through the stall keeps its holds (its own heartbeat, queued
        behind the stall, lands right after). A replica that died before the stall still
        lapses, a gap later at most."""
        last = pool.active_us
        if last is not None and pool.replicas:
            gap = now_us - last
            if gap > to_us(self.config.heartbeat_ttl_s / 2):
                for replica in pool.replicas:
                    pool.replicas[replica] += gap
        pool.active_us = now_us

    def register(self, claim: Claim, now: float) -> bool:
        """Hold `claim` under its own id (`claim.hold`) without the checks, unless held
        already; True if it was not. A replica re-registering requests it has in flight
        with a store that lost them (restarted empty, or reaped them while it lived), and
        the Redis store's local ledger mirroring what Redis granted (its fallback must
        count this replica's requests in flight). Not an admission: `admitted` is kept."""
        pool = self.pools.get(claim.pool)
        led = pool.entitlements.get(claim.entitlement) if pool is not None else None
        if pool is None or led is None or not claim.hold or claim.hold in pool.holds:
            return False
        now_us = to_us(now)
        self._touch(pool, now_us)
        pool.bucket.refill(now_us)
        led.bucket.refill(now_us)
        cost, kv = claim.tokens * MILLI, pool.capacity.kv_of(claim.tokens)
        self._take(pool, led, claim, cost, kv, False, (), now_us, admitted=False)
        return True

    def _sweep(self, pool: PoolLedger, now_us: int, limit: int | None) -> int:
        """Up to `limit` holds: first those past their TTL, oldest first (holds are kept
        in admission order, which with one TTL and a clock that never goes back is expiry
        order), then the holds of replicas whose heartbeat lapsed, replica by replica (the
        one that lapsed first first), in id order; a dead replica with nothing left held is
        forgotten."""
        budget = limit if limit is not None else 1 << 62
        gone: list[str] = []
        for hid, hold in pool.holds.items():
            if hold.expires > now_us or len(gone) >= budget:
                break
            gone.append(hid)
        for hid in gone:
            self.release_hold(pool, hid)
        if pool.replicas:
            dead = sorted((t, r) for r, t in pool.replicas.items() if t <= now_us)
            for _, replica in dead:
                theirs = sorted(pool.by_replica.get(replica, ()))
                room = budget - len(gone)
                for hid in theirs[: max(0, room)]:
                    gone.append(hid)
                    self.release_hold(pool, hid)
                if len(theirs) <= room:
                    del pool.replicas[replica]
                    pool.notices.pop(replica, None)
        return len(gone)

    # --- the checks -------------------------------------------------------------------
    def _own_checks(
        self, pool: PoolLedger, led: EntitlementLedger, cost: int, kv: int, slots: int, now_us: int
    ) -> Denied | bool:
        """Checks 1, 3, 4: a refusal, or whether the request bursts above baseline."""
        ent, rules = led.definition, led.rules
        if ent.state is not EntitlementState.BOUND:
            return Denied(
                Check.STATE,
                self.config.state_retry_s,
                f"entitlement {ent.name!r} is {ent.state}, not bound",
            )
        bursting = not rules.has_baseline
        if led.in_flight + slots > ent.concurrency and rules.has_baseline:
            if not rules.burst:
                return Denied(
                    Check.CONCURRENCY,
                    pool.typical_s,
                    f"entitlement {ent.name!r} has {led.in_flight} requests in flight, its "
                    f"{ent.service_class} limit r_e = {ent.concurrency}",
                )
            bursting = True
        led.bucket.refill(now_us)
        if cost > led.bucket.level and rules.has_baseline:
            if not rules.burst:
                never = cost > led.bucket.depth
                return Denied(
                    Check.TOKEN_BUDGET,
                    ent.window_s if never else led.bucket.wait_s(cost),
                    f"entitlement {ent.name!r}: {cost // MILLI} tokens (prompt + max_tokens) "
                    + (
                        f"exceed its whole budget λ_e·window = {led.bucket.depth // MILLI}"
                        if never
                        else f"above its remaining budget {led.bucket.level // MILLI} of λ_e = "
                        f"{ent.tokens_per_s:g} tokens/s"
                    ),
                )
            bursting = True
        if led.kv + kv > ent.kv_bytes and rules.has_baseline:
            if not rules.burst:
                return Denied(
                    Check.KV_BYTES,
                    pool.typical_s,
                    f"entitlement {ent.name!r}: {kv} KV bytes on top of {led.kv} held exceed "
                    f"χ_e = {ent.kv_bytes}",
                )
            bursting = True
        return bursting

    def _room(self, pool: PoolLedger, cost: int, kv: int, slots: int, now_us: int) -> bool:
        """Idle room in all three of the pool's resources (dedicated idle baseline counted
        as taken)."""
        cap = pool.capacity
        pool.bucket.refill(now_us)
        return (
            pool.in_flight + pool.idle_slots + slots <= cap.slots
            and pool.kv + pool.idle_kv + kv <= cap.kv_bytes
            and cost <= pool.bucket.level
        )

    def _pool_wait(self, pool: PoolLedger, cost: int, kv: int, slots: int) -> float:
        cap = pool.capacity
        short_of_room = (
            pool.in_flight + pool.idle_slots + slots > cap.slots
            or pool.kv + pool.idle_kv + kv > cap.kv_bytes
        )
        tokens = pool.bucket.wait_s(cost)
        if tokens == float("inf") or cost > pool.bucket.depth:
            tokens = cap.window_s
        return max(pool.typical_s if short_of_room else 0.0, tokens)

    def _victims(self, pool: PoolLedger, kv: int, slots: int, replica: str) -> tuple[str, ...]:
        """Preemptible holds to evict (lowest priority first, then id) until the pool's
        slots and KV bytes have room for this request; each is named once. Returns those
        of `replica` (the grant's own: it cancels them at once); another replica's become
        a notice for it (collected with its next reserve, finish or heartbeat). A hold
        stays held until its request ends (cancelled), so it is settled once, by its own."""
        cap = pool.capacity
        # a hold named by an earlier grant is as good as gone: name nobody twice for one room
        slots_short = pool.in_flight - pool.named_slots + pool.idle_slots + slots - cap.slots
        kv_short = pool.kv - pool.named_kv + pool.idle_kv + kv - cap.kv_bytes
        chosen: list[str] = []
        for _, hid in sorted((p, h) for h, p in pool.evictable.items()):
            if slots_short <= 0 and kv_short <= 0:
                break
            hold = pool.holds[hid]
            del pool.evictable[hid]
            hold.named = True
            pool.named_slots += hold.slots
            pool.named_kv += hold.kv
            if hold.replica == replica:
                chosen.append(hid)
            else:
                pool.notices.setdefault(hold.replica, []).append(hid)
            slots_short -= hold.slots
            kv_short -= hold.kv
        return tuple(chosen)

    def _take(
        self,
        pool: PoolLedger,
        led: EntitlementLedger,
        claim: Claim,
        cost: int,
        kv: int,
        bursting: bool,
        evict: tuple[str, ...],
        now_us: int,
        admitted: bool = True,
    ) -> Granted:
        ent, rules = led.definition, led.rules
        if rules.holds_idle:
            pool.idle_slots -= led.idle_slots()
            pool.idle_kv -= led.idle_kv()
        led.in_flight += claim.slots
        led.kv += kv
        if rules.holds_idle:
            pool.idle_slots += led.idle_slots()
            pool.idle_kv += led.idle_kv()
        pool.in_flight += claim.slots
        pool.kv += kv
        own = led.bucket.take(cost)
        pooled = pool.bucket.take(cost)
        led.charged += cost
        if admitted:
            led.admitted_count += 1
            pool.seq += 1
        hid = claim.hold or f"{claim.replica}#{pool.seq}"
        hold = Hold(
            hid,
            claim.request,
            ent.name,
            kv,
            cost,
            own,
            pooled,
            led.priority,
            rules.evictable,
            claim.replica,
            now_us + to_us(self.config.hold_ttl_s),
            slots=claim.slots,
        )
        pool.holds[hid] = hold
        if claim.replica:
            pool.by_replica.setdefault(claim.replica, {})[hid] = None
        by_priority = pool.admitted  # plain dict calls: Counter's `+=` and `del` are Python
        by_priority[led.priority] = by_priority.get(led.priority, 0) + 1
        if hold.evictable:
            pool.evictable[hid] = led.priority
        return Granted(hid, led.priority, bursting, evict)

    def _pool(self, name: str) -> PoolLedger:
        try:
            return self.pools[name]
        except KeyError:
            raise ValueError(f"no pool {name!r}; define it first") from None


def _oldest_expired(holds: dict[str, Hold], now_us: int) -> bool:
    """The oldest hold (holds are kept in admission order) is past its TTL."""
    for hold in holds.values():
        return hold.expires <= now_us
    return False
