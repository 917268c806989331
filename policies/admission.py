"""Step 5: admission — may this request start now, on its tenant's entitlement?

An `Admitter` answers with a `Reservation` (a lease: what the request holds against its
entitlement until it ends), None (admitted, holding nothing), or an `AdmissionRefused` carrying how long to wait before a
retry would likely be admitted (the driver's 429 and its Retry-After). The core
(policies/core.py) keeps the reservation among the request's leases, calls `settle` with
the real outcome when the request ends and `release` on every path, exactly once.

The protocol and its registry are policies/protocols/admission.py. Registered policies
(`admission.policy`), loaded by the import list below (the one place that does):
- `always` — admits everything, holds nothing (the default: no entitlements configured);
- `concurrency` — at most `limit` requests of one entitlement in flight at once (the
  simplest entitlement in request units);
- `token_pools` — token-pool entitlements (policies/tenancy/): service classes, tokens/s,
  KV bytes and slots, priority with debt, shared across replicas through a store.

Failure posture: admission fails closed (a refusal) only on the entitlement's own
figures; an admitter that cannot reach its state (later: Redis) decides by its own
documented posture, not the core's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import policies.tenancy.admitter  # noqa: F401  (registers `token_pools`)
from policies.protocols.admission import ADMITTERS, AdmissionRefused, Admitter, Reservation
from policies.registry import config_from
from policies.types import Outcome, RequestInfo


@dataclass(slots=True)
class AdmitAll:
    name: str = "always"
    store: None = None  # no shared state

    def admit(self, request: RequestInfo, now: float) -> Reservation | AdmissionRefused | None:
        return None


@ADMITTERS.register("always")
def _always(params: Mapping[str, Any]) -> Admitter:
    config_from(_NoParams, params)
    return AdmitAll()


@dataclass(frozen=True)
class _NoParams:
    pass


@dataclass(frozen=True)
class ConcurrencyConfig:
    limit: int = 64  # requests of one entitlement in flight at once
    # the Retry-After of a refusal: a request's typical length, since a slot frees when
    # one of the entitlement's requests ends
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError("limit: must be at least 1")
        if self.retry_after_s <= 0:
            raise ValueError("retry_after_s: must be positive")


@dataclass(slots=True, eq=False)
class _Seat:
    counts: dict[str, int]
    entitlement: str
    held: bool = True

    def settle(self, outcome: Outcome, now: float) -> None:
        pass  # a seat is a seat: nothing to charge by usage

    def release(self) -> None:
        if self.held:
            self.held = False
            left = self.counts[self.entitlement] - 1
            if left:
                self.counts[self.entitlement] = left
            else:
                del self.counts[self.entitlement]


@dataclass(slots=True)
class ConcurrencyAdmitter:
    config: ConcurrencyConfig = field(default_factory=ConcurrencyConfig)
    name: str = "concurrency"
    store: None = None  # seats are this process's own
    in_flight: dict[str, int] = field(default_factory=dict)  # per entitlement

    def admit(self, request: RequestInfo, now: float) -> Reservation | AdmissionRefused | None:
        key = request.entitlement
        held = self.in_flight.get(key, 0)
        if held >= self.config.limit:
            return AdmissionRefused(
                f"entitlement {key!r} has {held} requests in flight, its limit "
                f"(admission.params.limit = {self.config.limit}); retry when one ends",
                self.config.retry_after_s,
            )
        self.in_flight[key] = held + 1
        return _Seat(self.in_flight, key)


@ADMITTERS.register("concurrency")
def _concurrency(params: Mapping[str, Any]) -> Admitter:
    return ConcurrencyAdmitter(config_from(ConcurrencyConfig, params))


def make_admitter(name: str, params: dict[str, Any] | None = None) -> Admitter:
    return ADMITTERS.make(name, params)


__all__ = [
    "ADMITTERS",
    "AdmissionRefused",
    "AdmitAll",
    "Admitter",
    "ConcurrencyAdmitter",
    "ConcurrencyConfig",
    "Reservation",
    "make_admitter",
]
