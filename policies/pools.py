"""Pool placement: which pool a request goes to.

Baseline (this module, until Compress-and-Route replaces it): a request whose
L_total = prompt + max_tokens fits B_short goes to the short pool; otherwise to the
smallest other pool whose context holds it. Nothing fits → no pool (the gateway answers
413); no pool serves the model → the gateway answers 404.

The result is an ordered preference: if every worker of the first pool is down the
gateway may spill to the next, larger pool (a long-context worker can always serve a
short request; the reverse never happens). Spills are counted by the gateway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.types import PoolSpec, RequestInfo


class Verdict(StrEnum):
    PLACED = "placed"
    NO_MODEL = "no_model"
    TOO_LONG = "too_long"


@dataclass(frozen=True, slots=True)
class Placement:
    verdict: Verdict
    pools: tuple[str, ...] = ()  # preference order; empty unless PLACED
    limit: int = 0  # the largest context among pools serving the model (for the 413 text)


@dataclass(frozen=True, slots=True)
class ShortLongPlacement:
    """L_total ≤ B_short → the short pool; else the smallest pool that holds it."""

    short_pool: str = "short"
    b_short: int = 8192  # FleetOpt's B_short: the short pool's admission boundary in tokens

    def threshold(self, pool: PoolSpec) -> int:
        if pool.name == self.short_pool:
            return min(self.b_short, pool.max_model_len)
        return pool.max_model_len

    def place(self, request: RequestInfo, pools: Sequence[PoolSpec]) -> Placement:
        serving = [p for p in pools if not p.models or request.model in p.models]
        if not serving:
            return Placement(Verdict.NO_MODEL)
        limit = max(p.max_model_len for p in serving)
        total = request.total_tokens
        fitting = sorted(
            (p for p in serving if total <= self.threshold(p)),
            key=lambda p: (self.threshold(p), p.name),
        )
        if not fitting:
            return Placement(Verdict.TOO_LONG, limit=limit)
        return Placement(Verdict.PLACED, tuple(p.name for p in fitting), limit)
