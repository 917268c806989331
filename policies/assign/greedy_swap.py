"""BF-IO's fast path: greedy placement, then exact-gain swap local search.

Not in the paper (which only enumerates); both phases are needed:
1. Greedy. Repeatedly place the largest pooled request that fits on some rank with a free
   slot without raising any step's maximum (ties: the rank with the most headroom per free
   slot left, so large requests land where there is room); when none fits, the largest of
   the smallest ones still needed goes where it raises the maxima least.
2. Swaps. Repeatedly apply the move that lowers J = Σ_h (G·max_g L_g − Σ_g L_g) most:
   exchange a just-admitted request with a pooled one (changes *which* are admitted) or with
   one just admitted elsewhere (changes *where*), or move one to a rank with a slot still
   empty (only when the pool is smaller than the free slots). Every candidate move is scored
   exactly, all at once: a new request adds s_i + h at step k+h, so exchanging x and y
   shifts both ranks by the constant s_x − s_y and the new maximum is the larger of the two
   shifted ranks and the best rank outside them (kept as the per-step top three); with a
   pooled y that is a piecewise-linear function of s_x − s_y, evaluated in closed form.
Loads and sizes are token counts: integers, so every score is an exact integer in float64
and the decisions do not depend on the order of summation (tests compare them with the
previous implementation, tests/unit/policies/assign/greedy_swap_reference.py).
Two paths take the same decisions: the compiled one (policies/assign/_greedy.c, built by
setup.py when a C compiler is there; both phases as plain loops, about 10× faster at
G = 32 / pool 128 / lookahead 20, where numpy's time is call overhead) for integer loads,
and this numpy one, the fallback (tests/unit/policies/assign/test_greedy_compiled.py).
A swap-stable result has the separation property the paper's H = 0 analysis rests on: no
admitted request on the heaviest rank is larger than one on the lightest or still pooled
when exchanging them would lower the maximum.
"""

from __future__ import annotations

from bisect import bisect_right
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from policies.assign.compiled import built, fast
from policies.assign.registry import Decision
from policies.assign.state import Instance

_EPS = 1e-9
# steps in the window from which pooled exchanges are scored in closed form (below it the
# direct [U × P × H+1] block costs less than the sort and searches)
_CLOSED_FORM_FROM = 4


def greedy_swap(inst: Instance, max_rounds: int | None = None) -> Decision:
    """The compiled path (policies/assign/_greedy.c) when it is built and the loads are
    integers (token counts, as every driver supplies: there both paths compute the same
    exact integers), else the numpy path; the two take the same decisions."""
    if fast is not None and _integral(inst):
        return greedy_swap_compiled(inst, max_rounds)
    return greedy_swap_numpy(inst, max_rounds)


def _integral(inst: Instance) -> bool:
    base = inst.base
    return bool(np.isfinite(base).all() and not np.fmod(base, 1.0).any())


def _levels(inst: Instance) -> list[float | None]:
    """The greedy's starts: under the current per-step maxima (None), and (with a window)
    under a ceiling raised to the window's highest and median maximum. J rewards admitting
    large requests up to a maximum that one step already sets, which needs several ranks
    to rise together: no single exchange gets there from the first start."""
    levels: list[float | None] = [None]
    if inst.horizon > 1:
        top = inst.base.max(axis=0)
        levels += sorted({float(q) for q in np.quantile(top, (1.0, 0.75, 0.5, 0.25))}, reverse=True)
    return levels


def _rounds(u: int, max_rounds: int | None) -> int:
    return min(8 * u + 16, 64) if max_rounds is None else max_rounds


def greedy_swap_compiled(inst: Instance, max_rounds: int | None = None) -> Decision:
    """Both phases in C, step for step the numpy path's (ValueError when not built)."""
    if built is None:
        raise ValueError("policies/assign/_greedy.c is not built (setup.py, optional)")
    u = inst.fillable
    if u == 0:
        return []
    where = np.empty(len(inst.sizes), dtype=np.int64)
    built.greedy_swap(
        np.ascontiguousarray(inst.base, dtype=np.float64),
        inst.horizon,
        np.ascontiguousarray(inst.free, dtype=np.int64),
        inst.sizes.astype(np.float64),
        np.argsort(inst.sizes, kind="stable").astype(np.int64),
        np.array([-np.inf if lv is None else lv for lv in _levels(inst)]),
        u,
        _rounds(u, max_rounds),
        where,
    )
    return _decision(where)


