"""Pool placement: which pool a request goes to, and whether it is compressed first.

Two policies share one result type (`Placement`):

`ShortLongPlacement` (plain pool routing, FleetOpt §2.1): L_total = prompt + max_tokens
≤ B_short → the short pool; otherwise the smallest other pool whose context holds it.

`CompressAndRoute` (FleetOpt §5.1, Eq. 14–15) adds the virtual pool: a request in the
borderline band B_short < L_total ≤ γ·B_short whose content category is compressible
(prose, RAG, chat; never code) is placed on the short pool with `compress_to` =
T_c = B_short − L_out, so that after compression T_c + L_out = B_short (Eq. 15: no
compressed request can overflow the short pool). The gateway calls the compressor
(compressor/compress.py: `fit_request`) with that exact target:
- it fits (`Compression.fits`) → send the (compressed) request to `pools`;
- it cannot reach T_c (mandatory units alone too long, nothing shortenable) → send the
  original request to `fallback`, the pools that hold it uncompressed (the long pool);
  `fallback` empty → no pool can serve it: 413 with `reason`.
A request whose estimate lies just below B_short (within `verify_margin`) also gets
`compress_to`, with `may_compress` telling whether content may be dropped: the estimate
is an EMA, and the short pool must never receive more than it was sized for, so the
gateway counts these exactly (the compressor is a no-op when they fit).

Pools are ordered preferences: if every worker of the first pool is down the gateway
may spill to the next, larger pool (a long-context worker can always serve a short
request; the reverse never happens). With `healthy` (pool names with a live worker) the
long pool being down or absent is explicit: a borderline request is then compressed with
no fallback (compression is its only way in), and if the short pool is down a borderline
request goes to the long pool uncompressed instead of being compressed for nothing.
Nothing fits → `Verdict.TOO_LONG` (413, `limit` and `reason` say why); no pool serves
the model → `Verdict.NO_MODEL` (404).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

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


def _serving(request: RequestInfo, pools: Sequence[PoolSpec]) -> list[PoolSpec]:
    return [p for p in pools if not p.models or request.model in p.models]


def _too_long(request: RequestInfo, limit: int, extra: str = "") -> Placement:
    reason = (
        f"request needs {request.total_tokens} tokens (prompt ≈{request.prompt_tokens} + "
        f"max_tokens {request.max_tokens}) but the largest context serving "
        f"{request.model!r} is {limit} tokens{extra}"
    )
    return Placement(Verdict.TOO_LONG, limit=limit, category=request.category, reason=reason)


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
        serving = _serving(request, pools)
        if not serving:
            return Placement(Verdict.NO_MODEL, reason=f"no pool serves {request.model!r}")
        limit = max(p.max_model_len for p in serving)
        total = request.total_tokens
        fitting = sorted(
            (p for p in serving if total <= self.threshold(p)),
            key=lambda p: (self.threshold(p), p.name),
        )
        if not fitting:
            return _too_long(request, limit)
        return Placement(
            Verdict.PLACED, tuple(p.name for p in fitting), limit, category=request.category
        )


DEFAULT_COMPRESSIBLE = frozenset({Category.PROSE, Category.RAG, Category.CHAT})


@dataclass(frozen=True, slots=True)
class CompressAndRoute:
    """Short pool, compress-then-short for the borderline band, or the long pool."""

    short_pool: str = "short"
    b_short: int = 8192  # FleetOpt Table 2's Agent-heavy boundary; set from the planner
    gamma: float = 1.5  # FleetOpt §5.1's bandwidth γ: the virtual pool holds γ·B_short
    compressible: frozenset[Category] = DEFAULT_COMPRESSIBLE  # FleetOpt §5.2: never code
    verify_margin: float = 0.05  # estimates this close below B_short are counted exactly
    min_target: int = 256  # a T_c below this leaves no room for a prompt: not borderline
    # with no larger pool serving the model, C&R would silently shorten every band request
    # to fit the one pool: only when asked (`placement.compress_single_pool`); else 413
    compress_single_pool: bool = False

    def __post_init__(self) -> None:
        if self.gamma < 1.0:
            raise ValueError(f"gamma must be ≥ 1: {self.gamma}")
        if not 0.0 <= self.verify_margin < 1.0:
            raise ValueError(f"verify_margin must be in [0, 1): {self.verify_margin}")

    def place(
        self,
        request: RequestInfo,
        pools: Sequence[PoolSpec],
        healthy: Collection[str] | None = None,
    ) -> Placement:
        serving = _serving(request, pools)
        if not serving:
            return Placement(Verdict.NO_MODEL, reason=f"no pool serves {request.model!r}")
        limit = max(p.max_model_len for p in serving)
        total = request.total_tokens
        short = next((p for p in serving if p.name == self.short_pool), None)
        others = sorted(
            (p for p in serving if p is not short and total <= p.max_model_len),
            key=lambda p: (p.max_model_len, p.name),
        )
        uncompressed = tuple(p.name for p in others)
        category = request.category
        if short is None:
            if not others:
                return _too_long(request, limit)
            return Placement(Verdict.PLACED, uncompressed, limit, category=category, reason="long")
        b = min(self.b_short, short.max_model_len)
        target = b - request.max_tokens
        may = category in self.compressible
        if total <= b:
            verify = total > (1.0 - self.verify_margin) * b and target >= self.min_target
            return Placement(
                Verdict.PLACED,
                (short.name, *uncompressed),
                limit,
                compress_to=target if verify else None,
                may_compress=may and verify,
                fallback=uncompressed if verify else (),
                category=category,
                reason="short (verify exact count)" if verify else "short",
            )
        live_fallback = tuple(n for n in uncompressed if healthy is None or n in healthy)
        in_band = total <= self.gamma * b
        two_pools = bool(others) or self.compress_single_pool
        if in_band and may and target >= self.min_target and two_pools:
            if healthy is not None and short.name not in healthy and live_fallback:
                return Placement(
                    Verdict.PLACED, live_fallback, limit, category=category,
                    reason="borderline, short pool down: long uncompressed", in_band=True,
                )  # fmt: skip
            why = "" if live_fallback else (" (no long pool up: compression is the only way)")
            return Placement(
                Verdict.PLACED,
                (short.name,),
                limit,
                compress_to=target,
                may_compress=True,
                fallback=live_fallback,
                category=category,
                reason=f"borderline: compress to {target} then short{why}",
                borderline=True,
                in_band=True,
            )
        if not others:
            extra = ""
            if total <= self.gamma * b and not may:
                extra = f"; {category.value} content is not compressed"
            elif total <= self.gamma * b and not two_pools:
                extra = (
                    "; Compress-and-Route compresses only with a larger pool to fall back to"
                    " (placement.compress_single_pool: true compresses onto this one)"
                )
            elif total <= self.gamma * b:
                extra = f"; max_tokens {request.max_tokens} leaves no room to compress into"
            return _too_long(request, limit, extra)
        return Placement(
            Verdict.PLACED, uncompressed, limit, category=category, reason="long", in_band=in_band
        )


Placer = CompressAndRoute | ShortLongPlacement

# Placement's parameters are the `placement.*` section's keys (short_pool, b_short, gamma,
# verify_margin); a policy takes the ones it uses.
PLACERS: Registry[Placer] = Registry("placement policy")


@PLACERS.register("compress_and_route")
def _compress_and_route(params: Mapping[str, Any]) -> Placer:
    return CompressAndRoute(
        params["short_pool"],
        params["b_short"],
        params.get("gamma", 1.5),
        verify_margin=params.get("verify_margin", 0.05),
        compress_single_pool=params.get("compress_single_pool", False),
    )


@PLACERS.register("short_long")
def _short_long(params: Mapping[str, Any]) -> Placer:
    return ShortLongPlacement(params["short_pool"], params["b_short"])


PLACEMENTS = tuple(PLACERS.names())


def make_placement(
    name: str,
    short_pool: str,
    b_short: int,
    gamma: float = 1.5,
    verify_margin: float = 0.05,
    compress_single_pool: bool = False,
) -> Placer:
    """A placement policy by its configuration name; an unknown name fails at start."""
    params = {"short_pool": short_pool, "b_short": b_short, "gamma": gamma}
    extra = {"verify_margin": verify_margin, "compress_single_pool": compress_single_pool}
    return PLACERS.make(name, params | extra)
