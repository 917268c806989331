"""The gateway's Prometheus metrics (all `fleetgate_`-prefixed, low-cardinality labels).

Hot-path series (counters and histograms) are updated per request through label children
bound once per (pool, status) pair. Per-worker gauges (in-flight, health, staleness,
breaker) are not updated on the hot path at all: a collector reads them from the fleet's
state when Prometheus scrapes. A worker that leaves the fleet (gateway/workers.py) takes its
label sets with it: the collector no longer sees it, and `worker_removed` drops its
counters' children, so a removed worker stops being exported.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.values import MutexValue

from gateway.metrics_dp import POOL_WAIT_BUCKETS, DpGroupCollector
from gateway.workers import Fleet, WorkerState
from policies.budget import BudgetEstimator
from policies.dp_group import DpGroup
from policies.quantile.features import Quantiles
from policies.quantile.predictor import Predictor
from policies.tenancy.control import PoolView

# `_created` series double the exposition and no dashboard reads them (prometheus_client
# leaves this function unannotated: typed here, so that strict mypy accepts the call)
_disable_created: Callable[[], None] = disable_created_metrics
_disable_created()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# TTFT and end-to-end buckets follow vLLM's (WIRE_SPEC §6) so dashboards line up.
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
_E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
)
_OVERHEAD_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05)


class _BudgetCollector(Collector):
    def __init__(self, estimator: BudgetEstimator) -> None:
        self.estimator = estimator

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "fleetgate_budget_bytes_per_token",
            "Learnt prompt bytes per engine token (ĉ_k), by content category.",
            labels=["category"],
        )
        for category, ratio in self.estimator.state.snapshot().items():
            g.add_metric([category], ratio)
        yield g


class _FleetCollector(Collector):
    def __init__(self, fleet: Fleet, now: Callable[[], float]) -> None:
        self.fleet = fleet
        self.now = now

    def collect(self) -> Iterator[Metric]:
        now = self.now()
        stale_after = self.fleet.config.telemetry.stale_after_s
        labels = ["pool", "worker"]
        in_flight = GaugeMetricFamily(
            "fleetgate_worker_in_flight",
            "Requests this gateway has in flight on the worker.",
            labels=labels,
        )
        healthy = GaugeMetricFamily(
            "fleetgate_worker_healthy",
            "1 if the worker passes health checks and its circuit is closed.",
            labels=labels,
        )
        breaker = GaugeMetricFamily(
            "fleetgate_worker_circuit_open",
            "1 while the worker's circuit breaker is open.",
            labels=labels,
        )
        stale = GaugeMetricFamily(
            "fleetgate_worker_telemetry_stale",
            "1 if the last good /metrics scrape is older than the staleness bound.",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "fleetgate_worker_telemetry_age_seconds",
            "Seconds since the last good /metrics scrape (-1: never).",
            labels=labels,
        )
        running = GaugeMetricFamily(
            "fleetgate_worker_engine_running",
            "Running requests the engine last reported.",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "fleetgate_worker_engine_waiting",
            "Waiting requests the engine last reported.",
            labels=labels,
        )
        kv = GaugeMetricFamily(
            "fleetgate_worker_engine_kv_usage",
            "KV-cache usage fraction the engine last reported.",
            labels=labels,
        )
        hit_rate = GaugeMetricFamily(
            "fleetgate_worker_engine_prefix_hit_rate",
            "The engine's prefix-cache hit rate between its last two scrapes (tokens).",
            labels=labels,
        )
        for w in self.fleet.workers.values():
            lv = [w.pool, w.id]
            t = w.telemetry
            in_flight.add_metric(lv, w.in_flight)
            healthy.add_metric(lv, 1.0 if w.routable(now) else 0.0)
            breaker.add_metric(lv, 1.0 if w.breaker_open(now) else 0.0)
            never = t.scraped_at is None
            stale.add_metric(lv, 1.0 if never or now - (t.scraped_at or 0) > stale_after else 0.0)
            age.add_metric(lv, -1.0 if never else now - (t.scraped_at or 0))
            running.add_metric(lv, t.running)
            waiting.add_metric(lv, t.waiting)
            kv.add_metric(lv, t.kv_usage)
            hit_rate.add_metric(lv, t.prefix_hit_rate)
        yield from (in_flight, healthy, breaker, stale, age, running, waiting, kv, hit_rate)


class _QuartzCollector(Collector):
    """QUARTZ's state, read at scrape time: which model, the fallback, coverage (pooled
    and per regime: 27 label values at most), the queue and the expected backlog."""

    def __init__(self, predictor: Predictor, dispatcher: Any) -> None:
        self.predictor = predictor
        self.dispatcher = dispatcher

    def collect(self) -> Iterator[Metric]:
        p = self.predictor
        cal = p.calibration
        info = GaugeMetricFamily(
            "fleetgate_quartz_model",
            "1 for the prefill model QUARTZ predicts with (analytic, or a model file's name).",
            labels=["model"],
        )
        info.add_metric([p.name], 1.0)
        fallback = GaugeMetricFamily(
            "fleetgate_quartz_fallback",
            "1 while calibrated coverage is below alpha - delta: routing least-loaded, queue FIFO.",
        )
        fallback.add_metric([], 1.0 if cal.degraded else 0.0)
        changes = CounterMetricFamily(
            "fleetgate_quartz_fallback_changes",
            "Times the fallback turned on or off.",
        )
        changes.add_metric([], cal.changes)
        coverage = GaugeMetricFamily(
            "fleetgate_quartz_coverage",
            "Share of recent first tokens within the calibrated alpha-quantile (all regimes).",
        )
        pooled = cal.coverage()
        coverage.add_metric([], -1.0 if pooled is None else pooled)
        regimes = GaugeMetricFamily(
            "fleetgate_quartz_regime_coverage",
            "Coverage of the calibrated alpha-quantile per regime (prompt/locality/load).",
            labels=["regime"],
        )
        for regime, (cov, _) in cal.coverage_by_regime().items():
            regimes.add_metric([regime], cov)
        observed = CounterMetricFamily(
            "fleetgate_quartz_observations",
            "First tokens whose prefill time fed the calibration.",
        )
        observed.add_metric([], p.observed)
        queued = GaugeMetricFamily(
            "fleetgate_quartz_queue_length",
            "Requests waiting in the gateway for a worker with room.",
        )
        queued.add_metric([], len(self.dispatcher))
        backlog = GaugeMetricFamily(
            "fleetgate_quartz_worker_backlog_seconds",
            "Expected prefill work sent to the worker and not yet at first token (sum of means).",
            labels=["worker"],
        )
        for worker, seconds in list(p._backlog.items()):
            backlog.add_metric([worker], seconds)
        yield from (info, fallback, changes, coverage, regimes, observed, queued, backlog)


class _DispatchCollector(Collector):
    """The gateway's request queue (step 6, every dispatch policy), read at scrape time:
    requests waiting for a worker with room, per configured pool (a request waiting on
    several pools counts in each)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.dispatcher: Any = None

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "fleetgate_dispatch_queue_length",
            "Requests waiting in the gateway for a worker with room, per pool.",
            labels=["pool"],
        )
        d = self.dispatcher
        if d is not None:
            for pool in list(self.fleet.pool_configs):
                depth.add_metric([pool], d.waiting(pool))
        yield depth


