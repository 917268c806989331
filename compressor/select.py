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
    ordered = tokens[order]
    # the leading run of the order that fits as a whole is taken without a Python loop
    # (tokens are ≥ 0, so no unit of it is skipped and room stays ≥ smallest before its end)
    taken = int(np.searchsorted(np.cumsum(ordered), room, side="right"))
    if taken:
        keep[order[:taken]] = True
        room -= int(ordered[:taken].sum())
        if room < smallest:
            return keep
    for i, t in zip(order[taken:].tolist(), ordered[taken:].tolist(), strict=True):
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
    look: int = 8,
) -> bool:
    """Drop optional kept units until ≥ `excess` estimated tokens are gone (in place):
    the lowest-scored unit that alone covers the excess among the `look` lowest-scored,
    else the lowest-scored ones in turn. Returns False when nothing optional is left."""
    candidates = np.flatnonzero(keep & ~mandatory)
    if len(candidates) == 0:
        return False
    order = candidates[np.lexsort((-candidates, scores[candidates]))].tolist()
    need = max(excess, 1)
    for i in order[:look]:
        if tokens[i] >= need:
            keep[i] = False
            return True
    removed = 0
    for i in order:
        keep[i] = False
        removed += int(tokens[i])
        if removed >= need:
            break
    return True


def refill(
    keep: BoolArray, tokens: npt.NDArray[np.int64], scores: npt.NDArray[np.float64], room: int
) -> BoolArray | None:
    """A copy of `keep` with dropped units added back, best score first, while their
    estimated tokens fit `room`; None if none fits."""
    dropped = np.flatnonzero(~keep)
    fitting = dropped[tokens[dropped] <= room]
    if len(fitting) == 0:
        return None
    out = keep.copy()
    for i in fitting[np.lexsort((fitting, -scores[fitting]))].tolist():
        t = int(tokens[i])
        if t <= room:
            out[i] = True
            room -= t
    return out
