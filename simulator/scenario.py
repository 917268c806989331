"""Scenario files: fleet, workload, policy and seed in one YAML document, validated strictly.

    name: mixed-small
    seed: 7
    fleet:
      engine: {max_num_seqs: 64}          # defaults for every pool's EngineConfig
      pools:
        - {name: short, workers: 4, max_model_len: 8192}
        - {name: long, workers: 1, max_model_len: 65536, engine: {max_num_seqs: 16}}
    policy:
      placement: {short_pool: short, b_short: 8192}   # policy: short_long | compress_and_route
      routing: {policy: least_loaded}    # policies.routing registry name + params
      budget: {estimate: exact}          # or bytes: the gateway's estimate from bytes
      compression: {}                    # C&R's compression model (simulator/compression.py)
    telemetry: {scrape_interval: 0}      # 0 = fresh telemetry at every decision
    workload:
      requests: 3000
      arrivals: {kind: poisson, rate: 20}
      components:
        - {family: chat, weight: 0.7}
        - {family: rag, weight: 0.3}
      clients: 16
    slo: {interactive: 2.0, long: 4.0}    # TTFT targets per class (QUARTZ §5.2)

QUARTZ (issue 15): its routers and queue by name, the room every method shares, and the
predictor's settings (policies/quantile/config.py); with a predictor each record carries
`features`, `predicted` and `prefill_s`:

    policy:
      routing: {policy: quartz, params: {k: 2}}          # or point_pred, locality
      dispatch: {policy: quartz, capacity: engine, prefill_room: 16384,
                 params: {lam: 0.02, beta: 0.1}}          # or token_fair, fifo
      quartz: {alpha: 0.95, delta: 0.05}                  # {} : defaults (Table 3)

Multi-tenant workloads (the token-pools experiments, scenarios/token-pools-*.yaml) list
tenants instead of one arrival process; a tenant's name is its requests' client, which
is their entitlement at admission:

    workload:
      components: [{family: uniform}]     # shared shapes (a tenant may give its own)
      tenants:
        - {name: guaranteed-a, arrivals: {kind: poisson, rate: 1.4}, leave: 90}
        - {name: guaranteed-c, arrivals: {kind: poisson, rate: 1.4}, join: 30, leave: 60}
    events:                               # changes over time, in `at` order
      - {kind: workers, at: 30, pool: main, workers: 1, token_pool: qwen}  # capacity halves
      - {kind: entitlement, at: 210, name: reports, state: bound}          # a tenant binds

Every mapping forbids unknown keys, and engine/family parameters are checked against the
dataclasses they build, so a typo fails at load with the dotted path of the bad key
(``fleet.pools.0.workerz: unknown key``). Shipped scenarios live in
``simulator/scenarios/`` and can be named without their path or extension.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from emulator.engine import EngineConfig
from policies.registry import ParamError
from policies.types import Category
from simulator import families as fam
from simulator.pd_topology import PdPoolModel

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_fields(cls: type, params: dict[str, Any], what: str) -> dict[str, Any]:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"unknown {what} key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return params


class PoolModel(_Strict):
    name: str
    workers: int = Field(ge=1)
    max_model_len: int = Field(default=8192, ge=16)
    engine: dict[str, Any] = Field(default_factory=dict)
    routing: RoutingModel | None = None  # overrides policy.routing for this pool
    # its first n workers drop every connection (dead engines the health checks have not
    # caught yet): an attempt there fails before a response, and the core's retry policy
    # sends the request to another worker
    refuse_connections: int = Field(default=0, ge=0)
    # standard: independent replicas; pd: prefill and decode workers (simulator/pd_topology.py)
    kind: Literal["standard", "pd"] = "standard"
    pd: PdPoolModel | None = None

    @field_validator("engine")
    @classmethod
    def _engine_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_fields(EngineConfig, v, "engine")

    @model_validator(mode="after")
    def _pd_topology(self) -> PoolModel:
        if (self.kind == "pd") != (self.pd is not None):
            raise ValueError("kind: pd and its `pd` topology go together")
        if self.pd is not None and self.workers != self.pd.prefill + self.pd.decode:
            raise ValueError(f"workers: {self.workers}, but pd has prefill + decode = "
                             f"{self.pd.prefill + self.pd.decode}")  # fmt: skip
        return self


class FleetModel(_Strict):
    engine: dict[str, Any] = Field(default_factory=dict)
    pools: list[PoolModel] = Field(min_length=1)

    @field_validator("engine")
    @classmethod
    def _engine_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_fields(EngineConfig, v, "engine")


class RoutingModel(_Strict):
    policy: str = "least_loaded"
    params: dict[str, Any] = Field(default_factory=dict)


class PlacementModel(_Strict):
    # a registered placement policy (policies/pools.py; gateway/config.py `placement`)
    policy: str = "short_long"
    params: dict[str, Any] = Field(default_factory=dict)  # the policy's own
    short_pool: str = "short"
    b_short: int = Field(default=8192, ge=1)
    gamma: float = Field(default=1.5, ge=1.0, le=4.0)  # C&R: the band B_short < L ≤ γ·B_short
    verify_margin: float = Field(default=0.05, ge=0.0, lt=1.0)


class ShortenableModel(_Strict):
    mean: float = Field(ge=0.0, le=0.95)
    sd: float = Field(default=0.0, ge=0.0)


class CompressionSpecModel(_Strict):
    """simulator/compression.py: the share of a prompt's tokens compression could remove."""

    shortenable: dict[Category, ShortenableModel] = Field(default_factory=dict)
    granularity: float = Field(default=0.01, ge=0.0, lt=1.0)