class TenancySource(Protocol):
    """What the token-pool metrics read (gateway/tenancy.py's `Tenancy`)."""

    def snapshot(self) -> list[PoolView]: ...

    @property
    def demands(self) -> Mapping[str, Any]: ...

    @property
    def store(self) -> Any: ...


class _TenancyCollector(Collector):
    """Per entitlement and class, from the store's view (with Redis: the same figures on
    every replica — aggregate with max, not sum), and per pool the capacity demand the
    autoscaler reads. Empty families without token pools."""

    source: TenancySource | None = None

    def collect(self) -> Iterator[Metric]:
        ent_labels = ["entitlement", "class", "pool"]

        def ent_gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=ent_labels)

        in_flight = ent_gauge(
            "fleetgate_entitlement_in_flight", "Requests of the entitlement holding a slot."
        )
        kv = ent_gauge("fleetgate_entitlement_kv_bytes", "KV-cache bytes the entitlement holds.")
        debt = ent_gauge("fleetgate_entitlement_debt", "Fairness debt d_e (Eq. 2).")
        burst = ent_gauge("fleetgate_entitlement_burst", "Burst b_e above baseline (Eq. 3).")
        prio = ent_gauge("fleetgate_entitlement_priority", "Admission priority w_e (Eq. 1).")
        threshold = GaugeMetricFamily(
            "fleetgate_pool_admission_threshold",
            "The lowest priority among admitted requests (-1: none admitted).",
            labels=["pool"],
        )
        res = ["pool", "resource"]
        capacity = GaugeMetricFamily(
            "fleetgate_pool_capacity",
            "A token pool's capacity, by resource (tokens_per_s, kv_bytes, slots).",
            labels=res,
        )
        promised = GaugeMetricFamily(
            "fleetgate_pool_capacity_promised",
            "Σ baselines of the pool's bound entitlements, by resource.",
            labels=res,
        )
        demand = GaugeMetricFamily(
            "fleetgate_pool_capacity_demand",
            "Promised capacity plus the observed demand above baselines (bursts, refused "
            "work), by resource: the autoscaler's target (KEDA/HPA).",
            labels=res,
        )
        breaker = GaugeMetricFamily(
            "fleetgate_entitlement_store_breaker_open",
            "1 while the entitlement store's circuit breaker is open (Redis unreachable).",
        )
        transitions = CounterMetricFamily(
            "fleetgate_entitlement_store_breaker_transitions",
            "Times the entitlement store's breaker changed state (one log line each).",
        )
        # ledger23 (issue 23): the Redis store's degraded mode
        degraded = CounterMetricFamily(
            "fleetgate_entitlement_store_degraded_admissions",
            "Requests this replica admitted on its local share while Redis was away.",
        )
        share = GaugeMetricFamily(
            "fleetgate_entitlement_store_share_divisor",
            "n: while Redis is away this replica admits at most limit / n of each limit.",
        )
        src = self.source
        if src is not None:
            for view in src.snapshot():
                threshold.add_metric(
                    [view.pool], -1.0 if view.threshold is None else view.threshold
                )
                for u in view.entitlements:
                    e = u.definition
                    lv = [e.name, e.service_class.value, view.pool]
                    in_flight.add_metric(lv, u.in_flight)
                    kv.add_metric(lv, u.kv)
                    debt.add_metric(lv, u.debt)
                    burst.add_metric(lv, u.burst)
                    prio.add_metric(lv, u.priority)
            for pool, d in src.demands.items():
                for name, fam in (
                    ("capacity", capacity),
                    ("promised", promised),
                    ("demand", demand),
                ):
                    for resource, value in getattr(d, name).items():
                        fam.add_metric([pool, resource], value)
            store = src.store
            if store is not None:
                breaker.add_metric([], 1.0 if store.breaker.state == "open" else 0.0)
                transitions.add_metric([], store.breaker.transitions)
                degraded.add_metric([], getattr(store, "degraded_admissions", 0))
                share.add_metric([], getattr(store, "share", 1))
        yield from (in_flight, kv, debt, burst, prio, threshold, capacity, promised, demand)
        yield from (breaker, transitions, degraded, share)


