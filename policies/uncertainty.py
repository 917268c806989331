"""Count exactly where the byte estimate cannot decide (issue 24).

The estimate L_in = ⌈bytes / ĉ_k⌉ is a point; what placement needs is the side of
B_short and of γ·B_short a request lies on. `ByteBounds` keeps, per (content category,
script), an interval [lo, hi] of bytes per token that every request of that kind is
expected to fall in: prior bounds measured with real tokenizers (cl100k, Llama-3.1,
Qwen3) on real text (bench/byte_bounds.py), widened by every ratio the engines report
afterwards. The request's L_total then lies in

    [⌈bytes / hi⌉ + template + L_out,  ⌈bytes / lo⌉ + template + L_out]

and when that range holds B_short or γ·B_short (`straddles`), the estimate cannot say where
the request goes: placement asks the driver for the exact count first (`counted`) and
decides on it (policies/intake.py). A request whose whole range lies on one side of both
boundaries is placed as before, without any count: because the interval holds the
truth, that is where an exact count would have placed it too, so a cold gateway (ĉ_k
still at its prior) places such requests exactly as a warm one.

Pure: no I/O, no clock. One `ByteBounds` per gateway process (soft state).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from compressor.script import Script
from policies.protocols.placement import Edges, Placement, Placer, Verdict
from policies.types import Category, PoolSpec, RequestInfo


@dataclass(frozen=True, slots=True)
class Interval:
    """Bytes per token: every request of one kind is expected in [lo, hi]."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not 0 < self.lo <= self.hi:
            raise ValueError(f"a bytes-per-token interval needs 0 < lo ≤ hi: {self}")

    def widened(self, ratio: float) -> Interval:
        return Interval(min(self.lo, ratio), max(self.hi, ratio))


# Prior bounds: the lowest and highest content bytes per token of whole requests under
# cl100k, Llama-3.1 and Qwen3 on the shapes corpus with Chinese and Japanese documents
# (bench/byte_bounds.py: text 3.2–5.0, records 2.2–4.3, CJK man pages 2.9–4.4, source
# code 3.6–4.8), widened by ~10 % each way; TEXT's top is the 6–7 bytes per token of
# prose in long common words, CJK's bottom is Chinese without ASCII under cl100k (one
# token a 3-byte character, two for rare ones). By script; a category narrows TEXT
# where it is known to.
SCRIPT_PRIORS: Mapping[Script, Interval] = {
    Script.TEXT: Interval(2.9, 7.2),
    Script.CJK: Interval(1.3, 5.0),
    Script.RECORDS: Interval(2.0, 4.8),
}
CATEGORY_PRIORS: Mapping[tuple[Category, Script], Interval] = {
    (Category.CODE, Script.TEXT): Interval(3.2, 5.3),
}
# the lowest bytes per token of any ASCII text above: Intake's fast-path floor
ASCII_FLOOR = min(i.lo for s, i in SCRIPT_PRIORS.items() if s is not Script.CJK)


@dataclass
class ByteBounds:
    """The per-(category, script) intervals, widened by what the engines count."""

    priors: Mapping[Script, Interval] = field(default_factory=lambda: dict(SCRIPT_PRIORS))
    category_priors: Mapping[tuple[Category, Script], Interval] = field(
        default_factory=lambda: dict(CATEGORY_PRIORS)
    )
    min_ratio: float = 1.0  # observations outside [min_ratio, max_ratio] are not text
    max_ratio: float = 16.0
    min_tokens: int = 64  # fewer content tokens than this measure the template, not the text
    counts: int = 0  # requests whose placement needed an exact count (`straddles` true)
    _seen: dict[tuple[Category, Script], Interval] = field(default_factory=dict)
    _floors: dict[Script, float] = field(default_factory=dict)  # `floor`'s, until a widen

    def interval(self, category: Category, script: Script) -> Interval:
        key = (category, script)
        held = self._seen.get(key)
        if held is not None:
            return held
        return self.category_priors.get(key) or self.priors[script]

    def floor(self, script: Script) -> float:
        """The fewest bytes per token a request of `script` is expected to pack, whatever
        its category (the lowest `lo` of its intervals, learnt ones included): bytes / floor
        bounds its tokens before it is classified (policies/intake.py's fast path)."""
        held = self._floors.get(script)
        if held is None:
            keys = {k for k in (*self.category_priors, *self._seen) if k[1] is script}
            held = min([self.priors[script].lo, *(self.interval(*k).lo for k in keys)])
            self._floors[script] = held
        return held

    def widen(self, category: Category, script: Script, content_bytes: int, tokens: int) -> bool:
        """Learn from one counted request (engine or exact local count of its content);
        False when the sample is not plausible text."""
        if tokens < self.min_tokens or content_bytes <= 0:
            return False
        ratio = content_bytes / tokens
        if not self.min_ratio <= ratio <= self.max_ratio:
            return False
        key = (category, script)
        self._seen[key] = self.interval(category, script).widened(ratio)
        self._floors.pop(script, None)
        return True

    def snapshot(self) -> dict[str, tuple[float, float]]:
        """The intervals learnt so far, by "category/script" (for the admin API)."""
        return {f"{c.value}/{s.value}": (i.lo, i.hi) for (c, s), i in self._seen.items()}