class BudgetModel(_Strict):
    # exact: the workload's prompt lengths; bytes: estimated from bytes as the gateway does
    estimate: Literal["exact", "bytes"] = "exact"
    # with `bytes`: each category's true bytes per token (what ĉ_k should learn)
    bytes_per_token: dict[Category, float] = Field(
        default_factory=lambda: {
            Category.CHAT: 4.0,
            Category.PROSE: 4.2,
            Category.RAG: 4.0,
            Category.CODE: 3.4,
        }
    )
    prior_bytes_per_token: float = Field(default=4.0, gt=0)  # the gateway's budget prior


class DispatchModel(_Strict):
    """Step 6 (policies/dispatch.py): with `capacity: engine` a worker takes at most its
    engine's max_num_seqs from the gateway and the rest wait in the gateway's FIFO."""

    policy: str = "fifo"  # policies/dispatch.py's registry
    capacity: Literal["none", "engine"] = "none"
    # with `capacity: engine`: a worker also takes new requests only while the gateway's
    # outstanding tokens on it are below its KV cache tokens × this (gateway's
    # `dispatch.kv_overcommit`); None: the KV cache's size is not used
    kv_overcommit: float | None = Field(default=None, gt=0)
    max_waiting: int = Field(default=1_000_000, ge=0)
    timeout_s: float = Field(default=3600.0, gt=0)
    # a worker takes new requests only while the prompt tokens sent it without a first
    # token yet are below this (every dispatch policy alike); None: not considered
    prefill_room: int | None = Field(default=None, gt=0)
    params: dict[str, Any] = Field(default_factory=dict)  # the dispatch policy's own


class AdmissionModel(_Strict):
    """Step 5 (policies/admission.py): a registered admitter and its parameters; the
    entitlement of a simulated request is its workload client."""

    policy: str = "always"
    params: dict[str, Any] = Field(default_factory=dict)


class PolicyModel(_Strict):
    placement: PlacementModel = PlacementModel()
    admission: AdmissionModel = AdmissionModel()
    dispatch: DispatchModel = DispatchModel()
    routing: RoutingModel = RoutingModel()
    budget: BudgetModel = BudgetModel()
    compression: CompressionSpecModel = CompressionSpecModel()
    # QUARTZ's predictor (policies/quantile/config.py QuartzSettings' fields); also built
    # when a routing or dispatch policy uses it. Records then carry features, prefill_s
    # and the predicted quantiles.
    quartz: dict[str, Any] | None = None


