"""Where entitlements' shared counters live: the `EntitlementStore` protocol, and the
in-memory store (the default: one gateway process, no Redis).

The split: pure policy computes (control.py's Eq. 1–3, the admitter's request → claim),
the store holds the counters and makes every check-and-reserve and every settle atomic.
In memory that is the ledger (ledger.py) behind one process's event loop; in Redis
(gateway/store_redis.py) it is one Lua script per operation, atomic across replicas. Both
pass one contract suite (tests/unit/policies/tenancy/test_store_contract.py).

The protocol is async because Redis is; the in-memory store's methods never await, so the
synchronous admitter (admitter.py) uses its ledger directly. The store owns time: the
in-memory store reads an injected clock, the Redis store the Redis server's clock (one
clock for every replica), so no method takes `now`.

Eviction across replicas: a grant names the caller's own preemptible holds to evict
(`Granted.evict`); a hold of another replica it names becomes a notice for that replica,
handed to it once — by its next `reserve` or `finish` (to the store's `on_evict`) or by
its `heartbeat` (returned) — so no extra round trip is spent on the hot path.

Every operation is idempotent where a retry could repeat it: settle and release by hold id
(a second call returns False and changes nothing); reserve is not (a retried reserve is a
second request).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from policies.clock import Clock
from policies.tenancy.capacity import PoolCapacity
from policies.tenancy.control import Dynamics, PoolView
from policies.tenancy.entitlement import Entitlement
from policies.tenancy.ledger import Ledger, StoreConfig
from policies.tenancy.verdict import Claim, Verdict


class EntitlementStore(Protocol):
    async def define_pool(self, name: str, capacity: PoolCapacity) -> None:
        """Create a pool or change its capacity (holds and counters are kept)."""
        ...

    async def put_entitlement(self, ent: Entitlement, priority: float) -> None:
        """Create or change an entitlement, with its priority (Eq. 1) as of now."""
        ...

    async def reserve(self, claim: Claim) -> Verdict:
        """§4.3's checks and, if admitted, the hold — one atomic step. A reserve cancelled
        while in flight leaves nothing held (a grant that arrives after is released)."""
        ...

    async def settle(
        self, pool: str, hold: str, used_tokens: int, latency: float | None = None
    ) -> bool:
        """Charge the real usage (refund or overrun); False if unknown or settled already."""
        ...

    async def release(self, pool: str, hold: str) -> bool:
        """Give the hold back; False if unknown or released already (expired included)."""
        ...

    async def finish(
        self, pool: str, hold: str, used_tokens: int | None, latency: float | None = None
    ) -> bool:
        """Settle (unless `used_tokens` is None) and release, in one atomic step: the one
        call a request makes at completion."""
        ...

    def finish_soon(
        self, pool: str, hold: str, used_tokens: int | None, latency: float | None = None
    ) -> None:
        """`finish` from synchronous code (the core's `complete`): run in order, retried
        while the store is unreachable, never dropped before the hold would expire."""
        ...

    async def heartbeat(self, replica: str) -> tuple[str, ...]:
        """`replica` is alive; its holds outlive it by the heartbeat TTL at most. Returns
        (once) its holds that other replicas' grants named for eviction (the Redis store
        also hands them to its `on_evict` from its reserve and finish replies)."""
        ...

    async def expire(self) -> int:
        """Reap expired holds now (reserve also reaps, a bounded number each call)."""
        ...

    async def view(self, pool: str) -> PoolView:
        """The pool's counters and every entitlement's, for the control step and metrics."""
        ...

    async def apply_step(self, view: PoolView, dynamics: Mapping[str, Dynamics]) -> bool:
        """Write a control step computed from `view`, unless the pool was stepped since."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class MemoryStore:
    """The ledger behind the protocol, on an injected clock."""

    clock: Clock
    config: StoreConfig = field(default_factory=StoreConfig)
    # called with this replica's holds another replica's grant named for eviction
    on_evict: Callable[[tuple[str, ...]], object] | None = None
    ledger: Ledger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.config)

    async def define_pool(self, name: str, capacity: PoolCapacity) -> None:
        self.ledger.define_pool(name, capacity, self.clock.now())

    async def put_entitlement(self, ent: Entitlement, priority: float) -> None:
        self.ledger.put_entitlement(ent, priority, self.clock.now())

    async def reserve(self, claim: Claim) -> Verdict:
        verdict = self.ledger.reserve(claim, self.clock.now())
        self._noticed(claim.pool, claim.replica)
        return verdict

    def _noticed(self, pool: str, replica: str) -> None:
        if replica:
            named = self.ledger.notices(pool, replica)
            if named and self.on_evict is not None:
                self.on_evict(named)

    async def settle(
        self, pool: str, hold: str, used_tokens: int, latency: float | None = None
    ) -> bool:
        settled = self.ledger.settle(pool, hold, used_tokens, latency, self.clock.now())
        self._noticed(pool, hold.rpartition("#")[0])
        return settled

    async def release(self, pool: str, hold: str) -> bool:
        released = self.ledger.release(pool, hold)
        self._noticed(pool, hold.rpartition("#")[0])
        return released

    async def finish(
        self, pool: str, hold: str, used_tokens: int | None, latency: float | None = None
    ) -> bool:
        now = self.clock.now()
        if used_tokens is not None:
            self.ledger.settle(pool, hold, used_tokens, latency, now)
        released = self.ledger.release(pool, hold)
        self._noticed(pool, hold.rpartition("#")[0])
        return released

    def finish_soon(
        self, pool: str, hold: str, used_tokens: int | None, latency: float | None = None
    ) -> None:
        now = self.clock.now()
        if used_tokens is not None:
            self.ledger.settle(pool, hold, used_tokens, latency, now)
        self.ledger.release(pool, hold)
        self._noticed(pool, hold.rpartition("#")[0])

    async def heartbeat(self, replica: str) -> tuple[str, ...]:
        return self.ledger.heartbeat(replica, self.clock.now())

    async def expire(self) -> int:
        return self.ledger.expire(self.clock.now())

    async def view(self, pool: str) -> PoolView:
        return self.ledger.view(pool, self.clock.now())

    async def apply_step(self, view: PoolView, dynamics: Mapping[str, Dynamics]) -> bool:
        return self.ledger.apply_step(view, dynamics)

    async def close(self) -> None:
        pass
