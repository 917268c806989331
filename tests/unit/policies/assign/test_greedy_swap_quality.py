"""greedy_swap, the live path, stays within 5 % of the exact MILP objective on random
G = 8 / pool = 32 instances (a fixed, seeded set), with and without a lookahead window."""

import numpy as np
import pytest

from policies.assign.greedy_swap import greedy_swap
from policies.assign.milp import solve_milp
from policies.assign.state import Instance, objective


def instance(rng: np.random.Generator, lookahead: int, ranks=8, pool=32, slots=16, max_free=3):
    """Residents and pool drawn like the simulator's BurstGPT-like fallback (lognormal
    prompts, geometric outputs); ranks with 0..max_free free slots, so U < |pool| and the
    policy chooses which requests to admit as well as where."""
    free = rng.integers(0, max_free + 1, ranks)
    free[0] = max(free[0], 1)
    count = slots - free
    hs = np.arange(lookahead + 1)
    base = np.zeros((ranks, lookahead + 1))
    for g in range(ranks):
        context = rng.lognormal(6.2, 1.0, count[g]).clip(1, 8192).round() + rng.geometric(
            1 / 280, count[g]
        )
        remaining = rng.geometric(1 / 30, count[g])  # some finish inside the window
        base[g] = np.where(hs[None, :] < remaining[:, None], context[:, None] + hs, 0).sum(0)
    sizes = rng.lognormal(6.2, 1.0, pool).clip(1, 8192).astype(np.int64)
    return Instance(base, free.astype(np.int64), count.astype(np.int64), sizes, np.zeros(pool))


@pytest.mark.slow
@pytest.mark.parametrize("lookahead", [0, 5])
def test_greedy_swap_within_5_percent_of_milp(lookahead):
    rng = np.random.default_rng(2026 + lookahead)
    gaps = []
    for _ in range(12):
        inst = instance(rng, lookahead)
        greedy, exact = objective(inst, greedy_swap(inst)), objective(inst, solve_milp(inst))
        assert greedy >= exact - 1e-6 * max(1.0, exact)  # the MILP is the optimum
        gaps.append((greedy - exact) / exact)
    assert max(gaps) <= 0.05, gaps
