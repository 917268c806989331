"""Pairs as Dynamo's disaggregated router places them: the decode worker by the KV cost
with temperature τ, the prefill worker by its queue ("The Price of Anarchy in
Disaggregated Inference", eq. 1–2 and §6: in its 1P/2D and 1P/5D runs the routing game is
played among the decode workers, a single prefill worker serving them all).

- decode: `kv_cost` (policies/routing/kv_cost.py) over the decode workers:
  c_j = ω·(prompt blocks j has not seen, by the prefix index) + (active blocks on j),
  range-normalised softmax at τ (τ = 0: argmin); (τ, ω) per pool (`params`) and per
  request (`RequestInfo.router_temperature` / `overlap_weight`), so the regime table's
  values can be switched in as for `kv_cost`; its index and active blocks follow the
  core's pair events (`hooks()`: a prompt's blocks — and, with `output_blocks`, the
  default, the most the request may generate — active on the decode from the pair's
  dispatch to the answer's end, the prompt in its cache from the hand-off on);
- prefill: the least prompt work not handed off yet (⌈outstanding tokens / block⌉ —
  prefill slots are released at the hand-off — then requests in flight), ties in turn:
  the pull queue Dynamo's prefill workers serve.

Reads: the `WorkerView` fields of `kv_cost` and `least_loaded`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.hooks import Hook
from policies.pd.kv_cost_decode_load import SideCostConfig, decode_load
from policies.pd.pair_state import PairKvState
from policies.protocols.pairs import config_from, register
from policies.routing import with_room
from policies.routing.kv_cost import KvCostRouter
from policies.routing.kv_state import PER_REQUEST, KvState
from policies.types import RequestInfo, WorkerView

NAME = "kv_cost_decode"


@dataclass(frozen=True, slots=True)
class KvCostDecodeConfig(SideCostConfig):
    """The decode side's KV cost."""

    # a decode worker's active blocks count each request's output blocks (⌈max_tokens /
    # block⌉ per sequence) from its pair to its answer's end, as Dynamo counts the blocks
    # generated — the most it may generate, charged at once (policies/pd/pair_state.py);
    # false: the prompts' blocks alone, a shared block once (blind to how many requests
    # share a template)
    output_blocks: bool = True


@dataclass(slots=True)
class KvCostDecode:
    # what a driver fills for it before Core.start (policies/build.py request_fields)
    request_fields: ClassVar[tuple[str, ...]] = PER_REQUEST
    config: KvCostDecodeConfig = field(default_factory=KvCostDecodeConfig)
    name: str = NAME
    decode_router: KvCostRouter = field(init=False)
    _turn: int = 0  # the prefill workers' round-robin among ties

    def __post_init__(self) -> None:
        self.decode_router = self.config.router()

    def set_params(self, temperature: float, overlap_weight: float) -> None:
        """Switch (τ, ω) (a regime controller's knob)."""
        self.decode_router.set_params(temperature, overlap_weight)

    @property
    def state(self) -> KvState:
        """The decode side's prefix index and active blocks (the gauges read it)."""
        return self.decode_router.state

    @property
    def temperature(self) -> float:
        return self.decode_router.temperature

    @property
    def overlap_weight(self) -> float:
        return self.decode_router.overlap_weight

    def hooks(self) -> tuple[Hook, ...]:
        """The decode side's prefix index and active blocks, kept by the core's pair
        events (policies/pd/pair_state.py; policies/build.py attaches them)."""
        return (PairKvState(self.decode_router.state, "decode", self.config.output_blocks),)

    def select(
        self, request: RequestInfo, prefill: Sequence[WorkerView], decode: Sequence[WorkerView]
    ) -> tuple[WorkerView, WorkerView] | None:
        ok = with_room(prefill)
        if not ok:
            return None
        d = self.decode_router.choose(request, decode)
        if d is None:
            return None
        bs = self.config.block_size
        keys = [(decode_load(w, bs), w.in_flight) for w in ok]
        best = min(keys)
        ties = [w for w, k in zip(ok, keys, strict=True) if k == best]
        p = ties[self._turn % len(ties)]
        self._turn += 1
        return p, d


@register(NAME)
def _factory(params: Mapping[str, Any]) -> KvCostDecode:
    return KvCostDecode(config_from(KvCostDecodeConfig, params))
