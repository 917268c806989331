"""What a run remembers: one record per request, and time series sampled at a fixed period.

Per request: arrival (at the gateway), dispatch (to a worker), scheduled (the engine first
admitted it to its running batch), first token and finish times, token counts, status.
From these: TTFT = first_token − arrival; queue wait = scheduled − arrival (gateway plus
engine waiting queue); TPOT = (finish − first_token)/(completion − 1); latency =
finish − arrival.

Per pool, every `interval` virtual seconds (`Sampler`):
- utilisation over the window: Δ(Σ batch_size·duration)/(n · max_num_seqs · Δt), the
  slot-time busy fraction, with a step straddling a sampling instant split between the
  two windows;
- requests running and waiting in the engines, and in flight at the gateway;
- token-load imbalance across the pool's workers at the sampling instant, from
  L_g = KV-resident tokens of worker g (the load BF-IO balances, "A Universal Load
  Balancing Principle", Eq. 2): Imbalance = G·max_g L_g − Σ_g L_g, reported normalised as
  1 − mean/max (the fraction of a barrier-synchronised step the other workers would
  idle); samples where every worker is empty are skipped.
and fleet-wide the output tokens delivered in the window (throughput).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from policies.quantile.features import Quantiles
from simulator.cluster import Cluster
from simulator.kernel import PRIO_SAMPLE, Kernel
from simulator.workloads import RequestSpec


class RequestRecord:
    __slots__ = (
        "arrival",
        "attempt",
        "cached_tokens",
        "client",
        "completion_tokens",
        "compressed_to",
        "dispatch",
        "features",
        "finish",
        "first_arrival",
        "first_token",
        "id",
        "output_tokens",
        "pool",
        "predicted",
        "preemptions",
        "prefill_s",
        "prompt_tokens",
        "refusal",
        "refusal_reason",
        "scheduled",
        "slo_class",
        "status",
        "worker",
    )

    def __init__(self, spec: RequestSpec, now: float) -> None:
        self.id = spec.id
        self.client = spec.client
        self.slo_class = spec.slo_class
        self.prompt_tokens = spec.prompt_tokens
        self.output_tokens = spec.output_tokens
        self.arrival = now
        self.attempt = spec.attempt  # 1, or a client's retry of a refused request
        # when the request's first attempt arrived (its own arrival unless a retry)
        self.first_arrival = now if spec.first_arrival is None else spec.first_arrival
        self.pool: str | None = None
        self.worker: str | None = None
        self.compressed_to: int | None = None  # prompt tokens sent, when compressed
        self.dispatch: float | None = None
        self.scheduled: float | None = None
        self.first_token: float | None = None
        self.finish: float | None = None
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.preemptions = 0
        self.status = "pending"
        self.refusal: str | None = None  # an admission refusal's code (the refusing check)
        self.refusal_reason: str | None = None  # ... and its message
        # QUARTZ (when the run has a predictor): the feature vector at dispatch for the
        # worker chosen (policies/quantile/features.py FEATURES), the calibrated predicted
        # prefill quantiles routing used, and the observed prefill (first token − dispatch)
        self.features: list[float] | None = None
        self.predicted: Quantiles | None = None
        self.prefill_s: float | None = None


class Recorder:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def new(self, spec: RequestSpec, now: float) -> RequestRecord:
        r = RequestRecord(spec, now)
        self.records.append(r)
        return r


@dataclass
class PoolSeries:
    utilisation: list[float] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    imbalance: list[float | None] = field(default_factory=list)


@dataclass
class Series:
    interval: float
    t: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    pools: dict[str, PoolSeries] = field(default_factory=dict)


class Sampler:
    """Samples the fleet every `interval` virtual seconds while anything is left to happen."""

    def __init__(
        self,
        kernel: Kernel,
        cluster: Cluster,
        interval: float,
        active: Callable[[], bool],
        probe: Callable[[float], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("sample interval must be positive")
        self.kernel = kernel
        self.cluster = cluster
        self.active = active
        self.probe = probe  # also called at every sampling instant (run.py `probe`)
        self.series = Series(interval, pools={p: PoolSeries() for p in cluster.pools})
        self._last_slot = {p: 0.0 for p in cluster.pools}
        self._last_tokens = 0
        kernel.after(interval, PRIO_SAMPLE, self._sample)

    def _sample(self, _: object) -> None:
        s = self.series
        s.t.append(self.kernel.now())
        tokens = 0
        for name, workers in self.cluster.pools.items():
            ps = s.pools[name]
            now = self.kernel.now()
            slot = sum(w.slot_seconds_at(now) for w in workers)
            capacity = sum(w.config.max_num_seqs for w in workers) * s.interval
            ps.utilisation.append((slot - self._last_slot[name]) / capacity if capacity else 0.0)
            self._last_slot[name] = slot
            running = waiting = in_flight = 0
            loads = []
            for w in workers:
                running += w.engine.num_running
                waiting += w.engine.num_waiting
                in_flight += w.view.in_flight
                loads.append(w.kv_tokens())
                tokens += w.tokens_out
            ps.running.append(running)
            ps.waiting.append(waiting)
            ps.in_flight.append(in_flight)
            peak = max(loads) if loads else 0.0
            ps.imbalance.append(1.0 - (sum(loads) / len(loads)) / peak if peak > 0 else None)
        s.tokens_per_s.append((tokens - self._last_tokens) / s.interval)
        self._last_tokens = tokens
        if self.probe is not None:
            self.probe(self.kernel.now())
        if self.active():
            self.kernel.after(s.interval, PRIO_SAMPLE, self._sample)
