"""The composition root of the pipeline core: one function wires the configured policies
into a `Core`, for the gateway (gateway/proxy.py, from its YAML) and the simulator
(simulator/run.py, from a scenario's `policy`) alike, so both run the same objects.

`CoreSpec` is what the two configurations have in common, by the names configuration
uses: placement (`placement.policy` and its bounds), the budget's prior, routing (one
policy for every pool, or one per pool), admission, dispatch (and its prefill room),
the circuit breaker, the retry policy and the dp_group pools' assignment. Each driver translates its schema to it; the
policies themselves are looked up in their registries here.

A router that keeps state from the request stream (the cache-aware routers' prefix index
and active blocks, `regime_adaptive`'s TTFT sampler: docs/CACHE_ROUTING.md) offers it as
`hooks()`; they join the core's hooks when the router is built (a pool's first decision,
or `routers` given here), so the core's dispatch and completion events keep them current
in both drivers alike. A router without `hooks` adds nothing to any request's path. A `pd` pool's pair selector
offers its hooks the same way; those that are `PairHook`s (policies/hooks.py) — and the
driver's hooks that are — also hear the pool's pairs and hand-offs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compressor.script import Script
from policies.admission import make_admitter
from policies.budget import BudgetConfig, BudgetEstimator
from policies.clock import Clock
from policies.core import Core
from policies.dispatch import attach_clock, make_dispatcher
from policies.dp_group import DpGroup, DpGroupSpec
from policies.health import Breaker
from policies.hooks import Hook, PairHook
from policies.intake import Classifier, Intake, Prompt
from policies.pd import DEFAULT_SELECTOR, PdPool, make_pair_selector
from policies.pools import make_placement
from policies.quantile.predictor import Predictor, attach
from policies.retry import RetryPolicy
from policies.routing import Router, make_router
from policies.uncertainty import ByteBounds


@dataclass(frozen=True, slots=True)
class Choice:
    """A registered policy by name, and its own parameters."""

    policy: str
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PdSpec:
    """A `pd` pool (policies/pd/): its protocol and its pair selector (its workers' roles
    are the driver's: `WorkerView.role`)."""

    protocol: str  # "vllm" | "sglang"
    pair: Choice = field(default_factory=lambda: Choice(DEFAULT_SELECTOR))


@dataclass(frozen=True, slots=True)
class CoreSpec:
    placement: str = "compress_and_route"
    short_pool: str = "short"
    b_short: int = 8192
    gamma: float = 1.5
    verify_margin: float = 0.05
    placement_params: Mapping[str, Any] = field(default_factory=dict)  # the placer's own
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    routing: Choice = field(default_factory=lambda: Choice("least_loaded"))
    pool_routing: Mapping[str, Choice] = field(default_factory=dict)  # a pool's own
    admission: Choice = field(default_factory=lambda: Choice("always"))
    # the dispatcher's parameters include `max_waiting` and `timeout_s`
    dispatch: Choice = field(default_factory=lambda: Choice("fifo"))
    prefill_room: int | None = None  # dispatch.prefill_room: tokens; None: not considered
    breaker: Breaker | None = None  # None: workers keep no breaker (the simulator's)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # dp_group pools (policies/dp_group.py): pool name → its ranks, slots and policy
    dp_groups: Mapping[str, DpGroupSpec] = field(default_factory=dict)
    pd_pools: Mapping[str, PdSpec] = field(default_factory=dict)  # the `pd` pools, by name


def build_core(
    spec: CoreSpec,
    clock: Clock,
    hooks: tuple[Hook, ...] = (),
    classify: Classifier | None = None,
    routers: Mapping[str, Router] | None = None,
    predictor_for: Callable[[Core], Predictor | None] | None = None,
    bounds: ByteBounds | None = None,
    scripter: Callable[[Prompt], Script] | None = None,
) -> tuple[Core, Predictor | None]:
    """The core for `spec`, and QUARTZ's predictor when `predictor_for` gives one (it is
    asked once the core's dispatcher and `routers` exist: whether a policy uses one).

    `routers` replaces the routing of some pools (experiments); `classify` is the content
    classifier placement may ask (the gateway's; None: categories are given or assumed).
    `bounds` and `scripter` turn on counting where the byte estimate cannot decide
    (policies/uncertainty.py; the gateway's: the simulator's budget is exact or modelled).
    """
    placer = make_placement(
        spec.placement,
        spec.short_pool,
        spec.b_short,
        spec.gamma,
        spec.verify_margin,
        dict(spec.placement_params),
    )
    predictor: Predictor | None = None

    def router_for(pool: str) -> Router:
        choice = spec.pool_routing.get(pool, spec.routing)
        router = make_router(choice.policy, dict(choice.params))
        if predictor is not None:
            attach(router, predictor)
        attach_router_hooks(core, router)
        return router

    core = Core(
        Intake(placer, BudgetEstimator(spec.budget), classify, bounds=bounds, scripter=scripter),
        router_for,
        make_admitter(spec.admission.policy, dict(spec.admission.params)),
        make_dispatcher(spec.dispatch.policy, spec.dispatch.params),
        hooks,
        clock=clock,
        retry=spec.retry,
        breaker=spec.breaker,
    )
    core.routers.update(routers or {})
    core.groups.update({name: DpGroup(name, g) for name, g in spec.dp_groups.items()})
    for r in (routers or {}).values():
        attach_router_hooks(core, r)
    for name, pd in spec.pd_pools.items():
        selector = make_pair_selector(pd.pair.policy, dict(pd.pair.params))
        own = router_hooks(selector)
        attach_hooks(core, own)
        # the pool's pair events: its selector's, and the driver's hooks that want them
        pair = tuple(h for h in (*hooks, *own) if isinstance(h, PairHook))
        core.pd_pools[name] = PdPool(name, pd.protocol, selector, pair)
    # a dispatcher that reads the time between events (QUARTZ's wait bound) gets the clock
    attach_clock(core.dispatcher, clock)
    predictor = predictor_for(core) if predictor_for is not None else None
    if predictor is not None:
        attach(core.dispatcher, predictor)
        for r in core.routers.values():
            attach(r, predictor)
        core.hooks = (predictor, *core.hooks)  # it hears every request first
    core.track_prefill = predictor is not None or spec.prefill_room is not None
    core.prefill_room = spec.prefill_room is not None
    return core, predictor


def router_hooks(router: object) -> tuple[Hook, ...]:
    """The hooks a router keeps its state by (`hooks()`), or none."""
    hooks = getattr(router, "hooks", None)
    return tuple(hooks()) if callable(hooks) else ()


def attach_router_hooks(core: Core, router: object) -> None:
    """Add `router`'s hooks to the core's, once each (a hook given twice — by the driver
    and by the router — would count every event twice)."""
    attach_hooks(core, router_hooks(router))


def attach_hooks(core: Core, extra: tuple[Hook, ...]) -> None:
    """Add `extra` to the core's hooks, each once."""
    if extra:
        have = core.hooks
        core.hooks = (*have, *(h for h in extra if not any(h is o for o in have)))


def request_fields(spec: CoreSpec) -> frozenset[str]:
    """The optional `RequestInfo` fields the configured routers read (`request_fields` of
    each): what a driver must fill before `Core.start` — and need not compute otherwise
    (the gateway hashes prompts only when some router reads `prefix_hashes`)."""
    out: set[str] = set()
    for choice in (spec.routing, *spec.pool_routing.values()):
        router = make_router(choice.policy, dict(choice.params))
        out.update(getattr(router, "request_fields", ()))
    for pd in spec.pd_pools.values():  # a pair selector reads the prompt's chain too
        selector = make_pair_selector(pd.pair.policy, dict(pd.pair.params))
        out.update(getattr(selector, "request_fields", ()))
    return frozenset(out)
