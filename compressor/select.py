"""Greedy extractive selection under a token budget (FleetOpt §5.2 steps 3–4).

Mandatory units — the first `keep_first` and last `keep_last` of every document (the
primacy/recency invariant) and every fenced code block (never cut) — are always kept.
The others are taken in descending score order (ties: earlier unit first, so the result
is deterministic) whenever they still fit the budget; a unit too large for what is left
is skipped and smaller, lower-scored units may still fill the gap. The text is then
re-assembled in the original order.

`trim` is the exactness fallback: when the exact re-count of the assembled output
exceeds the budget (token merges at new joins, a unit whose chunk straddled a boundary),
it drops the lowest-scored optional units until the estimated excess is gone.

Failure posture: if the mandatory units alone exceed the budget there is no selection
(`None`); the caller reports "cannot compress" and the request falls back to the long
pool.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

BoolArray = npt.NDArray[np.bool_]


def mandatory_mask(n: int, code: list[bool], keep_first: int, keep_last: int) -> BoolArray:
    """First `keep_first`, last `keep_last` and code units of one document."""
    keep = np.asarray(code, dtype=np.bool_).copy()
    keep[: max(keep_first, 0)] = True
    if keep_last > 0:
        keep[max(n - keep_last, 0) :] = True
    return keep


def greedy_select(
    tokens: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    mandatory: BoolArray,
    budget: int,
) -> BoolArray | None:
    """Units to keep so Σ tokens ≤ budget, or None if the mandatory ones do not fit."""
    keep = mandatory.copy()
    used = int(tokens[mandatory].sum())
    if used > budget:
        return None
    optional = np.flatnonzero(~mandatory)
    if len(optional) == 0:
        return keep
    opt_tokens = tokens[optional]
    if used + int(opt_tokens.sum()) <= budget:
        keep[optional] = True
        return keep
    order = optional[np.lexsort((optional, -scores[optional]))]
    room = budget - used
    smallest = int(opt_tokens.min())
    for i, t in zip(order.tolist(), tokens[order].tolist(), strict=True):
        if t <= room:
            keep[i] = True
            room -= t
            if room < smallest:
                break
    return keep


def trim(
    keep: BoolArray,
    tokens: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    mandatory: BoolArray,
    excess: int,
) -> bool:
    """Drop the lowest-scored kept optional units until ≥ `excess` tokens are gone (in
    place). Returns False when nothing optional is left to drop."""
    candidates = np.flatnonzero(keep & ~mandatory)
    if len(candidates) == 0:
        return False
    order = candidates[np.lexsort((-candidates, scores[candidates]))]
    removed = 0
    for i in order.tolist():
        keep[i] = False
        removed += int(tokens[i])
        if removed >= max(excess, 1):
            break
    return True
