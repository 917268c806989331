"""The policy schema: one set of pydantic models for what the core runs, shared by the
gateway's configuration (gateway/config.py: its top level *is* a `PolicySpec`, plus the
gateway's own sections) and the simulator's scenarios (simulator/scenario.py: `policy:` is
a `PolicySpec`), and the one translation into the composition root's terms (`core_spec`
→ policies/build.py's `build_core`).

    placement   step 3, where a request goes (`placement.policy`, policies/pools.py)
    admission   step 5, may it start now (`admission.policy`, policies/admission.py)
    dispatch    step 6, the wait for room (`dispatch.policy`, policies/dispatch.py)
    routing     step 7, the worker in a pool (`routing.policy`; a pool's own `routing`
                beside its other keys: `pools.<name>.routing` / `fleet.pools.<i>.routing`)
    budget      step 3's estimate: the bytes-per-token prior, the default output budget
    retry       another worker after a failed attempt (policies/retry.py)
    breaker     a worker's circuit breaker (policies/health.py)
    health      active health checks and their hysteresis (policies/health.py)
    quartz      QUARTZ's predictor (policies/quantile/config.py)

Every section refuses unknown keys, and a policy chosen by name must build from its
parameters when the configuration is read: an error names the full key path
(`dispatch.params.slo_s.long: …`; `describe_errors`). A few keys concern only one driver
and say so: the other ignores them (the gateway's compression threads; the simulator's
engine comes from its fleet).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.budget import BudgetConfig
from policies.build import Choice, CoreSpec, PdSpec
from policies.dp_group import DpGroupSpec
from policies.health import Breaker
from policies.registry import ParamError
from policies.retry import RetryPolicy


class Section(BaseModel):
    """A configuration section: unknown keys are errors; frozen once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_builds(names: list[str], policy: str, build: Callable[[], object]) -> None:
    """A policy named in configuration must build: unknown names and parameters are
    refused when the configuration is read (the error names what is known)."""
    if policy not in names:
        raise ValueError(f"policy: unknown {policy!r}; known: {', '.join(names)}")
    try:
        build()
    except ParamError as exc:  # names its key: the error reads <section>.params.<path>
        raise ValueError(f"params.{exc.path}: {exc.detail}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"params: {exc}") from None


class RoutingSpec(Section):
    policy: str = "least_loaded"  # picks the worker inside a pool (a registered router)
    # the policy's own (quartz / point_pred: k, kv_threshold, kv_penalty_s)
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _builds(self) -> RoutingSpec:
        from policies.routing import ROUTERS

        check_builds(ROUTERS.names(), self.policy, lambda: ROUTERS.make(self.policy, self.params))
        return self

    def choice(self) -> Choice:
        return Choice(self.policy, self.params)


class PlacementSpec(Section):
    # a registered placement policy (policies/pools.py): compress_and_route, FleetOpt §5
    # (short, compress-then-short, long); short_long, §2.1
    policy: str = "compress_and_route"
    # the policy's own parameters (compress_and_route: min_target, compressible); the keys
    # below are offered to every policy, which takes the ones it uses
    params: dict[str, Any] = Field(default_factory=dict)
    short_pool: str = "short"
    # B_short: the short pool's boundary in tokens; defaults to its max_model_len
    b_short: int | None = Field(None, gt=0)
    # γ: compress when B_short < L_total ≤ γ·B_short (FleetOpt §5.1)
    gamma: float = Field(1.5, ge=1.0, le=4.0)
    # estimates this close below B_short are counted exactly before the short pool
    verify_margin: float = Field(0.05, ge=0.0, lt=1.0)
    # the gateway's: threads that count and compress borderline prompts off the event
    # loop; 0: inline (the simulator's compression model takes no time)
    compress_workers: int = Field(1, ge=0, le=64)
    # the gateway's compressor: never shorten the last user message (compressor.compress's
    # CompressorConfig.protect_last_user; false: it is shortened around its trailing
    # question). The simulator's compression model stands in for the compressor
    protect_last_user: bool = False
    # compress_and_route with no larger pool serving a model: compress band requests onto
    # the one pool (true), or refuse them 400 context_length_exceeded naming this key
    # (false, the default: a single pool silently shortening prompts surprised users)
    compress_single_pool: bool = False

    @model_validator(mode="after")
    def _builds(self) -> PlacementSpec:
        from policies.pools import PLACERS, make_placement

        b_short = self.b_short or 8192  # the short pool's context when unset: checked later
        check_builds(
            PLACERS.names(),
            self.policy,
            lambda: make_placement(
                self.policy,
                self.short_pool,
                b_short,
                self.gamma,
                self.verify_margin,
                self.placer_params(),
            ),
        )
        return self

    def placer_params(self) -> dict[str, Any]:
        return {**self.params, "compress_single_pool": self.compress_single_pool}


ServiceClassName = Literal["dedicated", "guaranteed", "elastic", "spot", "preemptible"]


class EntitlementStoreSettings(Section):
    """Where `token_pools` keeps its counters (admission.params beside the policy's own):
    `memory` (one process, no Redis) or `redis` (shared by every replica). The gateway's;
    the simulator keeps them in memory."""

    store: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "fg"  # Redis keys: <prefix>:{<pool>}:…
    timeout_s: float = Field(0.25, gt=0)  # every Redis call; never a hang
    # failed calls one after another (those in flight together count once) that open the
    # breaker; until it is open a failed call is a 429 store_unavailable, never admitted
    breaker_failures: int = Field(3, ge=1)
    # while the breaker is open a replica probes Redis in the background this often (a
    # heartbeat past the breaker) and closes it as soon as Redis answers and counts the
    # requests the replica runs: back on the shared limit within about this long
    breaker_probe_s: float = Field(0.2, gt=0)
    # a store that does not heartbeat (no prober): open this long, then one call probes
    breaker_cooldown_s: float = Field(2.0, gt=0)
    # Redis unreachable: a class that fails open is admitted against local limits / live
    # replicas, one that fails closed gets 429 store_unavailable. Defaults: dedicated,
    # guaranteed, elastic open; spot, preemptible closed
    fail_open: dict[ServiceClassName, bool] = Field(default_factory=dict)
    # the replicas sharing the store: while Redis is unreachable a replica admits at most
    # its share of each limit, ⌊limit / n⌋ with n = the larger of this and the replica
    # count its heartbeat last saw (this alone when it never reached Redis). 1: a replica
    # that starts without Redis admits the whole limit by itself
    expected_replicas: int = Field(1, ge=1, le=10_000)
    # token pool → fleet pool: the token pool's capacity follows that pool's workers in
    # service, discovered ones included (configured × active / listed workers, within
    # 0.1 s; a pool listing none has the configured capacity as one worker's), so a
    # worker drained, discovered or added through /admin/workers or a reload resizes it
    # (§3.1). In-memory store only (with Redis every replica would write the capacity)
    follow_workers: dict[str, str] = Field(default_factory=dict)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"must be a redis://, rediss:// or unix:// URL, got {v!r}")
        return v


