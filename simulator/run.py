"""Assemble and run one scenario: workload → kernel → gateway pipeline → cluster → records.

Everything random is drawn from generators seeded by the scenario's seed (workload) or
by the policies' own seeded configs, and the kernel orders events by (time, priority,
sequence): the same scenario and seed give the same `RunResult`, to the last bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from policies.build import Choice, CoreSpec, PdSpec, build_core
from policies.core import ActionRecorder, Core
from policies.health import Hysteresis
from policies.hooks import Hook
from policies.quantile.config import EngineShape, QuartzSettings, build_predictor
from policies.quantile.features import PrefillModel
from policies.quantile.predictor import Predictor
from policies.routing import Router, make_router
from policies.spec import RoutingSpec
from policies.spec import core_spec as spec_core_spec
from policies.types import PoolSpec
from simulator.cluster import Cluster, EngineFactory, Worker, default_engine, dp_engine
from simulator.compression import DEFAULT_SHORTENABLE, CompressionModel, Shortenable
from simulator.driver import Driver
from simulator.families import CdfFamily
from simulator.kernel import PRIO_ARRIVAL, PRIO_STEP, Kernel
from simulator.lengths import load_cdf
from simulator.pd_topology import add_pd_pool
from simulator.records import Recorder, RequestRecord, Sampler, Series
from simulator.scenario import (
    FAMILIES,
    BurstyModel,
    ComponentModel,
    EntitlementEventModel,
    FaultEventModel,
    GammaModel,
    PoissonModel,
    Scenario,
    WorkersEventModel,
)
from simulator.workloads import (
    Arrivals,
    Bursty,
    Component,
    GammaArrivals,
    Poisson,
    RequestSpec,
    Retry,
    Tenant,
    generate,
    generate_tenants,
    read_trace,
)

# called at every sampling instant with the run's core and the virtual time (experiments
# read the admitter's state this way, e.g. the token-pool ledger's debt and priority)
Probe = Callable[[Core, float], None]


@dataclass(frozen=True, slots=True)
class PoolStats:
    name: str
    workers: int
    slots: int  # max_num_seqs per worker
    busy_slot_seconds: float
    busy_time: float
    steps: int


@dataclass
class RunResult:
    scenario: Scenario
    seed: int
    specs: list[RequestSpec]
    records: list[RequestRecord]
    series: Series
    pools: dict[str, PoolStats]
    events: int
    end: float  # virtual time of the last event
    engine_stats: dict[str, dict[str, float]] = field(default_factory=dict)
    core: Core | None = None  # the pipeline core as the run left it (its admitter's state)
    predictor: Predictor | None = None  # QUARTZ's, when the run had one (its calibration)


def _arrivals(model: PoissonModel | GammaModel | BurstyModel) -> Arrivals:
    if isinstance(model, PoissonModel):
        return Poisson(model.rate)
    if isinstance(model, GammaModel):
        return GammaArrivals(model.rate, model.cv)
    return Bursty(model.rate, model.burst_factor, model.burst_every, model.burst_duration)


def components(
    scenario: Scenario, seed: int, models: list[ComponentModel] | None = None
) -> list[Component]:
    out = []
    for c in scenario.workload.components if models is None else models:
        cls, slo_class, category = FAMILIES[c.family]
        if c.family == "cdf":
            family = CdfFamily(load_cdf(c.cdf or "", c.series), c.input_fraction)
        else:
            params = dict(c.params)
            if c.family == "structured":
                params.setdefault("seed", seed)
            family = cls(**params)
        out.append(Component(family, c.weight, c.slo_class or slo_class, c.category or category))
    return out


def build_workload(
    scenario: Scenario, seed: int | None = None, requests: int | None = None
) -> list[RequestSpec]:
    """The scenario's requests (generated from its seed, or read from its trace)."""
    seed = scenario.seed if seed is None else seed
    w = scenario.workload
    n = w.requests if requests is None else requests
    if w.trace is not None:
        return read_trace(w.trace.path, w.trace.speedup, limit=n)
    if w.tenants:
        shared = components(scenario, seed) if w.components else []
        tenants = [
            Tenant(
                t.name,
                _arrivals(t.arrivals),
                components(scenario, seed, t.components) if t.components else shared,
                t.join,
                t.leave if t.leave is not None else float("inf"),
                t.requests,
            )
            for t in w.tenants
        ]
        cap = n if (requests is not None or "requests" in w.model_fields_set) else None
        return generate_tenants(tenants, seed, w.model, cap)
    assert w.arrivals is not None
    return generate(
        components(scenario, seed),
        _arrivals(w.arrivals),
        n,
        seed,
        w.clients,
        w.client_skew,
        w.model,
    )