class TelemetryModel(_Strict):
    scrape_interval: float = Field(default=0.0, ge=0.0)


class PoissonModel(_Strict):
    kind: Literal["poisson"]
    rate: float = Field(gt=0)


class GammaModel(_Strict):
    kind: Literal["gamma"]
    rate: float = Field(gt=0)
    cv: float = Field(default=2.0, gt=0)


class BurstyModel(_Strict):
    kind: Literal["bursty"]
    rate: float = Field(gt=0)
    burst_factor: float = Field(default=4.0, ge=1)
    burst_every: float = Field(default=20.0, gt=0)
    burst_duration: float = Field(default=2.0, gt=0)


ArrivalsModel = Annotated[PoissonModel | GammaModel | BurstyModel, Field(discriminator="kind")]

# family → (dataclass, default SLO class, default content category)
FAMILIES: dict[str, tuple[type, str, Category]] = {
    "cdf": (fam.CdfFamily, "interactive", Category.CHAT),
    "chat": (fam.ChatFamily, "interactive", Category.CHAT),
    "rag": (fam.RagFamily, "long", Category.RAG),
    "structured": (fam.StructuredFamily, "interactive", Category.PROSE),
    "burstgpt": (fam.BurstGptFamily, "interactive", Category.CHAT),
    "uniform": (fam.UniformFamily, "interactive", Category.CHAT),
}


class ComponentModel(_Strict):
    family: Literal["cdf", "chat", "rag", "structured", "burstgpt", "uniform"]
    weight: float = Field(default=1.0, gt=0)
    slo_class: str | None = None  # default: the family's (rag → long, others → interactive)
    category: Category | None = None
    cdf: str | None = None  # family cdf: a simulator/data file name or a path
    series: str | None = None  # family cdf: a series of a multi-series file
    input_fraction: float = Field(default=0.8, gt=0, lt=1)  # family cdf: FleetOpt's 80/20 split
    params: dict[str, Any] = Field(default_factory=dict)  # the family dataclass's fields

    @model_validator(mode="after")
    def _check(self) -> ComponentModel:
        cls = FAMILIES[self.family][0]
        if self.family == "cdf":
            if self.cdf is None:
                raise ValueError("family cdf needs `cdf` (e.g. azure_2023)")
            if self.params:
                raise ValueError("family cdf takes `cdf`, `series`, `input_fraction`, not params")
        else:
            _check_fields(cls, self.params, f"{self.family} family")
        return self


class TraceModel(_Strict):
    path: str
    speedup: float = Field(default=1.0, gt=0)  # divide the trace's inter-arrival times


class RetryModel(_Strict):
    """A client that resends a refused request after its Retry-After (capped)."""

    max_attempts: int = Field(default=1, ge=1)  # in all, the first included
    max_wait_s: float = Field(default=5.0, gt=0)


class TenantModel(_Strict):
    """One tenant (simulator/workloads.py `Tenant`): its own arrivals from `join` until
    `leave`, its request shapes (default: the workload's `components`), and its `name`,
    the client of its requests — their entitlement at admission (`policy.admission`)."""

    name: str
    arrivals: ArrivalsModel
    components: list[ComponentModel] = Field(default_factory=list)
    join: float = Field(default=0.0, ge=0)
    leave: float | None = None  # None: after `requests` requests
    requests: int | None = Field(default=None, ge=1)
    retry: RetryModel = RetryModel()  # default: a refused request is not retried

    @model_validator(mode="after")
    def _check(self) -> TenantModel:
        if self.leave is None and self.requests is None:
            raise ValueError(f"tenant {self.name!r} needs `leave` or `requests`")
        if self.leave is not None and self.leave <= self.join:
            raise ValueError(f"tenant {self.name!r}: `leave` must come after `join`")
        return self


