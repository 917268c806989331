"""Scenario files: fleet, workload, policy and seed in one YAML document, validated strictly.

    name: mixed-small
    seed: 7
    fleet:
      engine: {max_num_seqs: 64}          # defaults for every pool's EngineConfig
      pools:
        - {name: short, workers: 4, max_model_len: 8192}
        - {name: long, workers: 1, max_model_len: 65536, engine: {max_num_seqs: 16}}
    policy:                              # the gateway's policy sections (policies/spec.py)
      placement: {short_pool: short, b_short: 8192}   # policy: short_long | compress_and_route
      routing: {policy: least_loaded}    # policies.routing registry name + params
    sim:                                 # the simulator's stand-ins for what the gateway measures
      budget: exact                      # or bytes: the gateway's estimate from bytes
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

    fleet: {capacity: engine, ...}        # a worker takes at most its max_num_seqs
    policy:
      routing: {policy: quartz, params: {k: 2}}          # or point_pred, locality
      dispatch: {policy: quartz, prefill_room: 16384,
                 params: {lam: 0.02, beta: 0.1}}          # or token_fair, fifo
      quartz: {alpha: 0.95, delta: 0.05}                  # {} : defaults (Table 3)

A data-parallel group (issue 26, docs/BFIO.md): one engine of G ranks stepping in lockstep
(emulator/dp_engine.py), its requests assigned to ranks from a holding pool by the core:

    fleet:
      pools:
        - {name: dp, workers: 1, max_model_len: 8192, kind: dp_group,
           dp_group: {ranks: 4, slots: 8, assigner: {policy: bfio}},
           dp_step: {t_sync: 0.002, k: 2.5e-6}}

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

One policy schema: `policy` is policies/spec.py's `PolicySpec`, the very sections of the
gateway's configuration (placement, admission, dispatch, budget, routing, retry, breaker,
quartz; a pool's own `routing`), so a scenario's policy reads as a gateway's. The
simulator's defaults differ from the gateway's in four keys, filled in when a scenario
leaves them out (`SIMULATOR_DEFAULTS`: short_long placement at B_short 8192, a queue that
neither fills nor times out); and what only the simulator has lives outside `policy`:
`sim` (the budget estimate's model, the compression model) and `fleet.capacity`. The
layout before the shared schema still loads: `policy.dispatch.capacity` is read as
`fleet.capacity`, `policy.compression` as `sim.compression`, `policy.budget.estimate` and
its per-category `bytes_per_token` as `sim.budget` and `sim.bytes_per_token`, and
`policy.budget.prior_bytes_per_token` as `policy.budget.bytes_per_token`.

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

from emulator.dp_engine import DpConfig
from emulator.engine import EngineConfig
from policies.dp_config import DpGroup as DpGroupModel
from policies.spec import PolicySpec, RoutingSpec, describe_errors
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
    routing: RoutingSpec | None = None  # overrides policy.routing for this pool
    # its first n workers drop every connection (dead engines the health checks have not
    # caught yet): an attempt there fails before a response, and the core's retry policy
    # sends the request to another worker
    refuse_connections: int = Field(default=0, ge=0)
    # workers: independent replicas; dp_group: one engine of G data-parallel ranks stepping
    # in lockstep (emulator/dp_engine.py), fed from a holding pool by an assignment policy
    # (`dp_group`, the gateway's model: policies/dp_config.py), `dp_step` its barrier's
    # T_sync and per-context-token K (DpConfig's t_sync, k); pd: prefill and decode
    # workers (simulator/pd_topology.py)
    kind: Literal["workers", "dp_group", "pd"] = "workers"
    dp_group: DpGroupModel | None = None
    dp_step: dict[str, float] = Field(default_factory=dict)
    pd: PdPoolModel | None = None

    @field_validator("engine")
    @classmethod
    def _engine_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_fields(EngineConfig, v, "engine")

    @field_validator("dp_step")
    @classmethod
    def _dp_step_keys(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - {"t_sync", "k"})
        if unknown:
            raise ValueError(f"unknown dp_step key(s) {', '.join(unknown)}; known: k, t_sync")
        return v

    @model_validator(mode="after")
    def _dp_group(self) -> PoolModel:
        if (self.kind == "dp_group") != (self.dp_group is not None):
            raise ValueError("dp_group: given exactly when kind: dp_group")
        if self.dp_group is not None and self.workers != 1:
            raise ValueError("workers: a simulated dp_group is one engine of its G ranks (1)")
        return self

    def dp_config(self) -> DpConfig | None:
        if self.dp_group is None:
            return None
        return DpConfig(self.dp_group.ranks, **self.dp_step)

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
    # engine: a worker takes at most its engine's max_num_seqs from the gateway (the
    # gateway's `pools.<name>.max_num_seqs`) and the rest wait in the gateway's queue
    # (`policy.dispatch`); none: every request goes to a worker at once
    capacity: Literal["none", "engine"] = "none"

    @field_validator("engine")
    @classmethod
    def _engine_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_fields(EngineConfig, v, "engine")


class ShortenableModel(_Strict):
    mean: float = Field(ge=0.0, le=0.95)
    sd: float = Field(default=0.0, ge=0.0)


class CompressionSpecModel(_Strict):
    """simulator/compression.py: the share of a prompt's tokens compression could remove."""

    shortenable: dict[Category, ShortenableModel] = Field(default_factory=dict)
    granularity: float = Field(default=0.01, ge=0.0, lt=1.0)


