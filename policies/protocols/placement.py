"""The placement extension point (steps 3–4, policies/pools.py, inside policies/intake.py):
which pools a request may go to, in preference order, and whether it is compressed first.

A placer answers every request with a `Placement`; it sees the request's estimate (prompt
tokens, max_tokens, category), the pools serving the fleet and, when the driver knows
them, the pools with a live worker (`healthy`; a placer may ignore it).
"""

from __future__ import annotations

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


class Placer(Protocol):
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
