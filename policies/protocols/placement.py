"""The placement extension point (steps 3–4, policies/pools.py, inside policies/intake.py):
which pools a request may go to, in preference order, and whether it is compressed first.

A placer answers every request with a `Placement`; it sees the request's estimate (prompt
tokens, max_tokens, category), the pools serving the fleet and, when the driver knows
them, the pools with a live worker (`healthy`; a placer may ignore it).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from policies.registry import Registry
from policies.types import Category, PoolSpec, RequestInfo


class Verdict(StrEnum):
    PLACED = "placed"
    NO_MODEL = "no_model"
    TOO_LONG = "too_long"


@dataclass(frozen=True, slots=True)
class Placement:
    verdict: Verdict
    pools: tuple[str, ...] = ()  # preference order; empty unless PLACED
    limit: int = 0  # the largest context among pools serving the model (for the 413 text)
    compress_to: int | None = None  # exact prompt-token limit on pools[0] (T_c), if any
    may_compress: bool = False  # whether content may be dropped to meet compress_to
    fallback: tuple[str, ...] = ()  # where the original goes if compress_to cannot be met
    category: Category | None = None
    reason: str = ""  # one line for the request log and the 413 message
    borderline: bool = False  # in the C&R band: on the short pool only by compressing
    # B_short < L_total ≤ γ·B_short whatever the category or outcome (code, too little room,
    # short pool down included): the denominator of the planner's observed p_c
    in_band: bool = False
    # a counted placement (policies/uncertainty.py): compress only when the exact count of
    # the prompt is at most this (γ·B_short − L_out); above it the request takes `fallback`
    compress_within: int | None = None
    uncertain: bool = False  # counted because the estimate could not place it


@dataclass(frozen=True, slots=True)
class Edges:
    """Where a placer's decision changes with a request's L_total, for counting exactly
    where the byte estimate cannot say which side a request lies on (policies/
    uncertainty.py): the short pool's boundary B_short and, when band requests are
    compressed onto it, the band's top γ·B_short, with what compression needs."""

    short_pool: str
    b_short: int
    band: float = 1.0  # γ: requests up to γ·B_short may be compressed (1.0: no band)
    min_target: int = 1  # a T_c below this leaves no room for a prompt
    compressible: frozenset[Category] = frozenset()  # the categories compression may shorten
    compress_single_pool: bool = False  # compress with no larger pool serving the model

    def boundaries(self, short: PoolSpec) -> tuple[int, ...]:
        """The L_total values where placement changes on `short`: B_short (and the band's
        top, with a band)."""
        b = min(self.b_short, short.max_model_len)
        return (b, math.floor(self.band * b)) if self.band > 1.0 else (b,)


class Placer(Protocol):
    @property
    def edges(self) -> Edges | None:
        """Its boundaries, for counting where the estimate cannot decide; None: it states
        none (every request is placed on its estimate)."""
        ...

    @property
    def category_blind_below(self) -> float:
        """Requests of at most this many tokens (prompt + max_tokens) are placed alike
        whatever their content category, so the intake need not run the classifier for
        them (0: the category may always matter)."""
        ...

    def place(
        self,
        request: RequestInfo,
        pools: Sequence[PoolSpec],
        healthy: Collection[str] | None = None,
    ) -> Placement:
        """Where `request` may go; `healthy`: the pools with a live worker, if known."""
        ...


PLACERS: Registry[Placer] = Registry("placement policy")