# Per-request updates on children bound once (a series of the proxy's hot path). The
# library's `Counter.inc` and `Histogram.observe` check on every call what a bound child
# always satisfies (it is observable; our amounts are not negative) and walk the buckets
# one by one: skipping that saves ~5 % of a request's Python bytecode. These update
# the same values as prometheus_client does: the exposition is the library's
# (tests/unit/gateway/test_fast_metrics.py holds the two equal).
#
# The values' lock is skipped too (`_adder`): every update through these classes runs on
# the event loop's thread (the per-pool, per-model and requests series, updated by the
# driver: gateway/forward.py, gateway/settle.py), so no other writer can interleave with
# the `+=`, and a reader (the exposition) reads one float. Taking and releasing the lock
# was ~40 % of an update's instructions, ten updates a request.
def _adder(value: object) -> Callable[[float], None] | None:
    """`value.inc` without its lock, for the library's in-process value class; None for
    any other (multiprocess mode's file-backed values keep their own `inc`)."""
    if type(value) is not MutexValue:
        return None
    v: Any = value

    def add(amount: float) -> None:
        v._value += amount

    return add


class FastCounter:
    """A bound counter child's `inc(amount)`: the child's value, added to (on the event
    loop's thread only). Amounts must not be negative (the callers' counts and tokens
    never are)."""

    __slots__ = ("inc",)

    def __init__(self, child: Counter) -> None:
        value = getattr(child, "_value", None)
        add = _adder(value) or getattr(value, "inc", None)
        self.inc: Callable[[float], None] = add if callable(add) else child.inc