def core_spec(scenario: Scenario) -> CoreSpec:
    """The scenario's `policy` in the composition root's terms (policies/build.py), by the
    same translation the gateway's configuration takes (policies/spec.py)."""
    pools = scenario.fleet.pools
    return spec_core_spec(
        scenario.policy,
        {p.name: p.max_model_len for p in pools},
        {p.name: p.routing for p in pools},
        {p.name: p.dp_group.spec() for p in pools if p.dp_group is not None},
        {
            p.name: PdSpec(p.pd.protocol, Choice(p.pd.pair.policy, p.pd.pair.params))
            for p in pools
            if p.pd is not None
        },
    )


def compression_for(scenario: Scenario, seed: int) -> CompressionModel:
    spec = scenario.sim.compression
    shortenable = dict(DEFAULT_SHORTENABLE)
    shortenable.update({k: Shortenable(v.mean, v.sd) for k, v in spec.shortenable.items()})
    return CompressionModel(shortenable, spec.granularity, seed)


def run(
    scenario: Scenario,
    seed: int | None = None,
    requests: int | None = None,
    hooks: tuple[Hook, ...] = (),
    engine_factory: EngineFactory = default_engine,
    specs: list[RequestSpec] | None = None,
    routers: dict[str, Router] | None = None,
    probe: Probe | None = None,
    prefill_model: PrefillModel | None = None,
    log: ActionRecorder | None = None,
    source: Callable[[Kernel, Driver], None] | None = None,
) -> RunResult:
    """Run `scenario` to completion. `specs` replaces its workload and `routers` its
    per-pool routing policies (any object with the `Router` protocol), for experiments;
    `probe` is called at every sampling instant. `prefill_model` replaces QUARTZ's
    predictor model (default: the analytic model of the scenario's engine, or none when
    nothing uses a predictor) — e.g. a trained tree model, or an oracle. `log` records
    what the core decided (policies.actions.ActionLog). `source` is called once before the
    kernel runs, with the kernel and the driver, by a load source that schedules its own
    arrivals (simulator/closed_loop.py; `specs` is then empty)."""
    seed = scenario.seed if seed is None else seed
    if specs is None:
        specs = build_workload(scenario, seed, requests)
    kernel = Kernel()
    cluster = Cluster()
    recorder = Recorder()
    pool_specs = [PoolSpec(p.name, p.max_model_len) for p in scenario.fleet.pools]
    pool_routing = {p.name: p.routing or scenario.policy.routing for p in scenario.fleet.pools}
    core, predictor = build_core(
        core_spec(scenario),
        kernel.clock,
        hooks,
        routers=routers,
        predictor_for=lambda core: _predictor_for(scenario, core, pool_routing, prefill_model),
    )
    core.log = log
    gateway = Driver(
        kernel,
        cluster,
        pool_specs,
        core,
        recorder,
        scenario.telemetry.scrape_interval,
        compression_for(scenario, seed),
        bytes_per_token=(
            dict(scenario.sim.bytes_per_token) if scenario.sim.budget == "bytes" else None
        ),
        retries={
            t.name: Retry(t.retry.max_attempts, t.retry.max_wait_s)
            for t in scenario.workload.tenants
            if t.retry.max_attempts > 1
        },
        predictor=predictor,
        health_checks=_health_checks(scenario),
    )
    for p in scenario.fleet.pools:
        if p.pd is not None:  # prefill and decode workers (simulator/pd_topology.py)
            engine = dataclasses.asdict(scenario.engine_config(p))
            add_pd_pool(cluster, p.name, p.pd, engine, kernel, gateway, engine_factory)
            gateway.transfer_s_per_block[p.name] = p.pd.transfer_s_per_block
            continue
        dp = p.dp_config()
        factory = engine_factory if dp is None else dp_engine(dp)
        cluster.add_pool(p.name, p.workers, scenario.engine_config(p), kernel, gateway, factory)
        for w in cluster.pools[p.name][: p.refuse_connections]:
            w.refuses = True
    dispatch = scenario.policy.dispatch
    if scenario.fleet.capacity == "engine":
        for w in cluster.workers.values():
            w.view.capacity = w.config.max_num_seqs
            if dispatch.kv_overcommit is not None:
                kv = w.config.num_kv_blocks * w.config.block_size
                w.view.token_capacity = int(kv * dispatch.kv_overcommit)
    prefill_room = scenario.policy.dispatch.prefill_room
    if prefill_room is not None:
        for w in cluster.workers.values():
            w.view.prefill_capacity = prefill_room
    if predictor is not None:
        # its own name: the closure outlives the run (RunResult.predictor), and `workers` is
        # rebound below to each pool's list
        by_id = cluster.workers
        predictor.view_of = lambda wid: by_id[wid].view if wid in by_id else None
    gateway.bind()
    for ev in sorted(scenario.events, key=lambda e: e.at):
        kernel.at(ev.at, PRIO_STEP, _apply_event, (ev, cluster, core, kernel))

    feed = iter(specs)
    gateway.arrivals_left = len(specs)

    def arrive(spec: RequestSpec) -> None:
        gateway.arrivals_left -= 1
        nxt = next(feed, None)
        if nxt is not None:
            kernel.at(max(nxt.arrival, kernel.now()), PRIO_ARRIVAL, arrive, nxt)
        gateway.arrive(spec)

    first = next(feed, None)
    if first is not None:
        kernel.at(first.arrival, PRIO_ARRIVAL, arrive, first)
    if source is not None:  # a closed-loop source schedules its own arrivals
        source(kernel, gateway)
    interval = scenario.report.sample_interval or max(
        0.01, (specs[-1].arrival if specs else 1.0) / 400
    )
    sampler = Sampler(
        kernel,
        cluster,
        interval,
        gateway.active,
        None if probe is None else (lambda now: probe(core, now)),
    )
    gateway.start()
    kernel.run()

    pools = {}
    for name, workers in cluster.pools.items():
        pools[name] = PoolStats(
            name,
            len(workers),
            workers[0].config.max_num_seqs,
            sum(w.busy_slot_seconds for w in workers),
            sum(w.busy_time for w in workers),
            sum(w.steps for w in workers),
        )
    engine_stats = {}
    for name, workers in cluster.pools.items():
        stats = [w.engine.stats for w in workers]
        q = sum(s.prefix_queries_tokens for s in stats)
        engine_stats[name] = {
            "preemptions": float(sum(s.preemptions for s in stats)),
            "prefix_hit_rate": sum(s.prefix_hits_tokens for s in stats) / q if q else 0.0,
        }
    return RunResult(
        scenario,
        seed,
        specs,
        recorder.records,
        sampler.series,
        pools,
        kernel.events,
        kernel.now(),
        engine_stats,
        core,
        predictor,
    )


