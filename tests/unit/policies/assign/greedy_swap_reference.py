"""The `greedy_swap` of commit a5e71e9, kept unchanged as the reference that the faster
implementation (policies/assign/greedy_swap.py) must match decision for decision: see
test_greedy_swap_reference.py. Not product code; do not edit except to fix the reference.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import numpy.typing as npt

from policies.assign.registry import Decision
from policies.assign.state import Instance, objective

_EPS = 1e-9


def greedy_swap(inst: Instance, max_rounds: int | None = None) -> Decision:
    u = inst.fillable
    if u == 0:
        return []
    # Starts: the greedy under the current per-step maxima, and (with a window) under a
    # ceiling raised to the window's highest and median maximum. J rewards admitting large
    # requests up to a maximum that one step already sets, which needs several ranks to
    # rise together: no single exchange gets there from the first start.
    top = inst.base.max(axis=0)
    levels: list[float | None] = [None]
    if inst.horizon > 1:
        levels += sorted({float(q) for q in np.quantile(top, (1.0, 0.75, 0.5, 0.25))}, reverse=True)
    # every start's greedy is cheap (all run at once, one array per start); only the best
    # one is polished by the swap search, from its greedy state
    states = _greedy(inst, levels)
    scored = [(objective(inst, _decision(st[2])), n) for n, st in enumerate(states)]
    loads, free, where = states[min(scored)[1]]
    rounds = min(8 * u + 16, 64) if max_rounds is None else max_rounds
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
        room = (ceiling[:, None, :] - loads - hs).min(axis=2)
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
        rise = np.maximum(loads + w[:, None, :] - ceiling[:, None, :], 0.0).sum(axis=2)
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

    Exchanges are scored as one [admitted × pool × step] block: x admitted on rank a with
    every y, pooled (b = −1: the maximum outside a is one row per x) or admitted on b ≠ a
    (the maximum outside a and b: one row per pair of admitted requests); the same values,
    in the same order, as scoring each pair on its own, with a third of the array passes."""
    top = loads.max(axis=0)
    idx, vals = _top3(loads)
    admitted = np.flatnonzero(where >= 0)
    n_pool, n_h = len(sizes), len(hs)
    n_adm = len(admitted)
    ra = where[admitted]  # [U] each admitted request's rank
    la = loads[ra]  # [U, H+1]
    pooled = where < 0  # [P]
    d = sizes[admitted][:, None] - sizes[None, :]  # [U, P]: s_x − s_y
    # x ↔ pooled y: rank a sheds d; the new maximum is a's or the best outside a
    outside_a = _max_outside(idx, vals, ra, np.full(n_adm, -1, dtype=np.int64))
    # one [U, P, H+1] buffer, reused in place (a fresh one per pass costs page faults)
    new_top = np.subtract(la[:, None, :], d[:, :, None])
    np.maximum(new_top, outside_a[:, None, :], out=new_top)
    if n_adm > 1:  # x ↔ y admitted on b: b gains d too, and the best outside both
        pa, pb = np.repeat(ra, n_adm), np.tile(ra, n_adm)
        outside_ab = _max_outside(idx, vals, pa, pb).reshape(n_adm, n_adm, n_h)
        da = d[:, admitted][:, :, None]
        new_top[:, admitted, :] = np.maximum(
            np.maximum(outside_ab, la[:, None, :] - da), la[None, :, :] + da
        )
    np.subtract(new_top, top, out=new_top)
    gain = n_ranks * new_top.sum(axis=2) + np.where(pooled[None, :], d * n_h, 0.0)
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
            dn = d[xs, ys][:, None]
            lx = la[xs]
            lb = np.where(pooled[ys][:, None], 0.0, loads[np.maximum(where[ys], 0)])
            spread = ((lx - dn) ** 2 - lx**2).sum(axis=1) + np.where(
                pooled[ys], 0.0, ((lb + dn) ** 2 - lb**2).sum(axis=1)
            )
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