class FastHistogram:
    """A bound histogram child's `observe(amount)`: its sum, and the one bucket the
    amount falls in (found by bisection), as prometheus_client adds them."""

    __slots__ = ("_bounds", "_buckets", "_sum", "observe")

    def __init__(self, child: Histogram) -> None:
        total = getattr(child, "_sum", None)
        bounds = getattr(child, "_upper_bounds", None)
        buckets = getattr(child, "_buckets", None)
        if total is None or not isinstance(bounds, list) or not isinstance(buckets, list):
            self.observe: Callable[[float], None] = child.observe  # another library version
            return
        self._sum = _adder(total) or total.inc
        self._bounds: list[float] = bounds
        self._buckets: list[Callable[[float], None]] = [_adder(b) or b.inc for b in buckets]
        self.observe = self._observe

    def _observe(self, amount: float) -> None:
        self._sum(amount)
        # the first bucket whose upper bound is ≥ amount (the last bound is +Inf)
        i = bisect_left(self._bounds, amount)
        if i < len(self._buckets):  # (NaN: no bucket, as the library does)
            self._buckets[i](1.0)


@dataclass(frozen=True, slots=True)
class PoolSeries:
    ttft: FastHistogram
    latency: FastHistogram
    overhead: FastHistogram
    prompt_tokens: FastCounter
    completion_tokens: FastCounter


@dataclass(frozen=True, slots=True)
class ModelSeries:
    ttft: FastHistogram
    prompt_tokens: FastCounter
    completion_tokens: FastCounter


@dataclass(frozen=True, slots=True)
class SettledSeries:
    """What one settled request updates (`GatewayMetrics.count_settled`): the requests
    counters' `inc` (None for a 499, which is not counted) and, for a 200, the pool's and
    the model's series."""

    requests: Callable[[float], None] | None
    model_requests: Callable[[float], None] | None
    pool: PoolSeries | None
    model: ModelSeries | None


