"""Entitlements: a tenant's right to part of a pool (the token-pools paper, §3.1, §4.1–4.2).

An entitlement names its tenant and pool, its service class (classes.py), its baselines
(λ_e tokens/s, χ_e KV bytes, r_e slots — for spot and preemptible these are caps, since
those classes have no baseline), its SLO target ℓ*_e, and a lifecycle state. Only a
`bound` entitlement admits (§4.3 check 1): `pending` has not been placed on the pool yet,
`degraded` was placed but the pool cannot currently honour it (§4.1: the lease pod stayed
pending), `expired` has ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from policies.tenancy.classes import RULES, ClassRules, ServiceClass


class EntitlementState(StrEnum):
    PENDING = "pending"
    BOUND = "bound"
    DEGRADED = "degraded"
    EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class Entitlement:
    name: str
    pool: str
    service_class: ServiceClass
    tokens_per_s: float = 0.0  # λ_e
    kv_bytes: int = 0  # χ_e
    concurrency: int = 0  # r_e
    slo_target_s: float | None = None  # ℓ*_e; None: the pool's average (a neutral SLO term)
    tenant: str = ""
    state: EntitlementState = EntitlementState.BOUND
    # the token budget's depth: λ_e·window_s tokens may be spent at once
    window_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.name or not self.pool:
            raise ValueError("an entitlement needs a name and a pool")
        if self.tokens_per_s < 0 or self.kv_bytes < 0 or self.concurrency < 0:
            raise ValueError(f"entitlement {self.name!r}: baselines cannot be negative")
        if self.window_s <= 0:
            raise ValueError(f"entitlement {self.name!r}: window_s must be positive")
        if self.slo_target_s is not None and self.slo_target_s <= 0:
            raise ValueError(f"entitlement {self.name!r}: slo_target_s must be positive")
        if self.rules.has_baseline and (
            self.tokens_per_s <= 0 or self.kv_bytes <= 0 or self.concurrency <= 0
        ):
            raise ValueError(
                f"entitlement {self.name!r}: a {self.service_class} entitlement needs positive "
                "baselines tokens_per_s, kv_bytes and concurrency"
            )

    @property
    def rules(self) -> ClassRules:
        return RULES[self.service_class]
