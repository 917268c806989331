"""The faster greedy_swap (closed-form pooled exchanges, expanded plateau spread, J from
each start's loads) takes exactly the decisions of the implementation it replaced, kept
unchanged in greedy_swap_reference.py, on fixed-seed instances: integer-valued loads and
sizes as every driver supplies (token counts), where both compute the same exact integers.
Half the instances use tiny sizes and loads so that ties (J-neutral plateaus, equal gains)
are everywhere and the tie-breaks are compared too."""

import numpy as np
import pytest

from policies.assign.greedy_swap import greedy_swap
from policies.assign.state import Instance
from tests.unit.policies.assign.greedy_swap_reference import greedy_swap as reference


def instance(rng: np.random.Generator, ranks: int, pool: int, lookahead: int, tiny: bool):
    slots = int(rng.integers(2, 9))
    free = rng.integers(0, slots + 1, ranks)
    count = slots - free
    hs = np.arange(lookahead + 1)
    base = np.zeros((ranks, lookahead + 1))
    for g in range(ranks):
        if tiny:
            context = rng.integers(1, 6, count[g]).astype(np.float64)
            remaining = rng.integers(1, lookahead + 3, count[g])
        else:
            context = rng.lognormal(6.2, 1.0, count[g]).clip(1, 8192).round()
            remaining = rng.geometric(1 / 30, count[g])
        base[g] = np.where(hs[None, :] < remaining[:, None], context[:, None] + hs, 0).sum(0)
    sizes = (
        rng.integers(1, 6, pool) if tiny else rng.lognormal(6.2, 1.0, pool).clip(1, 8192)
    ).astype(np.int64)
    return Instance(base, free.astype(np.int64), count.astype(np.int64), sizes, np.zeros(pool))


@pytest.mark.parametrize("seed", range(4))
def test_same_decisions_as_the_reference_on_small_instances(seed):
    rng = np.random.default_rng(9000 + seed)
    for n in range(100):
        inst = instance(
            rng,
            ranks=int(rng.integers(1, 9)),
            pool=int(rng.integers(1, 41)),
            lookahead=int(rng.integers(0, 6)),
            tiny=n % 2 == 0,
        )
        assert greedy_swap(inst) == reference(inst), (seed, n)


def test_same_decisions_as_the_reference_at_the_benchmark_size():
    """G = 32, pool 128, lookahead 20, a few free slots per rank as in steady state."""
    rng = np.random.default_rng(2026)
    for n in range(6):
        inst = instance(rng, ranks=32, pool=128, lookahead=20, tiny=n % 3 == 0)
        assert greedy_swap(inst) == reference(inst), n
