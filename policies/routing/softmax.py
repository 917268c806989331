"""A picker that samples the worker from a softmax of the costs, with temperature τ
(Dynamo's KV router selector; docs/CACHE_ROUTING.md).

With `normalise="range"` (Dynamo's, and the default) costs are min–max normalised first:

    P(j) ∝ exp(−(c_j − c_min) / ((c_max − c_min) · τ))          all costs equal: uniform

so τ is relative to the spread of the costs: shifting or scaling every cost changes
nothing, and with two workers the worse one gets e^{−1/τ}/(1 + e^{−1/τ}) — 19.3 % at
τ = 0.7, 26.9 % at τ = 1. With `normalise="none"` (the paper's equation as printed, for
ablation) P(j) ∝ exp(−(c_j − c_min)/τ): τ is then in cost units.

τ = 0 is the argmin; ties go to the lowest `tie_break` key when one is given (kv_cost gives
the worker's cached-tree size, Dynamo's tie-break), then to a uniform draw among those
left. Every draw comes from the picker's own RNG, seeded, so a simulated run is
reproducible bit for bit; a request's `router_temperature` overrides τ for that request.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from policies.types import RequestInfo, WorkerView

Scored = list[tuple[float, WorkerView]]
NORMALISE = ("range", "none")


def softmax_probabilities(
    costs: Sequence[float], temperature: float, normalise: str = "range"
) -> list[float]:
    """P(j) for each cost at temperature τ > 0 (lower cost, likelier)."""
    if not costs:
        return []
    if not temperature > 0:
        raise ValueError("temperature: the softmax needs τ > 0 (τ = 0 is the argmin)")
    lo, hi = min(costs), max(costs)
    if normalise == "range":
        if hi == lo:
            return [1.0 / len(costs)] * len(costs)
        scale = (hi - lo) * temperature
    elif normalise == "none":
        scale = temperature
    else:
        raise ValueError(f"normalise: must be one of {', '.join(NORMALISE)}")
    weights = [math.exp(-(c - lo) / scale) for c in costs]  # exponents ≤ 0: no overflow
    total = math.fsum(weights)
    return [x / total for x in weights]


@dataclass(slots=True)
class Softmax:
    temperature: float = 0.0  # τ
    seed: int = 0
    normalise: str = "range"
    tie_break: Callable[[WorkerView], float] | None = None  # lower first, at τ = 0
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.temperature < 0 or not math.isfinite(self.temperature):
            raise ValueError("temperature: must be finite and >= 0")
        if self.normalise not in NORMALISE:
            raise ValueError(f"normalise: must be one of {', '.join(NORMALISE)}")
        self._rng = random.Random(self.seed)

    def pick(self, request: RequestInfo, scored: Scored) -> WorkerView | None:
        if not scored:
            return None
        if len(scored) == 1:
            return scored[0][1]
        tau = self.temperature if request.router_temperature is None else request.router_temperature
        if not tau > 0:
            return self._argmin(scored)
        probs = softmax_probabilities([c for c, _ in scored], tau, self.normalise)
        u = self._rng.random()
        acc = 0.0
        for p, (_, w) in zip(probs, scored, strict=True):
            acc += p
            if u < acc:
                return w
        return scored[-1][1]  # u within rounding of 1

    def _argmin(self, scored: Scored) -> WorkerView:
        best = min(c for c, _ in scored)
        tied = [w for c, w in scored if c == best]
        if len(tied) > 1 and self.tie_break is not None:
            key = self.tie_break
            keys = [key(w) for w in tied]
            least = min(keys)
            tied = [w for w, k in zip(tied, keys, strict=True) if k == least]
        if len(tied) == 1:
            return tied[0]
        return tied[int(self._rng.random() * len(tied))]
