"""Pool placement: which pool a request goes to, and whether it is compressed first.

The protocol (`Placer`), its result (`Placement`) and its registry (`PLACERS`) are
policies/protocols/placement.py; this module holds the two built-in policies, registered
by name with their parameters (`placement.policy`, `placement.params`; the section's
`short_pool`, `b_short`, `gamma` and `verify_margin` are offered to every policy, which
takes the ones it uses). Configuration builds them with `make_placer(name, params)`.

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
from typing import Any

from policies.protocols.placement import PLACERS, Edges, Placement, Placer, Verdict
from policies.registry import config_from
from policies.types import Category, PoolSpec, RequestInfo


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

    @property
    def edges(self) -> Edges:
        return Edges(self.short_pool, self.b_short)

    def threshold(self, pool: PoolSpec) -> int:
        if pool.name == self.short_pool:
            return min(self.b_short, pool.max_model_len)
        return pool.max_model_len

    @property
    def category_blind_below(self) -> float:
        return 0.0  # the category keys the estimate that decides short or long: classify

    def place(
        self,
        request: RequestInfo,
        pools: Sequence[PoolSpec],
        healthy: Collection[str] | None = None,  # not looked at: the driver spills
    ) -> Placement:
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

    @property
    def edges(self) -> Edges:
        return Edges(
            self.short_pool,
            self.b_short,
            self.gamma,
            self.min_target,
            self.compressible,
            self.compress_single_pool,
        )

    @property
    def category_blind_below(self) -> float:
        # below the verify margin a request goes short uncounted, whatever its category
        return (1.0 - self.verify_margin) * self.b_short

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


# Every policy is offered the placement section's shared keys and takes those it uses;
# its own keys (`placement.params`) are checked strictly.
# offered to every placer, which takes those it has (C&R's `compress_single_pool` included)
SHARED_KEYS = frozenset({"short_pool", "b_short", "gamma", "verify_margin", "compress_single_pool"})


def _config(cls: Any, params: Mapping[str, Any]) -> Any:
    fields = getattr(cls, "__dataclass_fields__", {})
    return config_from(
        cls, {k: v for k, v in params.items() if k in fields or k not in SHARED_KEYS}
    )


@PLACERS.register("compress_and_route")
def _compress_and_route(params: Mapping[str, Any]) -> Placer:
    own = dict(params)
    if "compressible" in own:  # category names in configuration
        own["compressible"] = frozenset(Category(c) for c in own["compressible"])
    placer: CompressAndRoute = _config(CompressAndRoute, own)
    return placer


@PLACERS.register("short_long")
def _short_long(params: Mapping[str, Any]) -> Placer:
    placer: ShortLongPlacement = _config(ShortLongPlacement, params)
    return placer


def make_placer(name: str, params: Mapping[str, Any] | None = None) -> Placer:
    """A placement policy by name with its parameters; unknown names or keys fail at start."""
    return PLACERS.make(name, params)


def make_placement(
    name: str,
    short_pool: str,
    b_short: int,
    gamma: float = 1.5,
    verify_margin: float = 0.05,
    params: Mapping[str, Any] | None = None,
) -> Placer:
    """`make_placer` from the placement section's shared keys and the policy's own `params`."""
    shared = {"short_pool": short_pool, "b_short": b_short, "gamma": gamma}
    return make_placer(name, {**shared, "verify_margin": verify_margin, **(params or {})})


# the built-in names (tests, documentation); configuration asks PLACERS.names()
PLACEMENTS = tuple(PLACERS.names())

__all__ = [
    "PLACEMENTS",
    "PLACERS",
    "CompressAndRoute",
    "Placement",
    "Placer",
    "ShortLongPlacement",
    "Verdict",
    "make_placement",
    "make_placer",
]