def greedy_swap_numpy(inst: Instance, max_rounds: int | None = None) -> Decision:
    """The numpy path: the fallback without a compiler, and what the compiled one is
    tested against."""
    u = inst.fillable
    if u == 0:
        return []
    # every start's greedy is cheap (all run at once, one array per start); only the best
    # one is polished by the swap search, from its greedy state
    states = _greedy(inst, _levels(inst))
    # J of each start from its loads (the same exact integers objective() would add up)
    scored = [(_objective_of(inst.ranks, st[0]), n) for n, st in enumerate(states)]
    loads, free, where = states[min(scored)[1]]
    rounds = _rounds(u, max_rounds)
    plateau_left = 2 * u  # J-neutral steps allowed: they only set up the next improvement
    sizes = inst.sizes.astype(np.float64)
    hs = np.arange(inst.horizon, dtype=np.float64)
    for _ in range(rounds):
        step = _improve(loads, free, where, sizes, hs, inst.ranks, plateau_left > 0)
        if step == 0:
            break
        plateau_left -= step == 2
    return _decision(where)


def _decision(where: npt.NDArray[np.int64]) -> Decision:
    return [(int(i), int(where[i])) for i in np.flatnonzero(where >= 0)]


def _objective_of(n_ranks: int, loads: npt.NDArray[np.float64]) -> float:
    """J = Σ_h (G·max_g L_g(k+h) − Σ_g L_g(k+h)) of final loads [G, H+1]."""
    return float((n_ranks * loads.max(axis=0) - loads.sum(axis=0)).sum())


_State = tuple[npt.NDArray[np.float64], npt.NDArray[np.int64], npt.NDArray[np.int64]]


def _greedy(inst: Instance, levels: list[float | None]) -> list[_State]:
    """Phase 1, once per ceiling in `levels` (None: the current per-step maxima), all
    starts stepped together (one [start, rank, step] array): each start's loads, free
    slots and pooled requests' ranks (−1: still pooled) after placing U requests. Every
    start computes exactly what it would alone; batching only saves array calls."""
    u = inst.fillable
    hs = np.arange(inst.horizon, dtype=np.float64)
    sizes = inst.sizes.astype(np.float64)
    n_pool, n_starts = len(sizes), len(levels)
    floor = np.array([-np.inf if lv is None else lv for lv in levels])[:, None]
    loads = np.repeat(inst.base[None], n_starts, axis=0)
    free = np.repeat(inst.free.astype(np.int64)[None], n_starts, axis=0)
    where = np.full((n_starts, n_pool), -1, dtype=np.int64)
    starts = np.arange(n_starts)

    # sizes ascending; per start, `left` are the pooled requests not yet placed (a sorted
    # index list) and `left_sizes` their sizes (plain floats: bisected, no array built)
    by_size = np.argsort(inst.sizes, kind="stable")
    ascending: list[float] = sizes[by_size].tolist()
    left = [list(range(n_pool)) for _ in levels]
    left_sizes = [list(ascending) for _ in levels]
    chosen = np.empty(n_starts, dtype=np.int64)
    for placed in range(u):
        need = u - placed
        ceiling = np.maximum(loads.max(axis=1), floor)  # [start, step]
        # room_g: the largest request rank g takes without raising any step's ceiling
        slack = ceiling[:, None, :] - loads  # [start, rank, step]
        room = (slack - hs).min(axis=2)
        full = free <= 0
        room[full] = -np.inf
        most = room.max(axis=1)
        for n in range(n_starts):
            fit_at = bisect_right(left_sizes[n], float(most[n]))
            # the largest request that fits somewhere; when none does, the largest of the
            # `need` smallest (a larger one would be passed over while smaller ones can
            # still fill U)
            k = fit_at - 1 if fit_at > 0 else need - 1
            left_sizes[n].pop(k)
            chosen[n] = by_size[left[n].pop(k)]
        w = sizes[chosen][:, None] + hs  # [start, step]
        rise = np.maximum(w[:, None, :] - slack, 0.0).sum(axis=2)
        rise[full] = np.inf
        ties = rise <= (rise.min(axis=1) + _EPS)[:, None]
        g = np.argmax(ties, axis=1)  # the only (or first) tie
        several = ties.sum(axis=1) > 1
        if several.any():  # the tie with the most headroom per free slot left
            with np.errstate(divide="ignore", invalid="ignore"):
                headroom = (ceiling[:, :1] - loads[:, :, 0] - sizes[chosen][:, None]) / free
            best = np.argmax(np.where(ties, headroom, -np.inf), axis=1)
            g = np.where(several, best, g)
        where[starts, chosen] = g
        loads[starts, g] += w
        free[starts, g] -= 1
    return [(loads[n], free[n], where[n]) for n in range(n_starts)]