class GatewayMetrics:
    def __init__(self, fleet: Fleet, now: Callable[[], float]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "fleetgate_requests",
            "Requests answered, by pool and HTTP status.",
            ["pool", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "fleetgate_time_to_first_token_seconds",
            "Time from arrival to the first streamed token (streaming requests).",
            ["pool"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "fleetgate_request_duration_seconds",
            "Time from arrival to the last byte of the answer.",
            ["pool"],
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "fleetgate_gateway_overhead_seconds",
            "Gateway time before the request was sent upstream (parse, place, route).",
            ["pool"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "fleetgate_prompt_tokens",
            "Prompt tokens, as the engines counted them.",
            ["pool"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "fleetgate_completion_tokens",
            "Completion tokens, as the engines counted them.",
            ["pool"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "fleetgate_upstream_errors",
            "Failed upstream attempts, by kind (connect, connect_timeout, reset, first_byte_timeout, idle_timeout, protocol, http_5xx).",
            ["pool", "worker", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "fleetgate_upstream_retries",
            "Requests retried on another worker after a connect failure.",
            ["pool"],
            registry=r,
        )
        self.context_retries = Counter(
            "fleetgate_context_retries",
            "Requests an engine refused for its context length, sent again uncompressed to a "
            "pool with a longer context (by the refusing pool).",
            ["pool"],
            registry=r,
        )
        self.spills = Counter(
            "fleetgate_pool_spills",
            "Requests served by a larger pool because every worker of the chosen pool was down.",
            ["pool"],
            registry=r,
        )
        self.disconnects = Counter(
            "fleetgate_client_disconnects",
            "Requests whose client went away before the answer was complete.",
            ["pool"],
            registry=r,
        )
        self.queue_waits = Counter(
            "fleetgate_dispatch_waits",
            "Requests that found every worker of their pools at capacity and waited for room.",
            registry=r,
        )
        self.dp_pool_wait = Histogram(
            "fleetgate_dp_pool_wait_seconds",
            "Arrival to assignment of a request to a data-parallel rank (its wait in the"
            " dp_group's holding pool, admission included).",
            ["pool"],
            buckets=POOL_WAIT_BUCKETS,
            registry=r,
        )
        self.queue_wait_seconds = Histogram(
            "fleetgate_dispatch_wait_seconds",
            "How long a request waited for a worker with room.",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=r,
        )
        self.dispatch_refused = Counter(
            "fleetgate_dispatch_refused",
            "Requests the request queue refused: queue_full (429, dispatch.max_waiting) or "
            "queue_timeout (503, no room within dispatch.timeout_s).",
            ["reason"],
            registry=r,
        )
        self.scrape_errors = Counter(
            "fleetgate_telemetry_scrape_errors",
            "Failed /metrics scrapes, by reason.",
            ["worker", "reason"],
            registry=r,
        )
        self.health_failures = Counter(
            "fleetgate_health_check_failures",
            "Failed active health checks.",
            ["worker"],
            registry=r,
        )
        self.request_log_dropped = Counter(
            "fleetgate_request_log_dropped",
            "Request-log entries not written, by reason (queue_full, write_error, closed).",
            ["reason"],
            registry=r,
        )
        self.circuit_opens = Counter(
            "fleetgate_circuit_opens",
            "Times a worker's circuit breaker opened.",
            ["worker"],
            registry=r,
        )
        self.compress_borderline = Counter(
            "fleetgate_compress_borderline",
            "Requests in the Compress-and-Route band (B_short < L_total ≤ γ·B_short).",
            registry=r,
        )
        self.compress_compressed = Counter(
            "fleetgate_compress_compressed",
            "Requests compressed to fit the short pool.",
            registry=r,
        )
        self.compress_fallback = Counter(
            "fleetgate_compress_fallback",
            "Requests that could not be made to fit the short pool and went to a larger pool.",
            registry=r,
        )
        self.compress_tokens_removed = Counter(
            "fleetgate_compress_tokens_removed",
            "Prompt tokens removed by compression (exact cl100k counts).",
            registry=r,
        )
        self.compress_uncertain = Counter(
            "fleetgate_compress_uncertain",
            "Requests the byte estimate could not place (their bytes-per-token interval holds "
            "B_short or γ·B_short): counted exactly before placement was decided.",
            registry=r,
        )
        self.compress_seconds = Histogram(
            "fleetgate_compress_duration_seconds",
            "Time spent counting and compressing one request.",
            buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1),
            registry=r,
        )
        self.tokenizer_info = Gauge(
            "fleetgate_tokenizer_info",
            "1 for the counter each pool's prompts are counted with, found at start "
            "(source: engine = the worker's /tokenize, engine_prompt = only its prompt form, "
            "chats counted locally; hf = the configured tokenizer folder; cl100k).",
            ["pool", "source"],
            registry=r,
        )
        self.tokenize_requests = Counter(
            "fleetgate_tokenize_requests",
            "Prompt counts asked of a worker's /tokenize (pools with tokenizer: engine), by "
            "result (ok; timeout, error, unsupported: counted locally instead).",
            ["pool", "result"],
            registry=r,
        )
        self.discovery_events = Counter(
            "fleetgate_discovery_events",
            "Kubernetes discovery (pools.<name>.discovery), by event: list (EndpointSlices "
            "listed), gone (410: listed again), error (the API or the network failed), applied "
            "(the pool's workers changed), refused (the fleet refused the change).",
            ["pool", "event"],
            registry=r,
        )
        self.config_reloads = Counter(
            "fleetgate_config_reloads",
            "Configuration reloads (SIGHUP, file change, POST /admin/reload), by result (ok, error).",
            ["result"],
            registry=r,
        )
        ent = ["entitlement", "class", "pool"]
        self.admitted = Counter(
            "fleetgate_admission_admitted",
            "Requests admitted on a token-pool entitlement.",
            ent,
            registry=r,
        )
        self.refused = Counter(
            "fleetgate_admission_refused",
            "Requests refused by admission, by the refusing check (concurrency, token_budget, "
            "kv_bytes, pool_contention, entitlement_state, store_unavailable, ...).",
            [*ent, "reason"],
            registry=r,
        )
        self.evictions = Counter(
            "fleetgate_evictions",
            "In-flight requests of a preemptible entitlement cancelled (error code "
            "`preempted`) because a protected class was admitted in their place.",
            ent,
            registry=r,
        )
        self.entitlement_tokens = Counter(
            "fleetgate_entitlement_tokens",
            "Tokens (prompt + completion, the engines' counts) served on an entitlement.",
            ent,
            registry=r,
        )
        # per model (issue 29): the label is a model some configured pool serves, anything
        # else "other", so a client cannot mint label values (bounded by the configuration)
        self.model_requests = Counter(
            "fleetgate_model_requests",
            "Requests answered, by requested model (a configured model, else other) and status.",
            ["model", "status"],
            registry=r,
        )
        self.model_ttft = Histogram(
            "fleetgate_model_time_to_first_token_seconds",
            "Time from arrival to the first streamed token, by requested model.",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.model_prompt_tokens = Counter(
            "fleetgate_model_prompt_tokens",
            "Prompt tokens, as the engines counted them, by requested model.",
            ["model"],
            registry=r,
        )
        self.model_completion_tokens = Counter(
            "fleetgate_model_completion_tokens",
            "Completion tokens, as the engines counted them, by requested model.",
            ["model"],
            registry=r,
        )
        self._fleet = fleet
        self._model_children: dict[tuple[str, int], FastCounter] = {}
        self._models: dict[str, ModelSeries] = {}
        r.register(_FleetCollector(fleet, now))
        self._dispatch = _DispatchCollector(fleet)
        r.register(self._dispatch)
        self.tenancy = _TenancyCollector()
        r.register(self.tenancy)
        self._requests_children: dict[tuple[str, int], FastCounter] = {}
        self._pools: dict[str, PoolSeries] = {}
        # (entitlement, class, pool) → its admitted / tokens children; + reason → refused
        self._admitted: dict[tuple[str, str, str], Counter] = {}
        self._tokens: dict[tuple[str, str, str], Counter] = {}
        self._refused: dict[tuple[str, str, str, str], Counter] = {}
        # (pool, model label, status) → every series a settled request updates, bound once
        self._settled: dict[tuple[str, str, int], SettledSeries] = {}

    def count_settled(
        self,
        pool: str,
        model: str | None,
        status: int,
        latency: float,
        ttft: float | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """One settled request, on every series `count_request`, `count_model` and the
        pool's answered-request series update (the same values), through one lookup: the
        children are bound once per (pool, model label, status)."""
        label = model if model is not None and model in self._fleet.models else "other"
        key = (pool, label, status)
        s = self._settled.get(key)
        if s is None:
            s = self._settled[key] = self._bind_settled(pool, label, status)
        requests, model_requests = s.requests, s.model_requests
        if requests is None or model_requests is None:
            return  # 499: the client left, not an answer
        requests(1.0)
        model_requests(1.0)
        by_pool, by_model = s.pool, s.model
        if by_pool is None or by_model is None:
            return  # not a 200: no latency, TTFT or tokens
        by_pool.latency.observe(latency)
        if ttft is not None:
            by_pool.ttft.observe(ttft)
            by_model.ttft.observe(ttft)
        if prompt_tokens > 0:
            by_pool.prompt_tokens.inc(prompt_tokens)
            by_model.prompt_tokens.inc(prompt_tokens)
        if completion_tokens > 0:
            by_pool.completion_tokens.inc(completion_tokens)
            by_model.completion_tokens.inc(completion_tokens)

    def _bind_settled(self, pool: str, label: str, status: int) -> SettledSeries:
        if status == 499:
            return SettledSeries(None, None, None, None)
        requests = self._requests_children.get((pool, status))
        if requests is None:
            requests = self._requests_children[(pool, status)] = FastCounter(
                self.requests.labels(pool, str(status))
            )
        model_requests = self._model_children.get((label, status))
        if model_requests is None:
            model_requests = self._model_children[(label, status)] = FastCounter(
                self.model_requests.labels(label, str(status))
            )
        if status != 200:
            return SettledSeries(requests.inc, model_requests.inc, None, None)
        return SettledSeries(
            requests.inc, model_requests.inc, self.pool(pool), self._model_series(label)
        )

    def _model_series(self, label: str) -> ModelSeries:
        series = self._models.get(label)
        if series is None:
            series = self._models[label] = ModelSeries(
                FastHistogram(self.model_ttft.labels(label)),
                FastCounter(self.model_prompt_tokens.labels(label)),
                FastCounter(self.model_completion_tokens.labels(label)),
            )
        return series

    def count_request(self, pool: str, status: int) -> None:
        child = self._requests_children.get((pool, status))
        if child is None:
            child = self._requests_children[(pool, status)] = FastCounter(
                self.requests.labels(pool, str(status))
            )
        child.inc(1.0)

    # per entitlement (token pools): children bound once per label set, as `pool` does
    # (labels are (entitlement, class, pool): an entitlement changed at run time to
    # another class gets its own)
    def count_admitted(self, labels: tuple[str, str, str]) -> None:
        child = self._admitted.get(labels)
        if child is None:
            child = self._admitted[labels] = self.admitted.labels(*labels)
        child.inc()

    def count_refused(self, labels: tuple[str, str, str], reason: str) -> None:
        key = (*labels, reason)
        child = self._refused.get(key)
        if child is None:
            child = self._refused[key] = self.refused.labels(*key)
        child.inc()

    def count_entitlement_tokens(self, labels: tuple[str, str, str], tokens: int) -> None:
        child = self._tokens.get(labels)
        if child is None:
            child = self._tokens[labels] = self.entitlement_tokens.labels(*labels)
        child.inc(tokens)

    def count_model(
        self,
        model: str | None,
        status: int,
        ttft: float | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """One settled request on the per-model series (a client gone, 499, is not
        counted, as for `count_request`; TTFT and tokens of answered requests only)."""
        if status == 499:
            return
        label = model if model is not None and model in self._fleet.models else "other"
        child = self._model_children.get((label, status))
        if child is None:
            child = self._model_children[(label, status)] = FastCounter(
                self.model_requests.labels(label, str(status))
            )
        child.inc(1.0)
        if status != 200:
            return
        series = self._model_series(label)
        if ttft is not None:
            series.ttft.observe(ttft)
        if prompt_tokens > 0:
            series.prompt_tokens.inc(prompt_tokens)
        if completion_tokens > 0:
            series.completion_tokens.inc(completion_tokens)

    def pool(self, name: str) -> PoolSeries:
        """The per-pool series, bound once (a `labels()` lookup costs more than the update)."""
        series = self._pools.get(name)
        if series is None:
            series = self._pools[name] = PoolSeries(
                FastHistogram(self.ttft.labels(name)),
                FastHistogram(self.latency.labels(name)),
                FastHistogram(self.overhead.labels(name)),
                FastCounter(self.prompt_tokens.labels(name)),
                FastCounter(self.completion_tokens.labels(name)),
            )
        return series

    def watch_dispatch(self, dispatcher: Any) -> None:
        """The request queue whose length `fleetgate_dispatch_queue_length` reports."""
        self._dispatch.dispatcher = dispatcher

    def watch_quartz(self, predictor: Predictor, dispatcher: Any) -> None:
        """QUARTZ is configured: its collector, and predicted-vs-observed prefill."""
        self.registry.register(_QuartzCollector(predictor, dispatcher))
        self._quartz_ratio = Histogram(
            "fleetgate_quartz_prefill_ratio",
            "Observed prefill time over the calibrated predicted alpha-quantile.",
            buckets=(0.125, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0, 4.0, 8.0),
            registry=self.registry,
        )
        self._quartz_prefill = Histogram(
            "fleetgate_quartz_prefill_seconds",
            "Observed prefill time: dispatch to a worker until its first token.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self._quartz_alpha = predictor.alpha

    def quartz_observed(self, prefill_s: float, predicted: Quantiles) -> None:
        q = predicted.q95 if self._quartz_alpha == 0.95 else predicted.q90
        if q > 0:
            self._quartz_ratio.observe(prefill_s / q)
        self._quartz_prefill.observe(prefill_s)

    def watch_dp_groups(
        self, groups: Mapping[str, DpGroup], clock: Callable[[], float] | None = None
    ) -> None:
        """The dp_group pools' per-rank series (gateway/metrics_dp.py); declared, without
        samples, when there is none. `clock`: the core's, to read loads at."""
        self.registry.register(DpGroupCollector(groups, clock))

    def watch_budget(self, estimator: BudgetEstimator) -> None:
        """Expose ĉ_k, the learnt bytes per token of each content category."""
        self.registry.register(_BudgetCollector(estimator))

    # FleetListener: a removed worker's label sets stop being exported
    def worker_added(self, worker: WorkerState) -> None:
        pass

    def worker_removed(self, worker: WorkerState) -> None:
        for counter, position in (
            (self.upstream_errors, 1),
            (self.scrape_errors, 0),
            (self.health_failures, 0),
            (self.circuit_opens, 0),
        ):
            # prometheus_client lists a metric's children only in its private `_metrics`
            for labels in [k for k in list(counter._metrics) if k[position] == worker.id]:
                counter.remove(*labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