class WorkloadModel(_Strict):
    # with `tenants`: a cap on the total (the first requests by arrival) only if given
    requests: int = Field(default=3000, ge=1)
    arrivals: ArrivalsModel | None = None
    components: list[ComponentModel] = Field(default_factory=list)
    trace: TraceModel | None = None
    tenants: list[TenantModel] = Field(default_factory=list)
    clients: int = Field(default=16, ge=1)
    client_skew: float = Field(default=0.0, ge=0)  # Zipf exponent of client popularity; 0 = uniform
    model: str = "model"

    @model_validator(mode="after")
    def _check(self) -> WorkloadModel:
        if self.tenants:
            if self.arrivals is not None or self.trace is not None:
                raise ValueError("a `tenants` workload takes neither `arrivals` nor `trace`")
            names = [t.name for t in self.tenants]
            if len(set(names)) != len(names):
                raise ValueError("tenant names must be unique")
            for t in self.tenants:
                if not (t.components or self.components):
                    raise ValueError(
                        f"tenant {t.name!r} needs `components` (its own or the workload's)"
                    )
            return self
        if self.trace is None and (self.arrivals is None or not self.components):
            raise ValueError("a workload needs `arrivals` and `components`, or a `trace`")
        if self.trace is not None and (self.arrivals is not None or self.components):
            raise ValueError("a `trace` workload takes neither `arrivals` nor `components`")
        return self


class WorkersEventModel(_Strict):
    """At `at`, `pool` keeps its first `workers` workers in service. A worker taken out
    drains: routing skips it (unhealthy), its in-flight requests finish; one brought back
    takes requests again. With `token_pool`, the `token_pools` admitter's pool of that
    name follows: its capacity becomes the configured one × workers in service / workers
    configured (the paper's Λ_p = replicas × per-replica capacity, §3.1)."""

    kind: Literal["workers"]
    at: float = Field(ge=0)
    pool: str
    workers: int = Field(ge=0)
    token_pool: str | None = None


class EntitlementEventModel(_Strict):
    """At `at`, the `token_pools` admitter's entitlement `name` enters `state` (bound,
    pending, degraded, expired): a tenant's entitlement binding as it joins, expiring
    as it leaves. Eq. 1's pool-average SLO counts bound entitlements only."""

    kind: Literal["entitlement"]
    at: float = Field(ge=0)
    name: str
    state: Literal["pending", "bound", "degraded", "expired"]


EventModel = Annotated[WorkersEventModel | EntitlementEventModel, Field(discriminator="kind")]


class ReportModel(_Strict):
    sample_interval: float | None = Field(default=None, gt=0)  # None: ~400 samples over the run
    plots: bool = True


