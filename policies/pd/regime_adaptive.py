"""`kv_cost_decode` whose (τ, ω) follow the pool's saturation regime ("The Price of Anarchy
in Disaggregated Inference", §6.3, Table 2): the paper's adaptive router for a `pd` pool,
where its routing game is played among the decode workers.

| regime     | τ   | ω   |
|------------|-----|-----|
| Below      | 0   | 1.0 |
| Transition | 0.7 | 1.0 |
| Saturated  | 0.8 | 0.1 |

The regime is a `SaturationDetector` (policies/saturation.py) fed by `PairTtftSampler`: the
TTFT (arrival → first token at the gateway: the gateway's queue, the prefill's queue and
compute, the KV's transfer and the decode's first step) of every request this pool paired.
The aggregated pools' `TtftSampler` (policies/routing/regime_adaptive.py) keeps the
requests dispatched to a worker its router has seen; for a pair the core's `on_dispatch`
names the prefill worker, which a decode-side router never sees, so it would hear nothing.
The pair sampler hears the pool's own `on_pair` instead (policies/hooks.py `PairHook`).

The switch happens in-process at the first decision after the regime changes. `hooks()`:
the sampler and the decode side's KV state (policies/pd/pair_state.py); policies/build.py
attaches both. `regime`, `temperature`, `overlap_weight` are there for gauges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.hooks import Hook
from policies.pd.kv_cost_decode import KvCostDecode, KvCostDecodeConfig
from policies.protocols.pairs import config_from, register
from policies.routing.kv_state import PER_REQUEST, KvState
from policies.routing.regime_adaptive import TABLE_2, table_row
from policies.saturation import DetectorConfig, Regime, SaturationDetector
from policies.types import Outcome, RequestInfo, WorkerView

NAME = "regime_adaptive"


@dataclass(slots=True)
class PairTtftSampler:
    """TTFTs of one `pd` pool's requests into the detector (a `Hook` and a `PairHook`):
    a request is the pool's from its `on_pair` on (its arrival is `RequestInfo.arrival`);
    every event also closes the detector's due intervals."""

    detector: SaturationDetector
    max_pending: int = 100_000  # paired requests awaiting a first token (memory bound)
    _paired: dict[str, float] = field(default_factory=dict)  # request → arrival

    def on_pair(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        pending = self._paired
        if request.id not in pending and len(pending) >= self.max_pending:
            del pending[next(iter(pending))]  # a lost completion must not leak
        pending[request.id] = request.arrival
        self.detector.advance(now)

    def on_handoff(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        self.detector.advance(now)

    def on_arrival(self, request: RequestInfo, now: float) -> None:
        self.detector.advance(now)

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        return None  # `on_pair` follows for this pool's requests

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        t0 = self._paired.pop(request.id, None)
        if t0 is not None:
            self.detector.observe(now - t0, now)
        else:
            self.detector.advance(now)

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self._paired.pop(request.id, None)
        self.detector.advance(now)


@dataclass(frozen=True, slots=True)
class RegimeAdaptivePairsConfig:
    below: Sequence[float] = TABLE_2[Regime.BELOW]  # [τ, ω] of the decode choice
    transition: Sequence[float] = TABLE_2[Regime.TRANSITION]
    saturated: Sequence[float] = TABLE_2[Regime.SATURATED]
    block_size: int = 16
    seed: int = 0
    detector: Mapping[str, Any] | None = None  # DetectorConfig's parameters
    output_blocks: bool = True  # kv_cost_decode's: the decode load counts output blocks

    def __post_init__(self) -> None:
        for name in ("below", "transition", "saturated"):
            object.__setattr__(self, name, table_row(name, getattr(self, name)))
        if self.block_size < 1:
            raise ValueError("block_size: must be >= 1")
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


@dataclass(slots=True)
class RegimeAdaptivePairs:
    request_fields: ClassVar[tuple[str, ...]] = PER_REQUEST
    config: RegimeAdaptivePairsConfig = field(default_factory=RegimeAdaptivePairsConfig)
    name: str = NAME
    decisions: int = 0
    inner: KvCostDecode = field(init=False)
    detector: SaturationDetector = field(init=False)
    sampler: PairTtftSampler = field(init=False)
    _table: dict[Regime, tuple[float, float]] = field(init=False)
    _applied: Regime = Regime.BELOW

    def __post_init__(self) -> None:
        c = self.config
        self._table = c.table()
        tau, omega = self._table[Regime.BELOW]
        self.inner = KvCostDecode(
            KvCostDecodeConfig(tau, omega, c.block_size, c.seed, c.output_blocks)
        )
        detector: DetectorConfig = config_from(DetectorConfig, c.detector or {})
        self.detector = SaturationDetector(detector)
        self.sampler = PairTtftSampler(self.detector)

    def hooks(self) -> tuple[Hook, ...]:
        return (*self.inner.hooks(), self.sampler)

    @property
    def state(self) -> KvState:
        """The decode side's prefix index and active blocks (the gauges read it)."""
        return self.inner.state

    @property
    def regime(self) -> Regime:
        return self._applied

    @property
    def temperature(self) -> float:
        return self.inner.decode_router.temperature

    @property
    def overlap_weight(self) -> float:
        return self.inner.decode_router.overlap_weight

    def select(
        self, request: RequestInfo, prefill: Sequence[WorkerView], decode: Sequence[WorkerView]
    ) -> tuple[WorkerView, WorkerView] | None:
        regime = self.detector.regime
        if regime is not self._applied:
            self.inner.set_params(*self._table[regime])
            self._applied = regime
        self.decisions += 1
        return self.inner.select(request, prefill, decode)


@register(NAME)
def _factory(params: Mapping[str, Any]) -> RegimeAdaptivePairs:
    return RegimeAdaptivePairs(config_from(RegimeAdaptivePairsConfig, params))
