"""What a check-and-reserve answers: admitted (with the reservation to settle and release,
and any preemptible requests to evict), or refused by one named check with a Retry-After.

The refusing check is the 429's error code, so a client (and a dashboard) can tell "my
entitlement is out of tokens" from "the pool is contended and my class yields".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Check(StrEnum):
    """The §4.3 checks in their order (2, the output-length default, never refuses)."""

    UNKNOWN = "unknown_entitlement"
    STATE = "entitlement_state"  # 1: not bound
    CONCURRENCY = "concurrency"  # 3: r_e in flight
    TOKEN_BUDGET = "token_budget"  # 4: prompt + max_tokens above the remaining λ_e budget
    KV_BYTES = "kv_bytes"  # 4b: KV footprint above χ_e
    POOL_CONTENTION = "pool_contention"  # 5: the pool is full and the priority is too low
    STORE_UNAVAILABLE = "store_unavailable"  # the shared store is down and the class fails closed


@dataclass(frozen=True, slots=True)
class Claim:
    """One request's ask: `tokens` = what the engine will run — every prompt once plus
    max_tokens for every sequence (n or best_of per prompt) — the budget reserved; KV bytes
    = tokens × the pool's bytes per token (computed by the store from the pool); `slots`
    = the sequences the engine runs at once for it (concurrency counts sequences)."""

    pool: str
    entitlement: str
    request: str  # the request's id (kept with its hold)
    tokens: int
    replica: str = ""  # the gateway replica holding it ("" : never reaped by heartbeat)
    slots: int = 1
    # the hold's id, chosen by the caller ("": the store numbers it). A gateway names its
    # holds `<replica run id>#<its own counter>`: never reused across Redis's lifetimes
    # nor its own, so a late completion can never release a hold granted after it, and a
    # reserve whose answer was lost can be cancelled (or retried) by its id
    hold: str = ""


@dataclass(frozen=True, slots=True)
class Granted:
    reservation: str  # the id to settle and release
    priority: float
    bursting: bool  # above the entitlement's own baseline, on idle pool capacity
    # hold ids of this replica's preemptible requests to cancel now (another replica's
    # holds named by this grant reach it as notices: EntitlementStore.heartbeat)
    evict: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Denied:
    check: Check
    retry_after: float  # seconds, > 0
    detail: str


Verdict = Granted | Denied
