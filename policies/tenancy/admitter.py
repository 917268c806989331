"""The `token_pools` admitter: step 5 of the pipeline over token-pool entitlements.

Request → claim: the entitlement the gateway mapped the request's key to (or
`default_entitlement`), its pool, and what the engine will run for it: slots = its
sequences (n, or best_of when larger, for every prompt of a batched completion) and tokens
= every prompt once + max_tokens for every sequence, where a request without max_tokens
gets `default_max_tokens` (§4.3 check 2). With n=64 that is 64 slots and 64 answers'
worth of tokens, not one. The claim goes to
the ledger (ledger.py: checks 1, 3–5 and the hold, atomically); a grant becomes a
`TokenCharge` (a `Reservation`: settled with the engine's real usage, released once), a
denial an `AdmissionRefused` whose code is the refusing check.

Every `control_interval_s` (on the clock the core passes) the admitter steps each pool's
debt, burst and priority from observed usage (control.py).

Two paths:
- `admit` (synchronous, the core's step 5 today): the in-memory ledger, no awaiting;
- `admit_async`, when a shared store is attached (`attach`, the gateway's Redis store):
  one awaited `reserve` at admission, and one fire-and-forget `finish_soon` (settle and
  release in one atomic call) at completion.
A grant may name preemptible holds to evict (`TokenCharge.evict`, hold ids of this
replica's requests; another replica's reach it through its store as notices): cancelling
them is the driver's part — it keeps its evictable requests by `TokenCharge.hold`, cancels
the engine request, and completes the ticket (settle and release, once) with the error
code `preempted`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from policies.protocols.admission import ADMITTERS, AdmissionRefused, Reservation
from policies.tenancy.config import TokenPoolsConfig
from policies.tenancy.control import priorities, step
from policies.tenancy.entitlement import Entitlement, EntitlementState
from policies.tenancy.ledger import Ledger
from policies.tenancy.store import EntitlementStore
from policies.tenancy.verdict import Check, Claim, Denied, Granted, Verdict
from policies.types import Outcome, RequestInfo


class Finisher(Protocol):
    def finish(self, pool: str, hold: str, used_tokens: int | None, latency: float | None) -> None:
        """Settle (unless `used_tokens` is None) and release, once."""
        ...


@dataclass(slots=True, eq=False)
class TokenCharge:
    """One admitted request's hold; what it used is charged at `settle`, the hold given
    back at `release` (both once: a second call does nothing)."""

    finisher: Finisher = field(repr=False)
    pool: str
    hold: str
    entitlement: str
    tokens: int  # reserved: prompt + max_tokens
    priority: float
    bursting: bool
    evict: tuple[str, ...] = ()  # hold ids of this replica's preemptible requests to cancel now
    evictable: bool = False  # its class may be evicted (preemptible): the driver indexes it
    used: int | None = None
    latency: float | None = None
    done: bool = False

    def settle(self, outcome: Outcome, now: float) -> None:
        used = outcome.prompt_tokens + outcome.completion_tokens
        # no usage reported (an error before the engine counted): the reserved charge stands
        self.used = used if used > 0 else None
        self.latency = outcome.latency

    def release(self) -> None:
        if not self.done:
            self.done = True
            self.finisher.finish(self.pool, self.hold, self.used, self.latency)


@dataclass(slots=True)
class _LedgerFinisher:
    ledger: Ledger
    now: float = 0.0  # the admitter's latest clock reading (settlement's refill time)

    def finish(self, pool: str, hold: str, used_tokens: int | None, latency: float | None) -> None:
        self.ledger.finish(pool, hold, used_tokens, latency, self.now)


class AsyncFinisher(Protocol):
    def finish_soon(
        self, pool: str, hold: str, used_tokens: int | None, latency: float | None
    ) -> None: ...


@dataclass(slots=True)
class _StoreFinisher:
    store: AsyncFinisher

    def finish(self, pool: str, hold: str, used_tokens: int | None, latency: float | None) -> None:
        self.store.finish_soon(pool, hold, used_tokens, latency)


@dataclass(slots=True)
class TokenPoolsAdmitter:
    config: TokenPoolsConfig
    name: str = "token_pools"
    ledger: Ledger = field(init=False, repr=False)
    finisher: _LedgerFinisher = field(init=False, repr=False)
    last_step: float | None = None
    store: EntitlementStore | None = None  # attached by the gateway: admit_async uses it
    store_finisher: _StoreFinisher | None = None
    replica: str = ""
    holds_named: int = 0  # hold ids this admitter gave its claims to a shared store
    # the entitlements requests are claimed against: the configuration's, then changed at
    # run time by `define` (the gateway's admin API)
    definitions: dict[str, Entitlement] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.definitions = dict(self.config.definitions)
        self.ledger = Ledger(self.config.store_config())
        self.finisher = _LedgerFinisher(self.ledger)
        weights = priorities(self.config.definitions.values(), {}, self.config.priority_config())
        for name, cap in self.config.capacities.items():
            self.ledger.define_pool(name, cap, 0.0)
        for ent in self.config.definitions.values():
            self.ledger.put_entitlement(ent, weights[ent.name], 0.0)

    # --- request → claim -------------------------------------------------------------
    def entitlement_of(self, name: str) -> Entitlement | None:
        """The entitlement a request naming `name` is claimed against: its own, else
        `default_entitlement`, else None (refused as unknown)."""
        ent = self.definitions.get(name)
        if ent is None and self.config.default_entitlement is not None:
            ent = self.definitions[self.config.default_entitlement]
        return ent

    def claim(self, request: RequestInfo) -> Claim | AdmissionRefused:
        name = request.entitlement
        ent = self.entitlement_of(name)
        if ent is None:
            return AdmissionRefused(
                f"no token-pool entitlement {name!r} (admission.params.entitlements)",
                self.config.state_retry_s,
                Check.UNKNOWN.value,
            )
        max_tokens = (
            request.max_tokens if request.max_tokens > 0 else self.config.default_max_tokens
        )
        sequences = request.sequences
        tokens = request.prompts * request.prompt_tokens + sequences * max_tokens
        return Claim(ent.pool, ent.name, request.id, tokens, self.replica, sequences)

    # --- the synchronous path: the in-memory ledger -------------------------------------
    def admit(self, request: RequestInfo, now: float) -> Reservation | AdmissionRefused | None:
        self.finisher.now = now
        self._step(now)
        claim = self.claim(request)
        if isinstance(claim, AdmissionRefused):
            return claim
        return self._answer(claim, self.ledger.reserve(claim, now), self.finisher)

    def define(self, ent: Entitlement, now: float) -> float:
        """Create or change an entitlement at run time (its pool must exist); returns its
        Eq. 1 priority as of now (debt and burst carried over). With a store attached, the
        caller writes it to the store too (`put_entitlement`) — this changes what requests
        are claimed against, and the in-memory ledger."""
        if ent.pool not in self.config.capacities:
            raise ValueError(f"no pool {ent.pool!r} in admission.params.pools")
        self.definitions[ent.name] = ent
        pool = self.ledger.pools[ent.pool]
        dynamics = {n: (led.debt, led.burst) for n, led in pool.entitlements.items()}
        peers = [e for e in self.definitions.values() if e.pool == ent.pool]
        weight = priorities(peers, dynamics, self.config.priority_config())[ent.name]
        self.ledger.put_entitlement(ent, weight, now)
        return weight

    def _step(self, now: float) -> None:
        if self.last_step is not None and now - self.last_step < self.config.control_interval_s:
            return
        self.last_step = now
        config = self.config.priority_config()
        for pool in self.ledger.pools:
            view = self.ledger.view(pool, now)
            self.ledger.apply_step(view, step(view, config))

    # --- changes over time (the simulator's scenario events) -----------------------------
    def scale_pool(self, pool: str, fraction: float, now: float) -> None:
        """The pool's backends changed: its capacity becomes the configured one × `fraction`
        (§3.1: Λ_p is replica count × per-replica capacity; slots and KV bytes likewise).
        Holds are kept: a pool shrunk below what it holds admits nothing new until enough
        requests end. In-memory ledger only."""
        if fraction < 0:
            raise ValueError("scale_pool: fraction cannot be negative")
        cap = self.config.capacities.get(pool)
        if cap is None:
            raise ValueError(f"no token pool {pool!r} (admission.params.pools)")
        scaled = replace(
            cap,
            tokens_per_s=max(cap.tokens_per_s * fraction, 1e-9),
            kv_bytes=max(1, int(cap.kv_bytes * fraction)),
            slots=max(1, round(cap.slots * fraction)),
        )
        self.ledger.define_pool(pool, scaled, now)

    def set_state(self, entitlement: str, state: str, now: float) -> None:
        """The entitlement enters `state` (bound, pending, degraded, expired): a tenant's
        entitlement binding as it joins or expiring as it leaves. Its debt, burst and holds
        are kept; priorities follow at the next control step (Eq. 1's pool-average SLO
        counts bound entitlements only). In-memory ledger only."""
        ent = self.config.definitions.get(entitlement)
        if ent is None:
            raise ValueError(f"no token-pool entitlement {entitlement!r}")
        pool = self.ledger.pools[ent.pool]
        led = pool.entitlements[entitlement]
        changed = replace(led.definition, state=EntitlementState(state))
        self.ledger.put_entitlement(changed, led.priority, now)

    # --- the asynchronous path: a shared store ------------------------------------------
    def attach(self, store: EntitlementStore, finisher: AsyncFinisher, replica: str) -> None:
        """Use a shared store (the gateway's Redis store) for `admit_async`."""
        self.store, self.replica = store, replica
        self.store_finisher = _StoreFinisher(finisher)

    async def publish(self) -> None:
        """Write the configured pools and the entitlements (`definitions`, with their Eq. 1
        priorities) into the attached store: every replica does it at start; the
        definitions are the same (the gateway merges run-time changes in first)."""
        if self.store is None:
            return
        weights = priorities(self.definitions.values(), {}, self.config.priority_config())
        for name, cap in self.config.capacities.items():
            await self.store.define_pool(name, cap)
        for ent in self.definitions.values():
            await self.store.put_entitlement(ent, weights[ent.name])

    async def control_step(self) -> int:
        """One control interval on the attached store (the gateway runs it every
        `control_interval_s`; with N replicas the store applies one step per interval);
        returns how many pools this call stepped."""
        if self.store is None:
            return 0
        config, stepped = self.config.priority_config(), 0
        for pool in self.config.capacities:
            view = await self.store.view(pool)
            stepped += await self.store.apply_step(view, step(view, config))
        return stepped

    async def admit_async(
        self, request: RequestInfo, now: float
    ) -> Reservation | AdmissionRefused | None:
        if self.store is None or self.store_finisher is None:
            return self.admit(request, now)
        claim = self.claim(request)
        if isinstance(claim, AdmissionRefused):
            return claim
        # the hold's id is this replica's own, never reused (the replica id is one process
        # run's): a completion arriving after Redis restarted cannot release a hold granted
        # since, and a reserve whose answer was lost can be cancelled or retried by its id
        self.holds_named += 1
        claim = replace(claim, hold=f"{self.replica}#{self.holds_named}")
        return self._answer(claim, await self.store.reserve(claim), self.store_finisher)

    def _answer(
        self, claim: Claim, verdict: Verdict, finisher: Finisher
    ) -> TokenCharge | AdmissionRefused:
        if isinstance(verdict, Denied):
            return AdmissionRefused(verdict.detail, verdict.retry_after, verdict.check.value)
        assert isinstance(verdict, Granted)
        return TokenCharge(
            finisher,
            claim.pool,
            verdict.reservation,
            claim.entitlement,
            claim.tokens,
            verdict.priority,
            verdict.bursting,
            verdict.evict,
            self.definitions[claim.entitlement].rules.evictable
            if claim.entitlement in self.definitions
            else False,
        )


@ADMITTERS.register("token_pools")
def _token_pools(params: Mapping[str, Any]) -> TokenPoolsAdmitter:
    return TokenPoolsAdmitter(TokenPoolsConfig.from_params(params))