def total_range(
    content_bytes: int, template: int, max_tokens: int, interval: Interval
) -> tuple[int, int]:
    """The lowest and highest L_total a request can have under `interval`."""
    lo = math.ceil(content_bytes / interval.hi) + template + max_tokens
    hi = math.ceil(content_bytes / interval.lo) + template + max_tokens
    return lo, hi


def straddles(lo: int, hi: int, edges: Sequence[int]) -> bool:
    """Does [lo, hi] hold a boundary, so the estimate cannot place the request?"""
    return any(lo <= e < hi for e in edges)


def counted(
    edges: Edges,
    request: RequestInfo,
    pools: Sequence[PoolSpec],
    healthy: Collection[str] | None,
    lowest_total: int,
) -> Placement | None:
    """The placement of a request the estimate cannot place: the short pool with
    `compress_to` = T_c so the driver counts it exactly first; `compress_within` bounds the
    count up to which it may be compressed (the band, γ·B_short − L_out) and `fallback`
    (every larger pool that could hold it) takes it when the count is above T_c and it may
    not be compressed. None when counting cannot change anything (no short pool serves
    the model, it is down, or L_out alone leaves no room on it)."""
    serving = [p for p in pools if not p.models or request.model in p.models]
    short = next((p for p in serving if p.name == edges.short_pool), None)
    if short is None or (healthy is not None and short.name not in healthy):
        return None
    bounds = edges.boundaries(short)
    target = bounds[0] - request.max_tokens
    if target < edges.min_target:
        return None
    others = sorted(
        (p for p in serving if p is not short and lowest_total <= p.max_model_len),
        key=lambda p: (p.max_model_len, p.name),
    )
    # every larger pool, up or not, as a long placement lists them: the driver spills past
    # a dead one (and counts the spill) exactly as it does for a request placed long
    longer = tuple(p.name for p in others)
    compress = request.category in edges.compressible and (
        bool(others) or edges.compress_single_pool
    )
    return Placement(
        Verdict.PLACED,
        (short.name, *longer),
        max(p.max_model_len for p in serving),
        compress_to=target,
        may_compress=compress,
        fallback=longer,
        category=request.category,
        reason="uncertain estimate: count exactly",
        compress_within=bounds[-1] - request.max_tokens,
        uncertain=True,
    )


def counted_in_band(placement: Placement, tokens_before: int) -> bool:
    """A counted request whose exact count put it in the band (B_short, γ·B_short]."""
    limit, target = placement.compress_within, placement.compress_to
    return (
        placement.uncertain
        and limit is not None
        and target is not None
        and (target < tokens_before <= limit)
    )


def beyond_band(placement: Placement, tokens_before: int) -> bool:
    """A counted request whose exact count lies above the band: not to be compressed."""
    limit = placement.compress_within
    return limit is not None and tokens_before > limit


def place_uncertain(
    bounds: ByteBounds,
    placer: Placer,
    request: RequestInfo,
    placement: Placement,
    content_bytes: int,
    template: int,
    script: Script,
    pools: Sequence[PoolSpec],
    healthy: Collection[str] | None,
) -> Placement:
    """`placement` (the estimate's), or a counted one when the request's L_total range
    under its interval holds a boundary of the short pool (see the module docstring)."""
    if placement.verdict is not Verdict.PLACED:
        return placement
    edges = placer.edges
    if edges is None:
        return placement  # a placer that states no boundaries: placed on its estimate
    interval = bounds.interval(request.category, script)
    lo, hi = total_range(content_bytes, template, request.max_tokens, interval)
    short = next((p for p in pools if p.name == edges.short_pool), None)
    if short is None or not straddles(lo, hi, edges.boundaries(short)):
        return placement
    out = counted(edges, request, pools, healthy, lo)
    if out is None:
        return placement
    bounds.counts += 1
    return out