class SimModel(_Strict):
    """What the simulator models in place of what the gateway measures."""

    # exact: the workload's prompt lengths; bytes: estimated from bytes as the gateway does
    budget: Literal["exact", "bytes"] = "exact"
    # with `budget: bytes`: each category's true bytes per token (what ĉ_k should learn;
    # its prior is `policy.budget.bytes_per_token`)
    bytes_per_token: dict[Category, float] = Field(
        default_factory=lambda: {
            Category.CHAT: 4.0,
            Category.PROSE: 4.2,
            Category.RAG: 4.0,
            Category.CODE: 3.4,
        }
    )
    compression: CompressionSpecModel = CompressionSpecModel()  # C&R's compression model


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


class FaultEventModel(_Strict):
    """From `at`, `pool`'s worker number `worker` (from 0) drops every connection for
    `for_s` seconds (an engine dying and coming back before the health checks notice): an
    attempt there fails before a response, the core's retry policy sends the request to
    another worker and the worker's circuit breaker (`policy.breaker`) counts it."""

    kind: Literal["fault"]
    at: float = Field(ge=0)
    pool: str
    worker: int = Field(default=0, ge=0)
    for_s: float = Field(gt=0)
    # passes: its health checks still pass (the engine answers /health; only the breaker
    # notices); fails: they fail too, and after `policy.health.unhealthy_after` of them the
    # worker is out of routing until `healthy_after` good ones once the fault is over
    health: Literal["passes", "fails"] = "passes"


EventModel = Annotated[
    WorkersEventModel | EntitlementEventModel | FaultEventModel, Field(discriminator="kind")
]


# where the simulator's defaults are not the gateway's: placement as FleetOpt §2.1 sizes
# the fleet, and a queue that neither fills nor times out (a run measures the wait)
SIMULATOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "placement": {"policy": "short_long", "b_short": 8192},
    "dispatch": {"max_waiting": 1_000_000, "timeout_s": 3600.0},
}


class ReportModel(_Strict):
    sample_interval: float | None = Field(default=None, gt=0)  # None: ~400 samples over the run
    plots: bool = True


class Scenario(_Strict):
    name: str
    description: str = ""
    seed: int = 0
    fleet: FleetModel
    policy: PolicySpec = PolicySpec.model_validate(SIMULATOR_DEFAULTS)
    sim: SimModel = SimModel()
    telemetry: TelemetryModel = TelemetryModel()
    workload: WorkloadModel
    slo: dict[str, float] = Field(default_factory=lambda: {"interactive": 2.0, "long": 4.0})
    report: ReportModel = ReportModel()
    # changes over time: workers in service, entitlement states, a worker's fault for a
    # period (applied in `at` order)
    events: list[EventModel] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _layout(cls, doc: Any) -> Any:
        return _with_simulator_defaults(_moved_keys(doc))

    @model_validator(mode="after")
    def _check(self) -> Scenario:
        names = [p.name for p in self.fleet.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool(s) defined twice: {', '.join(dupes)}")
        _check_events(self)
        return self

    def engine_config(self, pool: PoolModel) -> EngineConfig:
        # a pool's `engine.max_model_len` may be shorter than the context the pool is
        # configured with (placement's): a misconfigured worker, whose refusals the
        # core's context-length safety net places again on longer pools
        merged = {**self.fleet.engine, "max_model_len": pool.max_model_len}
        if pool.dp_group is not None:  # a rank runs B requests at once
            merged["max_num_seqs"] = pool.dp_group.slots
        merged.update(pool.engine)
        return EngineConfig(**merged)


def _moved_keys(doc: Any) -> Any:
    """A scenario in the layout before the shared policy schema, in today's: the keys only
    the simulator has move out of `policy` (see the module's docstring); a key given in
    both places takes the old place's value (a dumped scenario edited the old way)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("policy"), dict):
        return doc
    doc, policy = dict(doc), dict(doc["policy"])
    sim = dict(doc["sim"]) if isinstance(doc.get("sim"), dict) else {}
    dispatch = policy.get("dispatch")
    if isinstance(dispatch, dict) and "capacity" in dispatch:
        policy["dispatch"] = dispatch = dict(dispatch)
        capacity = dispatch.pop("capacity")
        if isinstance(doc.get("fleet"), dict):
            doc["fleet"] = {**doc["fleet"], "capacity": capacity}
    budget = policy.get("budget")
    if isinstance(budget, dict):
        policy["budget"] = budget = dict(budget)
        if "estimate" in budget:
            sim["budget"] = budget.pop("estimate")
        if isinstance(budget.get("bytes_per_token"), dict):
            sim["bytes_per_token"] = budget.pop("bytes_per_token")
        if "prior_bytes_per_token" in budget:
            budget["bytes_per_token"] = budget.pop("prior_bytes_per_token")
    if "compression" in policy:
        sim["compression"] = policy.pop("compression")
    doc["policy"] = policy
    if sim:
        doc["sim"] = sim
    return doc


def _with_simulator_defaults(doc: Any) -> Any:
    if not isinstance(doc, dict):
        return doc
    policy = doc.get("policy", {})
    if not isinstance(policy, dict):
        return doc
    policy = dict(policy)
    for section, defaults in SIMULATOR_DEFAULTS.items():
        given = policy.get(section, {})
        if isinstance(given, dict):
            policy[section] = {**defaults, **given}
    return {**doc, "policy": policy}


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
        if isinstance(ev, FaultEventModel):
            if ev.pool not in pools:
                raise ValueError(f"{where}: no pool {ev.pool!r} in fleet.pools")
            if ev.worker >= pools[ev.pool]:
                raise ValueError(
                    f"{where}.worker: {ev.worker}, but pool {ev.pool!r} has {pools[ev.pool]}"
                    " workers (numbered from 0)"
                )
        elif isinstance(ev, WorkersEventModel):
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
    return "\n".join(describe_errors(exc))


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