class Scenario(_Strict):
    name: str
    description: str = ""
    seed: int = 0
    fleet: FleetModel
    policy: PolicyModel = PolicyModel()
    telemetry: TelemetryModel = TelemetryModel()
    workload: WorkloadModel
    slo: dict[str, float] = Field(default_factory=lambda: {"interactive": 2.0, "long": 4.0})
    report: ReportModel = ReportModel()
    # changes over time: workers in service, entitlement states (applied in `at` order)
    events: list[EventModel] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        names = [p.name for p in self.fleet.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool(s) defined twice: {', '.join(dupes)}")
        _check_policies(self)
        _check_events(self)
        return self

    def engine_config(self, pool: PoolModel) -> EngineConfig:
        # a pool's `engine.max_model_len` may be shorter than the context the pool is
        # configured with (placement's): a misconfigured worker, whose refusals the
        # core's context-length safety net places again on longer pools
        merged = {**self.fleet.engine, "max_model_len": pool.max_model_len, **pool.engine}
        return EngineConfig(**merged)


PoolModel.model_rebuild()


def _quartz_settings(params: dict[str, Any]) -> Any:
    from policies.quantile.config import QuartzSettings
    from policies.registry import config_from

    return config_from(QuartzSettings, params)


def _check_policies(sc: Scenario) -> None:
    """Every step's policy builds from its name and parameters; an error names its key."""
    from policies.admission import make_admitter
    from policies.dispatch import make_dispatcher
    from policies.pools import make_placement
    from policies.routing import make_router

    p = sc.policy
    pl = p.placement
    checks: list[tuple[str, Any]] = [
        (
            "policy.placement",
            lambda: make_placement(
                pl.policy, pl.short_pool, pl.b_short, pl.gamma, pl.verify_margin, pl.params
            ),
        ),
        ("policy.admission", lambda: make_admitter(p.admission.policy, p.admission.params)),
        ("policy.dispatch", lambda: make_dispatcher(p.dispatch.policy, p.dispatch.params)),
        ("policy.quartz", lambda: _quartz_settings(p.quartz or {})),
        ("policy.routing", lambda: make_router(p.routing.policy, p.routing.params)),
    ]
    for pool in sc.fleet.pools:
        if pool.routing is not None:
            r = pool.routing
            checks.append(
                (f"fleet.pools.{pool.name}.routing", lambda r=r: make_router(r.policy, r.params))
            )
    for where, build in checks:
        try:
            build()
        except ParamError as exc:  # names its key under the policy's params, as the gateway
            raise ValueError(f"{where}.params.{exc.path}: {exc.detail}") from None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: {exc}") from None


def _check_events(sc: Scenario) -> None:
    """Events name pools and entitlements that exist; admitter events need `token_pools`."""
    pools = {p.name: p.workers for p in sc.fleet.pools}
    admission = sc.policy.admission
    token_pools = admission.params.get("pools", {}) if admission.policy == "token_pools" else {}
    entitlements = (
        admission.params.get("entitlements", {}) if admission.policy == "token_pools" else {}
    )
    for i, ev in enumerate(sc.events):
        where = f"events.{i}"
        if isinstance(ev, WorkersEventModel):
            if ev.pool not in pools:
                raise ValueError(f"{where}: no pool {ev.pool!r} in fleet.pools")
            if ev.workers > pools[ev.pool]:
                raise ValueError(
                    f"{where}: {ev.workers} workers, but pool {ev.pool!r} has {pools[ev.pool]}"
                )
            if ev.token_pool is not None and ev.token_pool not in token_pools:
                raise ValueError(
                    f"{where}: no token pool {ev.token_pool!r} (needs policy.admission "
                    "token_pools with that pool)"
                )
        elif ev.name not in entitlements:
            raise ValueError(
                f"{where}: no entitlement {ev.name!r} (needs policy.admission token_pools "
                "with that entitlement)"
            )


class ScenarioError(ValueError):
    """A scenario that does not load: the message names the file and the bad keys."""


def _format(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)


def resolve(name: str) -> Path:
    """A scenario path, or the name of a shipped one (``fleetgate simulate mixed``)."""
    path = Path(name)
    if path.is_file():
        return path
    for candidate in (SCENARIO_DIR / name, SCENARIO_DIR / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    shipped = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
    raise ScenarioError(f"no scenario {name!r} (not a file; shipped: {shipped})")


def parse(doc: Any, source: str = "<scenario>") -> Scenario:
    try:
        return Scenario.model_validate(doc)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: invalid scenario\n{_format(exc)}") from None


def load(name: str) -> Scenario:
    path = resolve(name)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not YAML: {exc}") from None
    scenario = parse(doc, str(path))
    trace = scenario.workload.trace
    if trace is not None and not Path(trace.path).is_absolute():
        # A trace path is relative to the scenario file, so shipped scenarios can carry traces.
        resolved = str((path.parent / trace.path).resolve())
        workload = scenario.workload.model_copy(
            update={"trace": trace.model_copy(update={"path": resolved})}
        )
        scenario = scenario.model_copy(update={"workload": workload})
    return scenario