STORE_KEYS = frozenset(EntitlementStoreSettings.model_fields)


class AdmissionSpec(Section):
    """Step 5 (policies/admission.py): `always` admits everything; `concurrency` holds at
    most `params.limit` requests of one entitlement in flight (429 + Retry-After beyond);
    `token_pools` admits on token-pool entitlements (policies/tenancy/config.py's keys,
    plus the store's: `EntitlementStoreSettings`; an entitlement may list its API `keys`)."""

    policy: str = "always"
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _builds(self) -> AdmissionSpec:
        from policies.admission import ADMITTERS

        if self.policy == "token_pools":
            try:
                self.store_settings()
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(p) for p in first["loc"] if p != "[key]")
                msg = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
                raise ValueError(f"params.{loc}: {msg.removeprefix('Value error, ')}") from None
        check_builds(
            ADMITTERS.names(),
            self.policy,
            lambda: ADMITTERS.make(self.policy, self.policy_params()),
        )
        return self

    def policy_params(self) -> dict[str, Any]:
        """`params` as the policy takes them (the store's settings and keys left out)."""
        if self.policy != "token_pools":
            return self.params
        out = {k: v for k, v in self.params.items() if k not in STORE_KEYS}
        ents = out.get("entitlements")
        if isinstance(ents, Mapping):
            out["entitlements"] = {
                n: {k: v for k, v in e.items() if k != "keys"} if isinstance(e, Mapping) else e
                for n, e in ents.items()
            }
        return out

    def store_settings(self) -> EntitlementStoreSettings:
        return EntitlementStoreSettings.model_validate(
            {k: v for k, v in self.params.items() if k in STORE_KEYS}
        )

    def entitlement_keys(self) -> dict[str, list[str]]:
        """`params.entitlements.<name>.keys` (token_pools): entitlement → its API keys."""
        ents = self.params.get("entitlements") if self.policy == "token_pools" else None
        if not isinstance(ents, Mapping):
            return {}
        return {
            str(n): [str(k) for k in e.get("keys") or ()]
            for n, e in ents.items()
            if isinstance(e, Mapping) and e.get("keys")
        }


