"""BF-IO's integer program solved exactly (scipy.optimize.milp, i.e. HiGHS): the test oracle.

(IO) min_x Σ_{h=0..H} Imb(k+h), Imb = G·max_g L_g − Σ_g L_g, subject to: each pooled request
on at most one rank, at most free_g new requests on rank g, exactly U = min(|pool|, Σ free)
admitted. Made linear with one continuous M_h ≥ L_g(k+h) per step of the window:

    min  Σ_h G·M_h − Σ_{i,g} x_ig·Σ_h (s_i + h)        (− Σ_h Σ_g base[g,h], a constant)
    s.t. Σ_i (s_i + h)·x_ig − M_h ≤ −base[g, h]      for every rank g and step h
         Σ_g x_ig ≤ 1,  Σ_i x_ig ≤ free_g,  Σ x = U,  x binary

|pool|·G' binaries (G' = ranks with a free slot) and H+1 continuous variables. The relative
MIP gap is 0, so the optimum is exact for integer data. scipy is imported on first use: the
gateway imports policies/ and should not pay for it.
"""

from __future__ import annotations

import numpy as np

from policies.assign.registry import Decision
from policies.assign.state import Instance


def solve_milp(inst: Instance) -> Decision:
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix, vstack

    u = inst.fillable
    if u == 0:
        return []
    open_ranks = np.flatnonzero(inst.free > 0)
    n_pool, n_open, n_h = len(inst.sizes), len(open_ranks), inst.horizon
    n_x = n_pool * n_open
    hs = np.arange(n_h, dtype=np.float64)
    sizes = inst.sizes.astype(np.float64)
    pool_of = np.repeat(np.arange(n_pool), n_open)  # x index -> pooled request
    rank_of = np.tile(np.arange(n_open), n_pool)  # x index -> position in open_ranks

    c = np.concatenate([-(n_h * sizes[pool_of] + hs.sum()), np.full(n_h, float(inst.ranks))])

    # load rows (open ranks): Σ_i (s_i + h) x_ig − M_h ≤ −base[g, h]
    rows, cols, vals = [], [], []
    for h in range(n_h):
        rows.append(h * n_open + rank_of)
        cols.append(np.arange(n_x))
        vals.append(sizes[pool_of] + h)
        rows.append(h * n_open + np.arange(n_open))
        cols.append(np.full(n_open, n_x + h))
        vals.append(np.full(n_open, -1.0))
    load = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(n_h * n_open, n_x + n_h),
    )
    load_ub = -inst.base[open_ranks].T.reshape(-1)
    once = coo_matrix((np.ones(n_x), (pool_of, np.arange(n_x))), shape=(n_pool, n_x + n_h))
    cap = coo_matrix((np.ones(n_x), (rank_of, np.arange(n_x))), shape=(n_open, n_x + n_h))
    total = coo_matrix((np.ones(n_x), (np.zeros(n_x), np.arange(n_x))), shape=(1, n_x + n_h))
    a = vstack([load, once, cap, total]).tocsr()
    lb = np.concatenate([np.full(n_h * n_open + n_pool + n_open, -np.inf), [u]])
    ub = np.concatenate([load_ub, np.ones(n_pool), inst.free[open_ranks].astype(float), [u]])

    # M_h is at least every rank's resident load (full ranks have no variables to constrain)
    m_lb = inst.base.max(axis=0)
    bounds = Bounds(
        np.concatenate([np.zeros(n_x), m_lb]), np.concatenate([np.ones(n_x), np.full(n_h, np.inf)])
    )
    integrality = np.concatenate([np.ones(n_x), np.zeros(n_h)])
    res = milp(
        c,
        constraints=LinearConstraint(a, lb, ub),
        integrality=integrality,
        bounds=bounds,
        options={"mip_rel_gap": 0.0},
    )
    if res.x is None:  # cannot happen: U admissions are always feasible
        raise RuntimeError(f"bfio milp: no solution ({res.message})")
    chosen = np.flatnonzero(res.x[:n_x] > 0.5)
    return sorted((int(pool_of[j]), int(open_ranks[rank_of[j]])) for j in chosen)