def _predictor_for(
    scenario: Scenario,
    core: Core,
    pool_routing: dict[str, RoutingSpec],
    model: PrefillModel | None,
) -> Predictor | None:
    """QUARTZ's predictor when the scenario configures one, a policy uses one, or a model
    is given; the analytic model reads the first pool's engine."""
    uses = (
        scenario.policy.quartz is not None
        or model is not None
        or hasattr(core.dispatcher, "bind_predictor")
        or any(
            hasattr(make_router(rm.policy, rm.params), "bind_predictor")
            for rm in pool_routing.values()
        )
        or any(hasattr(r, "bind_predictor") for r in core.routers.values())
    )
    if not uses:
        return None
    quartz = scenario.policy.quartz
    settings = quartz.settings() if quartz is not None else QuartzSettings()
    e = scenario.engine_config(scenario.fleet.pools[0])
    shape = EngineShape(
        e.w, e.h, e.prefill_chunk, e.max_num_seqs, e.prefill_token_s, e.max_num_batched_tokens
    )
    return build_predictor(settings, model, shape)


def _health_checks(scenario: Scenario) -> tuple[Hysteresis, float] | None:
    """The health checks' hysteresis and interval (`policy.health`), when some worker can
    fail a check (a `fault` event with `health: fails`); else None: every check would pass."""
    if not any(isinstance(e, FaultEventModel) and e.health == "fails" for e in scenario.events):
        return None
    h = scenario.policy.health
    return Hysteresis(h.unhealthy_after, h.healthy_after), h.interval_s


def _fault_ends(worker: Worker) -> None:
    worker.refuses = worker.fails_health = False


def _apply_event(arg: tuple[object, Cluster, Core, Kernel]) -> None:
    """A scenario event (scenario.py `events`) at its time: workers taken out of service
    or brought back (the token pool following), an entitlement's new state, or a worker
    that drops every connection for a period."""
    ev, cluster, core, kernel = arg
    now = kernel.now()
    admitter = core.admitter
    if isinstance(ev, FaultEventModel):
        worker = cluster.pools[ev.pool][ev.worker]
        worker.refuses = True
        worker.fails_health = ev.health == "fails"
        kernel.at(now + ev.for_s, PRIO_STEP, _fault_ends, worker)
    elif isinstance(ev, WorkersEventModel):
        workers = cluster.pools[ev.pool]
        for i, w in enumerate(workers):
            w.view.in_service = i < ev.workers  # out of service: drains, takes nothing new
            w.view.route_check(now)
        if ev.token_pool is not None:
            scale = getattr(admitter, "scale_pool", None)
            if scale is None:
                raise ValueError(f"admission policy {admitter.name!r} has no token pools")
            scale(ev.token_pool, ev.workers / len(workers), now)
    elif isinstance(ev, EntitlementEventModel):
        set_state = getattr(admitter, "set_state", None)
        if set_state is None:
            raise ValueError(f"admission policy {admitter.name!r} has no entitlements")
        set_state(ev.name, ev.state, now)