def _top3(loads: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Per step: the indices and loads of the three heaviest ranks (−1 / −inf when fewer)."""
    n_ranks, n_h = loads.shape
    k = min(3, n_ranks)
    idx = np.argsort(-loads, axis=0, kind="stable")[:k]
    vals = np.take_along_axis(loads, idx, axis=0)
    if k < 3:
        idx = np.vstack([idx, np.full((3 - k, n_h), -1, dtype=idx.dtype)])
        vals = np.vstack([vals, np.full((3 - k, n_h), -np.inf)])
    return idx.astype(np.int64), vals


def _max_outside(
    idx: npt.NDArray[np.int64],
    vals: npt.NDArray[np.float64],
    a: npt.NDArray[np.int64],
    b: npt.NDArray[np.int64],
) -> npt.NDArray[np.float64]:
    """[n, H+1]: per step, the heaviest load among ranks other than a[j] and b[j]."""
    a2, b2 = a[:, None], b[:, None]
    first_ok = (idx[0] != a2) & (idx[0] != b2)
    second_ok = (idx[1] != a2) & (idx[1] != b2)
    out: npt.NDArray[np.float64] = np.where(
        first_ok, vals[0], np.where(second_ok, vals[1], vals[2])
    )
    return out


@lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The (x, y) index pairs with x < y of n admitted requests (rounds reuse them)."""
    xs, ys = (a.astype(np.int64) for a in np.triu_indices(n, 1))
    xs.flags.writeable = ys.flags.writeable = False  # shared between calls
    return xs, ys


def _pooled_gain(
    sizes: npt.NDArray[np.float64],
    admitted_sizes: npt.NDArray[np.float64],
    la: npt.NDArray[np.float64],
    outside: npt.NDArray[np.float64],
    d: npt.NDArray[np.float64],
    top: npt.NDArray[np.float64],
    n_ranks: int,
) -> npt.NDArray[np.float64]:
    """[U, P]: the change of J when x (row; its rank's loads `la`, the best load outside
    its rank `outside`) leaves for pooled y and y takes its slot (d = s_x − s_y):
    G·Σ_h (max(la_h − d, outside_h) − top_h) + (H+1)·d, in closed form per row.

    With integer-valued loads and sizes (token counts, as every driver supplies) every
    term is an exact integer in float64, so this equals the direct sum bit for bit."""
    n_adm, n_h = la.shape
    if n_adm == 0:
        return np.empty((0, d.shape[1]))
    if n_h <= _CLOSED_FORM_FROM or not np.isfinite(outside).all():
        # a short window (the block is small) or one rank (no maximum outside x's)
        block = np.maximum(la[:, None, :] - d[:, :, None], outside[:, None, :]) - top
        direct: npt.NDArray[np.float64] = n_ranks * block.sum(axis=2) + n_h * d
        return direct
    excess = np.sort(la - outside, axis=1)  # [U, H+1] ascending
    # tail[x, k]: the sum of x's k largest excesses (k = 0..H+1)
    tail = np.zeros((n_adm, n_h + 1))
    np.cumsum(excess[:, ::-1], axis=1, out=tail[:, 1:])
    # above[x, y] = #{h: e_xh > s_x − s_y} = #{h: s_y > s_x − e_xh}: with the pool sorted
    # by size once, a histogram of where each threshold s_x − e_xh falls, accumulated
    order = np.argsort(sizes, kind="stable")
    n_pool = len(sizes)
    falls = np.searchsorted(sizes[order], (admitted_sizes[:, None] - excess).ravel(), "right")
    rows = np.repeat(np.arange(n_adm) * (n_pool + 1), n_h)
    hist = np.bincount(rows + falls, minlength=n_adm * (n_pool + 1)).reshape(n_adm, -1)
    above = np.empty((n_adm, n_pool), dtype=np.int64)
    above[:, order] = np.cumsum(hist[:, :n_pool], axis=1)
    rise = np.take_along_axis(tail, above, axis=1) - above * d  # Σ_h max(e_h − d, 0)
    base = (outside - top).sum(axis=1)  # [U]
    out: npt.NDArray[np.float64] = n_ranks * (base[:, None] + rise) + n_h * d
    return out


def _improve(
    loads: npt.NDArray[np.float64],
    free: npt.NDArray[np.int64],
    where: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.float64],
    hs: npt.NDArray[np.float64],
    n_ranks: int,
    plateau: bool = True,
) -> int:
    """Apply the single best improving move (1), else a J-neutral one that spreads the load
    less (2, when `plateau`); 0 when there is none.

    Exchanges of x admitted on rank a with a pooled y are scored in closed form per x
    (`_pooled_gain`: U·P searches, no [U × P × step] block); with y admitted on b ≠ a as
    one [admitted × admitted × step] block (the maximum outside a and b: one row per pair).
    The scores are exactly those of scoring each pair on its own step by step."""
    top = loads.max(axis=0)
    idx, vals = _top3(loads)
    admitted = np.flatnonzero(where >= 0)
    n_pool, n_h = len(sizes), len(hs)
    n_adm = len(admitted)
    ra = where[admitted]  # [U] each admitted request's rank
    la = loads[ra]  # [U, H+1]
    d = sizes[admitted][:, None] - sizes[None, :]  # [U, P]: s_x − s_y
    # x ↔ pooled y: rank a sheds d, the new maximum is a's or the best outside a (o):
    # Σ_h max(la_h − d, o_h) = Σ_h o_h + Σ_{h: e_h > d} (e_h − d) with e = la − o, a
    # piecewise-linear function of d evaluated for every y from x's sorted e and its
    # prefix sums (the rows are x's, U·P searches instead of a U·P·(H+1) block). Every
    # column gets this score; the admitted ones are overwritten below.
    outside_a = np.where(idx[0] != ra[:, None], vals[0], vals[1])  # [U, H+1]
    gain = _pooled_gain(sizes, sizes[admitted], la, outside_a, d, top, n_ranks)
    if n_adm > 1:  # x ↔ y admitted on b: b gains d too, and the best outside both;
        # symmetric in (x, y) (the same maxima of the same values), so one triangle
        xs, ys = _pairs(n_adm)
        outside_ab = _max_outside(idx, vals, ra[xs], ra[ys])
        da = d[xs, admitted[ys]][:, None]
        new_top = np.maximum(np.maximum(outside_ab, la[xs] - da), la[ys] + da)
        np.subtract(new_top, top, out=new_top)
        pair = np.zeros((n_adm, n_adm))  # the diagonal is x itself: excluded below
        pair[xs, ys] = pair[ys, xs] = n_ranks * new_top.sum(axis=1)
        gain[:, admitted] = pair
    pooled = where < 0  # [P]
    same = ra[:, None] == where[None, :]  # y on x's own rank (x itself included): no exchange
    gain[same] = np.inf
    flat = gain.ravel()
    valid = n_adm * n_pool - int(same.sum())
    best_j = int(np.argmin(flat)) if valid else -1
    best = float(flat[best_j]) if best_j >= 0 else 0.0
    neutral_step = False
    if best >= -_EPS and valid and plateau:
        # a plateau (two ranks tie at a maximum: lowering one alone gains nothing): take the
        # J-neutral exchange that spreads the load least (Σ L² falls), so the next move can
        # lower the maximum; Σ L² strictly falls, so this cannot cycle
        neutral = np.flatnonzero(flat <= _EPS)
        if len(neutral):
            xs, ys = np.divmod(neutral, n_pool)
            # Σ_h ((L_a − d)² − L_a²) + Σ_h ((L_b + d)² − L_b²), expanded: from each
            # rank's Σ_h L (exact integers, the same values as summing step by step)
            dn = d[xs, ys]
            sums = loads.sum(axis=1)
            spread = n_h * dn**2 - 2 * dn * sums[ra[xs]]
            on_b = ~pooled[ys]
            spread[on_b] += n_h * dn[on_b] ** 2 + 2 * dn[on_b] * sums[where[ys[on_b]]]
            k = int(np.argmin(spread))
            if float(spread[k]) < -1e-6:
                best_j, best, neutral_step = int(neutral[k]), -1.0, True  # as if it improved

    # moves: x admitted on a to a rank c that still has an empty slot
    open_ranks = np.flatnonzero(free > 0)
    move: tuple[int, int] | None = None
    if len(open_ranks):
        mx = np.repeat(admitted, len(open_ranks))
        mc = np.tile(open_ranks, len(admitted))
        ma = where[mx]
        ok = ma != mc
        mx, mc, ma = mx[ok], mc[ok], ma[ok]
        w = sizes[mx][:, None] + hs
        m_top = np.maximum(
            _max_outside(idx, vals, ma, mc), np.maximum(loads[ma] - w, loads[mc] + w)
        )
        m_gain = n_ranks * (m_top - top).sum(axis=1)
        if len(m_gain) and float(m_gain.min()) < best:
            j = int(np.argmin(m_gain))
            best, move = float(m_gain[j]), (int(mx[j]), int(mc[j]))

    if best >= -_EPS:
        return 0
    if move is not None:
        i, c = move
        w1 = sizes[i] + hs
        loads[where[i]] -= w1
        free[where[i]] += 1
        loads[c] += w1
        free[c] -= 1
        where[i] = c
        return 1
    jx, yi = divmod(best_j, n_pool)
    xi = int(admitted[jx])
    rank_a, rank_b = int(where[xi]), int(where[yi])
    shift = sizes[xi] - sizes[yi]
    loads[rank_a] -= shift
    if rank_b >= 0:
        loads[rank_b] += shift
    where[xi], where[yi] = rank_b, rank_a
    return 2 if neutral_step else 1