class DispatchSpec(Section):
    """Requests that find every worker of their pools without room wait here, in the
    dispatch policy's order (fifo; quartz; token_fair)."""

    policy: str = "fifo"  # policies/dispatch.py's registry
    params: dict[str, Any] = Field(default_factory=dict)  # the policy's own (quartz: lam, beta…)
    max_waiting: int = Field(1024, ge=0)  # beyond this: 429 at once
    timeout_s: float = Field(30.0, gt=0)  # longer than this without room: 503 queue_timeout
    # a worker takes another request while this gateway's outstanding tokens on it
    # (Σ prompt + max_tokens) are below its KV cache tokens (from its /metrics) × this;
    # None: the KV cache's size is not used (engines preempt or queue past it themselves)
    kv_overcommit: float | None = Field(None, gt=0)
    # a worker takes another request while the prompt tokens this gateway sent it that
    # have no first token yet are below this (every dispatch policy alike; QUARTZ's room:
    # a long prompt waits here, where the order is ours); None: not considered
    prefill_room: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _builds(self) -> DispatchSpec:
        from policies.dispatch import DISPATCHERS

        params = self.dispatcher_params()
        check_builds(
            DISPATCHERS.names(), self.policy, lambda: DISPATCHERS.make(self.policy, params)
        )
        return self

    def dispatcher_params(self) -> dict[str, Any]:
        return {"max_waiting": self.max_waiting, "timeout_s": self.timeout_s, **self.params}


class BudgetSpec(Section):
    # the prior of the learnt bytes per token per content category (the estimate is bytes
    # / this, plus a chat-template allowance per message)
    bytes_per_token: float = Field(4.0, gt=0)
    default_max_tokens: int = Field(256, gt=0)  # the output budget of a request without max_tokens


class RetrySpec(Section):
    # attempts on other workers after a failed one, before any byte of an answer and only
    # for a failure that left the engine untouched (a connect error)
    max_retries: int = Field(1, ge=0, le=8)


class BreakerSpec(Section):
    failures: int = Field(3, ge=1)  # consecutive request failures that open the circuit
    open_s: float = Field(10.0, gt=0)  # how long it stays open before a trial request


class HealthSpec(Section):
    """Active health checks (the gateway: GET /health on every worker; the simulator: a
    worker in a `fault` whose `health: fails` fails them) and their hysteresis
    (policies/health.py)."""

    interval_s: float = Field(2.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)  # the gateway's; a simulated check takes no time
    unhealthy_after: int = Field(2, ge=1)  # consecutive failed checks
    healthy_after: int = Field(1, ge=1)  # consecutive good checks to come back


