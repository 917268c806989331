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

Every error names its key path under `params` (`ParamError`: the gateway prefixes
`admission.params.`): an unknown key, a value of the wrong type (a number given as a
string, a fractional count), a value out of range.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from enum import Enum
from typing import Any, TypeVar

from policies.registry import ParamError
from policies.tenancy.capacity import KvGeometry, PoolCapacity
from policies.tenancy.classes import CLASS_WEIGHTS, RULES, ServiceClass
from policies.tenancy.entitlement import Entitlement, EntitlementState
from policies.tenancy.ledger import StoreConfig
from policies.tenancy.priority import PriorityConfig

T = TypeVar("T")
E = TypeVar("E", bound=Enum)


@dataclass(frozen=True)
class _PoolParams:
    slots: int
    tokens_per_s: float
    kv_bytes: int
    bytes_per_token: int | None = None
    kv_geometry: Mapping[str, Any] | None = None
    window_s: float = 60.0
    typical_request_s: float = 1.0

    def capacity(self, path: str) -> PoolCapacity:
        for name in ("slots", "tokens_per_s", "kv_bytes", "bytes_per_token", "window_s",
                     "typical_request_s"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ParamError(f"{path}.{name}", f"must be positive, got {value!r}")
        if (self.bytes_per_token is None) == (self.kv_geometry is None):
            raise ParamError(path, "give exactly one of bytes_per_token, kv_geometry")
        c = self.bytes_per_token
        if self.kv_geometry is not None:
            where = f"{path}.kv_geometry"
            geometry = checked(KvGeometry, self.kv_geometry, where)
            c = _valid(lambda: geometry.bytes_per_token, where)
        assert c is not None
        return _valid(
            lambda: PoolCapacity(
                self.tokens_per_s,
                self.kv_bytes,
                self.slots,
                c,
                self.window_s,
                self.typical_request_s,
            ),
            path,
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

    def entitlement(self, name: str, path: str) -> Entitlement:
        service_class = _choice(ServiceClass, self.service_class, f"{path}.class")
        state = _choice(EntitlementState, self.state, f"{path}.state")
        for key in ("tokens_per_s", "kv_bytes", "concurrency"):
            value = getattr(self, key)
            if value < 0:
                raise ParamError(f"{path}.{key}", f"cannot be negative, got {value!r}")
            if value == 0 and RULES[service_class].has_baseline:
                raise ParamError(
                    f"{path}.{key}",
                    f"a {service_class} entitlement needs a positive baseline "
                    "(tokens_per_s, kv_bytes and concurrency)",
                )
        for key in ("window_s", "slo_target_ms"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                raise ParamError(f"{path}.{key}", f"must be positive, got {value!r}")
        return _valid(
            lambda: Entitlement(
                name,
                self.pool,
                service_class,
                self.tokens_per_s,
                self.kv_bytes,
                self.concurrency,
                None if self.slo_target_ms is None else self.slo_target_ms / 1000.0,
                self.tenant,
                state,
                self.window_s,
            ),
            path,
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

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TokenPoolsConfig:
        """`admission.params` checked key by key (`ParamError` names the bad one)."""
        config: TokenPoolsConfig = checked(cls, params, "")
        return config

    def __post_init__(self) -> None:
        caps = {
            n: checked(_PoolParams, p, f"pools.{n}").capacity(f"pools.{n}")
            for n in self.pools
            for p in [self.pools[n]]
        }
        ents = {}
        for name, raw in self.entitlements.items():
            path = f"entitlements.{name}"
            if not isinstance(raw, Mapping):
                raise ParamError(path, f"must be a mapping, got {_shown(raw)}")
            params = dict(raw)
            if "class" in params:
                params["service_class"] = params.pop("class")
            ent = checked(_EntitlementParams, params, path).entitlement(name, path)
            if ent.pool not in caps:
                raise ParamError(
                    f"{path}.pool",
                    f"no pool {ent.pool!r} in admission.params.pools"
                    + (f" (the pools are {', '.join(sorted(caps))})" if caps else ""),
                )
            ents[name] = ent
        if self.default_entitlement is not None and self.default_entitlement not in ents:
            raise ParamError(
                "default_entitlement", f"{self.default_entitlement!r} is not an entitlement"
            )
        if self.default_max_tokens < 1:
            raise ParamError("default_max_tokens", "must be at least 1")
        for name in ("control_interval_s", "hold_ttl_s", "heartbeat_ttl_s", "state_retry_s"):
            if getattr(self, name) <= 0:
                raise ParamError(name, f"must be positive, got {getattr(self, name)!r}")
        for name in ("alpha_slo", "alpha_burst", "alpha_debt"):
            if getattr(self, name) < 0:
                raise ParamError(name, f"cannot be negative, got {getattr(self, name)!r}")
        for name in ("gamma_debt", "gamma_burst"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ParamError(name, f"must be in [0, 1), got {getattr(self, name)!r}")
        for k, v in self.class_weights.items():
            _choice(ServiceClass, k, f"class_weights.{k}")
            if not _is_number(v) or v < 0:
                raise ParamError(f"class_weights.{k}", f"must be a number ≥ 0, got {_shown(v)}")
        object.__setattr__(self, "capacities", caps)
        object.__setattr__(self, "definitions", ents)
        _valid(self.priority_config, "")
        _valid(self.store_config, "")

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


# --- checked construction: every error names its key path -------------------------------
_NUMBER_HINT = (
    "; YAML 1.1 reads an exponent without a dot or a signed exponent (1e12, 1.0e12) as a "
    "string: write 1.0e+12, or the number in full"
)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _shown(v: object) -> str:
    return f"the string {v!r}" if isinstance(v, str) else f"{type(v).__name__} {v!r}"


def _check_value(kind: str, value: Any, path: str) -> Any:
    """`value` as a field annotated `kind` takes it (an integral float for an int), or a
    ParamError naming `path`."""
    optional = kind.endswith(" | None")
    base = kind.removesuffix(" | None")
    if value is None and optional:
        return None
    if base == "float":
        if _is_number(value):
            return value
        hint = _NUMBER_HINT if isinstance(value, str) and _looks_numeric(value) else ""
        raise ParamError(path, f"must be a number, got {_shown(value)}{hint}")
    if base == "int":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        hint = _NUMBER_HINT if isinstance(value, str) and _looks_numeric(value) else ""
        raise ParamError(path, f"must be a whole number, got {_shown(value)}{hint}")
    if base == "str":
        if isinstance(value, str):
            return value
        raise ParamError(path, f"must be a string, got {_shown(value)}")
    if base.startswith("Mapping"):
        if isinstance(value, Mapping):
            return value
        raise ParamError(path, f"must be a mapping, got {_shown(value)}")
    return value


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def checked(cls: Any, params: Any, path: str) -> Any:
    """A frozen config dataclass from the mapping at `path` (under `params`; "" the top):
    unknown keys and values of the wrong type refused by their key path."""
    prefix = f"{path}." if path else ""
    if not isinstance(params, Mapping):
        raise ParamError(path or "params", f"must be a mapping, got {_shown(params)}")
    fields = {n: f for n, f in cls.__dataclass_fields__.items() if f.init}
    values = {}
    for key, value in params.items():
        f = fields.get(key)
        if f is None:
            alias = {f.metadata.get("alias"): n for n, f in fields.items()}.get(key)
            known = sorted(f.metadata.get("alias", n) for n, f in fields.items())
            if alias is None:
                raise ParamError(f"{prefix}{key}", f"unknown parameter; known: {', '.join(known)}")
            key, f = alias, fields[alias]
        name = f.metadata.get("alias", key)
        values[key] = _check_value(str(f.type), value, f"{prefix}{name}")
    missing = [
        n
        for n, f in fields.items()
        if n not in values and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ParamError(f"{prefix}{missing[0]}", "required")
    return _valid(lambda: cls(**values), path)


def _valid(build: Callable[[], T], path: str) -> T:
    """`build()`, its ValueError re-raised naming `path` (a ParamError keeps its own)."""
    try:
        return build()
    except ParamError:
        raise
    except ValueError as exc:
        if not path:
            raise
        raise ParamError(path, str(exc)) from None


def _choice(enum: type[E], value: Any, path: str) -> E:
    try:
        return enum(value)
    except ValueError:
        options = ", ".join(str(e.value) for e in enum)
        raise ParamError(path, f"must be one of {options}, got {value!r}") from None
