"""`admission.params` of the `token_pools` admitter: pools, entitlements, knobs.

admission:
  policy: token_pools
  params:
    pools:
      qwen3-8b:                       # a token pool: one model's serving capacity
        slots: 16                      # r_p
        tokens_per_s: 240              # Λ_p
        kv_bytes: 8589934592           # χ_p
        kv_geometry: {layers: 36, kv_heads: 8, head_dim: 128, dtype_bytes: 2}
        # or bytes_per_token: 147456  (c = 2·L·H_kv·d_h·b)
    entitlements:
      team-a: {pool: qwen3-8b, class: guaranteed, tokens_per_s: 100,
               kv_bytes: 2147483648, concurrency: 4, slo_target_ms: 200}
    default_entitlement: null          # where requests of unknown entitlements go
    default_max_tokens: 1024           # §4.3 check 2: a request without max_tokens
    control_interval_s: 1.0            # the control step's period (Eq. 2–3's k)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.registry import config_from
from policies.tenancy.capacity import KvGeometry, PoolCapacity
from policies.tenancy.classes import CLASS_WEIGHTS, ServiceClass
from policies.tenancy.entitlement import Entitlement, EntitlementState
from policies.tenancy.ledger import StoreConfig
from policies.tenancy.priority import PriorityConfig


@dataclass(frozen=True)
class _PoolParams:
    slots: int
    tokens_per_s: float
    kv_bytes: int
    bytes_per_token: int | None = None
    kv_geometry: Mapping[str, Any] | None = None
    window_s: float = 60.0
    typical_request_s: float = 1.0

    def capacity(self, name: str) -> PoolCapacity:
        if (self.bytes_per_token is None) == (self.kv_geometry is None):
            raise ValueError(f"pool {name!r}: give exactly one of bytes_per_token, kv_geometry")
        c = self.bytes_per_token
        if self.kv_geometry is not None:
            c = config_from(KvGeometry, self.kv_geometry).bytes_per_token
        assert c is not None
        return PoolCapacity(
            self.tokens_per_s, self.kv_bytes, self.slots, c, self.window_s, self.typical_request_s
        )


@dataclass(frozen=True)
class _EntitlementParams:
    pool: str
    service_class: str = field(default="elastic", metadata={"alias": "class"})
    tokens_per_s: float = 0.0
    kv_bytes: int = 0
    concurrency: int = 0
    slo_target_ms: float | None = None
    tenant: str = ""
    state: str = "bound"
    window_s: float = 60.0

    def entitlement(self, name: str) -> Entitlement:
        return Entitlement(
            name,
            self.pool,
            ServiceClass(self.service_class),
            self.tokens_per_s,
            self.kv_bytes,
            self.concurrency,
            None if self.slo_target_ms is None else self.slo_target_ms / 1000.0,
            self.tenant,
            EntitlementState(self.state),
            self.window_s,
        )


@dataclass(frozen=True)
class TokenPoolsConfig:
    pools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    entitlements: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    default_entitlement: str | None = None
    default_max_tokens: int = 1024
    control_interval_s: float = 1.0
    alpha_slo: float = 2.0
    alpha_burst: float = 1.0
    alpha_debt: float = 4.0
    gamma_debt: float = 0.7
    gamma_burst: float = 0.7
    class_weights: Mapping[str, float] = field(default_factory=dict)
    hold_ttl_s: float = 900.0
    heartbeat_ttl_s: float = 15.0
    state_retry_s: float = 5.0
    capacities: dict[str, PoolCapacity] = field(init=False)
    definitions: dict[str, Entitlement] = field(init=False)

    def __post_init__(self) -> None:
        caps = {
            n: config_from(_PoolParams, p).capacity(n) for n in self.pools for p in [self.pools[n]]
        }
        ents = {}
        for name, raw in self.entitlements.items():
            params = dict(raw)
            if "class" in params:
                params["service_class"] = params.pop("class")
            ent = config_from(_EntitlementParams, params).entitlement(name)
            if ent.pool not in caps:
                raise ValueError(
                    f"entitlement {name!r}: no pool {ent.pool!r} in admission.params.pools"
                )
            ents[name] = ent
        if self.default_entitlement is not None and self.default_entitlement not in ents:
            raise ValueError(
                f"default_entitlement {self.default_entitlement!r} is not an entitlement"
            )
        if self.default_max_tokens < 1 or self.control_interval_s <= 0:
            raise ValueError("default_max_tokens and control_interval_s must be positive")
        object.__setattr__(self, "capacities", caps)
        object.__setattr__(self, "definitions", ents)
        self.priority_config()
        self.store_config()

    def priority_config(self) -> PriorityConfig:
        weights = dict(CLASS_WEIGHTS)
        weights.update({ServiceClass(k): float(v) for k, v in self.class_weights.items()})
        return PriorityConfig(
            self.alpha_slo,
            self.alpha_burst,
            self.alpha_debt,
            self.gamma_debt,
            self.gamma_burst,
            weights,
        )

    def store_config(self) -> StoreConfig:
        return StoreConfig(self.hold_ttl_s, self.heartbeat_ttl_s, self.state_retry_s)