class QuartzSpec(Section):
    """QUARTZ's predictor (policies/quantile/config.py; gateway/quartz.py). Present, or a
    routing/dispatch policy that uses it: the predictor is built at start."""

    model: str | None = None  # a trained tree model file; None: the analytic model
    alpha: float = 0.95
    delta: float = Field(0.05, gt=0, lt=1)
    calibration: bool = True
    window: int = Field(256, ge=2)
    min_samples: int = Field(32, ge=1)
    locality: bool = True
    index_ttl_s: float = Field(300.0, gt=0)
    index_max_entries: int = Field(200_000, ge=1)
    high_fraction: float = Field(0.5, gt=0, le=1)
    # the simulator's prefix index: tokens per hashed block (the gateway hashes 512-byte
    # blocks of the prompt)
    block_tokens: int = Field(16, ge=1)
    index_stride: int = Field(8, ge=1)  # the simulator's: every how many blocks one is indexed
    mean_output_tokens: float = Field(256.0, ge=0)
    spread90: float = Field(1.3, ge=1)
    spread95: float = Field(1.5, ge=1)
    # the gateway's engine step model for the analytic estimate (emulator defaults); the
    # simulator reads its fleet's engine
    engine_w: float = Field(0.008, ge=0)
    engine_h: float = Field(0.00065, ge=0)
    prefill_chunk: int = Field(512, ge=1)
    # compute-bound prefill, when the engines are modelled with it (emulator flags of the
    # same names; a real engine: seconds per prompt token at full batch, and its
    # --max-num-batched-tokens)
    prefill_token_s: float = Field(0.0, ge=0)
    max_num_batched_tokens: int | None = Field(None, ge=1)

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v: float) -> float:
        if v not in (0.9, 0.95):
            raise ValueError("must be 0.9 or 0.95")
        return v

    @model_validator(mode="after")
    def _builds(self) -> QuartzSpec:
        self.settings()
        return self

    def settings(self) -> Any:
        """policies.quantile.config.QuartzSettings from these keys."""
        from policies.quantile.config import QuartzSettings

        names = set(QuartzSettings.__dataclass_fields__)
        return QuartzSettings(**{k: v for k, v in self.model_dump().items() if k in names})


class PolicySpec(Section):
    """What the core runs, in both drivers: the gateway's configuration has these sections
    at its top level, a scenario under `policy:`."""

    placement: PlacementSpec = Field(default_factory=PlacementSpec)
    admission: AdmissionSpec = Field(default_factory=AdmissionSpec)
    dispatch: DispatchSpec = Field(default_factory=DispatchSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    retry: RetrySpec = Field(default_factory=RetrySpec)
    breaker: BreakerSpec = Field(default_factory=BreakerSpec)
    health: HealthSpec = Field(default_factory=HealthSpec)
    quartz: QuartzSpec | None = None


POLICY_KEYS = frozenset(PolicySpec.model_fields)


def core_spec(
    policy: PolicySpec,
    contexts: Mapping[str, int],
    pool_routing: Mapping[str, RoutingSpec | None],
    dp_groups: Mapping[str, DpGroupSpec] | None = None,
    pd_pools: Mapping[str, PdSpec] | None = None,
) -> CoreSpec:
    """`policy` in the composition root's terms (policies/build.py), for a fleet whose
    pools serve `contexts` (name → max_model_len: B_short defaults to the short pool's),
    route with their own `pool_routing` (None: `policy.routing`), assign a `dp_group`
    pool's ranks by `dp_groups` and a `pd` pool's pairs by `pd_pools`."""
    p, d, b = policy.placement, policy.dispatch, policy.breaker
    return CoreSpec(
        placement=p.policy,
        short_pool=p.short_pool,
        b_short=p.b_short or contexts.get(p.short_pool, 0),
        gamma=p.gamma,
        verify_margin=p.verify_margin,
        placement_params=p.placer_params(),
        budget=BudgetConfig(
            bytes_per_token=policy.budget.bytes_per_token,
            default_max_tokens=policy.budget.default_max_tokens,
        ),
        routing=policy.routing.choice(),
        pool_routing={
            name: routing.choice() for name, routing in pool_routing.items() if routing is not None
        },
        admission=Choice(policy.admission.policy, policy.admission.policy_params()),
        dispatch=Choice(d.policy, d.dispatcher_params()),
        prefill_room=d.prefill_room,
        breaker=Breaker(b.failures, b.open_s),
        retry=RetryPolicy(policy.retry.max_retries),
        dp_groups=dict(dp_groups or {}),
        pd_pools=dict(pd_pools or {}),
    )


# what `check_builds` names: the policy, or a key path under its params
_POLICY_KEY = re.compile(r"policy|params(\.\S+)?")


def describe_errors(exc: ValidationError) -> list[str]:
    """Each error as `  <full key path>: <what is wrong>`: a check across sections names
    its own key path, a policy's parameter its path under `params`."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            head, sep, rest = msg.partition(": ")
            if loc == "(top level)" and sep and " " not in head:  # a check across sections
                loc, msg = head, rest  # names its own key path
            elif sep and _POLICY_KEY.fullmatch(head):  # a policy's name or parameter
                loc, msg = f"{loc}.{head}", rest
        lines.append(f"  {loc}: {msg}")
    return lines
