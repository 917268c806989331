"""kv_cost whose (τ, ω) follow the pool's saturation regime ("The Price of Anarchy in
Disaggregated Inference", §6.3, Table 2; docs/CACHE_ROUTING.md).

| regime     | τ   | ω   |                                                          |
|------------|-----|-----|----------------------------------------------------------|
| Below      | 0   | 1.0 | exploit cache locality                                   |
| Transition | 0.7 | 1.0 | the paper's 70B 1P/5D sweep optimum, reused everywhere   |
| Saturated  | 0.8 | 0.1 | conjectural: never triggered in the paper's experiments  |

The regime is a `SaturationDetector` (policies/saturation.py) fed by this gateway's own
TTFTs — arrival to first token, queueing in the gateway included — through `TtftSampler`,
a core hook counting only requests dispatched to this router's pool. The switch happens
in-process, at the first decision after the regime changes (the paper's experiments
switched frontends instead, stranding in-flight requests on the old one).

`hooks()` is what a composition root attaches to the core: the sampler and the kv_cost
state (policies/routing/kv_state.py). Until then the detector hears nothing and the router
is kv_cost at the Below row. `regime`, `temperature`, `overlap_weight` and `decisions` are
there for the gauges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.hooks import Hook
from policies.protocols.routing import register
from policies.registry import config_from
from policies.routing.kv_cost import KvCostConfig, KvCostRouter
from policies.routing.kv_state import PER_REQUEST, CacheConfig, KvState
from policies.saturation import DetectorConfig, Regime, SaturationDetector
from policies.types import Outcome, RequestInfo, WorkerView

TABLE_2: dict[Regime, tuple[float, float]] = {
    Regime.BELOW: (0.0, 1.0),
    Regime.TRANSITION: (0.7, 1.0),
    Regime.SATURATED: (0.8, 0.1),
}


@dataclass(slots=True)
class TtftSampler:
    """A core hook: TTFT (arrival → first token) of the requests dispatched to this pool's
    workers, into the detector; every event also closes the detector's due intervals."""

    detector: SaturationDetector
    state: KvState  # its `seen` workers are this pool's
    max_pending: int = 100_000  # arrivals awaiting a first token, at most (memory bound)
    _arrived: dict[str, float] = field(default_factory=dict)
    _ours: set[str] = field(default_factory=set)

    def on_arrival(self, request: RequestInfo, now: float) -> None:
        pending = self._arrived
        if len(pending) >= self.max_pending:  # a lost completion must not leak
            gone = next(iter(pending))
            del pending[gone]
            self._ours.discard(gone)
        pending[request.id] = now
        self.detector.advance(now)

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        if self.state.knows(worker):
            self._ours.add(request.id)
        else:
            self._ours.discard(request.id)
        self.detector.advance(now)

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        t0 = self._arrived.pop(request.id, None)
        if request.id in self._ours and t0 is not None:
            self.detector.observe(now - t0, now)
        else:
            self.detector.advance(now)

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self._arrived.pop(request.id, None)
        self._ours.discard(request.id)
        self.detector.advance(now)


def table_row(name: str, value: Any) -> tuple[float, float]:
    try:
        tau, omega = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be [τ, ω]") from None
    if not (0.0 <= tau < float("inf") and 0.0 <= omega < float("inf")):
        raise ValueError(f"{name}: τ and ω must be finite and >= 0")
    return tau, omega


@dataclass(frozen=True, slots=True)
class RegimeAdaptiveConfig(CacheConfig):
    below: Sequence[float] = TABLE_2[Regime.BELOW]  # [τ, ω] per regime (Table 2)
    transition: Sequence[float] = TABLE_2[Regime.TRANSITION]
    saturated: Sequence[float] = TABLE_2[Regime.SATURATED]
    normalise: str = "range"
    seed: int = 0
    detector: Mapping[str, Any] | None = None  # DetectorConfig's parameters

    def __post_init__(self) -> None:
        CacheConfig.__post_init__(self)
        for name in ("below", "transition", "saturated"):
            object.__setattr__(self, name, table_row(name, getattr(self, name)))
        try:
            config_from(DetectorConfig, self.detector or {})
        except (TypeError, ValueError) as exc:
            raise ValueError(f"detector: {exc}") from None

    def table(self) -> dict[Regime, tuple[float, float]]:
        return {
            Regime.BELOW: table_row("below", self.below),
            Regime.TRANSITION: table_row("transition", self.transition),
            Regime.SATURATED: table_row("saturated", self.saturated),
        }

    def detector_config(self) -> DetectorConfig:
        config: DetectorConfig = config_from(DetectorConfig, self.detector or {})
        return config


@dataclass(slots=True)
class RegimeAdaptiveRouter:
    request_fields: ClassVar[tuple[str, ...]] = PER_REQUEST
    config: RegimeAdaptiveConfig
    name: str = "regime_adaptive"
    decisions: int = 0
    inner: KvCostRouter = field(init=False)
    detector: SaturationDetector = field(init=False)
    sampler: TtftSampler = field(init=False)
    _table: dict[Regime, tuple[float, float]] = field(init=False)
    _applied: Regime = Regime.BELOW

    def __post_init__(self) -> None:
        c = self.config
        self._table = c.table()
        tau, omega = self._table[Regime.BELOW]
        inner = KvCostConfig(
            block_size=c.block_size,
            hash_block_tokens=c.hash_block_tokens,
            ttl_s=c.ttl_s,
            max_blocks=c.max_blocks,
            temperature=tau,
            overlap_weight=omega,
            normalise=c.normalise,
            seed=c.seed,
        )
        self.inner = KvCostRouter(inner, name=self.name)
        self.detector = SaturationDetector(c.detector_config())
        self.sampler = TtftSampler(self.detector, self.inner.state)

    def hooks(self) -> tuple[Hook, ...]:
        """What the composition root attaches to the core (both drivers)."""
        return (self.inner.state, self.sampler)

    @property
    def state(self) -> KvState:
        """The kv_cost state (index, active blocks) the hooks keep."""
        return self.inner.state

    @property
    def regime(self) -> Regime:
        return self._applied

    @property
    def temperature(self) -> float:
        return self.inner.picker.temperature

    @property
    def overlap_weight(self) -> float:
        return self.inner.cost.overlap_weight

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        regime = self.detector.regime
        if regime is not self._applied:
            self.inner.set_params(*self._table[regime])
            self._applied = regime
        self.decisions += 1
        return self.inner.choose(request, candidates)


NAME = "regime_adaptive"


@register(NAME)
def _factory(params: Mapping[str, Any]) -> RegimeAdaptiveRouter:
    return RegimeAdaptiveRouter(config_from(RegimeAdaptiveConfig, params))
