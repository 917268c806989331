"""The compiled greedy_swap (policies/assign/_greedy.c) against the numpy path it replaces
and the reference implementation (greedy_swap_reference.py): the same decisions on the
reference test's 406 fixed-seed instances (tiny sizes and loads half the time, so ties and
J-neutral plateaus are everywhere) and with capped rounds; loads that are not integers go
to the numpy path; bad arguments raise."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from policies.assign import compiled
from policies.assign.greedy_swap import greedy_swap, greedy_swap_compiled, greedy_swap_numpy
from policies.assign.state import Instance
from tests.unit.policies.assign.greedy_swap_reference import greedy_swap as reference
from tests.unit.policies.assign.test_greedy_swap_reference import instance

fast = pytest.importorskip("policies.assign._greedy")


@pytest.mark.skipif(
    not os.environ.get("CI") or shutil.which("cc") is None,
    reason="only CI insists: it installs with a C compiler",
)
@pytest.mark.skipif(
    os.environ.get("FLEETGATE_PURE", "") not in ("", "0"), reason="the pure path was asked for"
)
def test_ci_built_the_compiled_greedy():
    assert compiled.fast is not None, "policies/assign/_greedy.c was not built (setup.py)"


@pytest.mark.parametrize("seed", range(4))
def test_same_decisions_as_numpy_and_reference_on_small_instances(seed):
    rng = np.random.default_rng(9000 + seed)  # the reference test's instances
    for n in range(100):
        inst = instance(
            rng,
            ranks=int(rng.integers(1, 9)),
            pool=int(rng.integers(1, 41)),
            lookahead=int(rng.integers(0, 6)),
            tiny=n % 2 == 0,
        )
        got = greedy_swap_compiled(inst)
        assert got == greedy_swap_numpy(inst), (seed, n)
        assert got == reference(inst), (seed, n)


def test_same_decisions_at_the_benchmark_size():
    """G = 32, pool 128, lookahead 20 (the decision-cost benchmark's size)."""
    rng = np.random.default_rng(2026)
    for n in range(6):
        inst = instance(rng, ranks=32, pool=128, lookahead=20, tiny=n % 3 == 0)
        got = greedy_swap_compiled(inst)
        assert got == greedy_swap_numpy(inst) == reference(inst), n


@pytest.mark.parametrize("rounds", [0, 1, 2, 5])
def test_same_decisions_with_capped_rounds(rounds):
    """Round for round: stopping after `rounds` exchanges leaves the same state."""
    rng = np.random.default_rng(77 + rounds)
    for n in range(40):
        inst = instance(
            rng,
            ranks=int(rng.integers(2, 9)),
            pool=int(rng.integers(4, 41)),
            lookahead=int(rng.integers(0, 6)),
            tiny=n % 2 == 0,
        )
        assert greedy_swap_compiled(inst, rounds) == greedy_swap_numpy(inst, rounds), n


def test_non_integer_loads_take_the_numpy_path(monkeypatch):
    rng = np.random.default_rng(5)
    inst = instance(rng, ranks=6, pool=20, lookahead=3, tiny=False)
    fractional = Instance(inst.base + 0.3, inst.free, inst.count, inst.sizes, inst.waited)

    def refuse(*_args: object) -> None:
        raise AssertionError("the compiled path was called")

    monkeypatch.setattr("policies.assign.greedy_swap.greedy_swap_compiled", refuse)
    assert greedy_swap(fractional) == greedy_swap_numpy(fractional)


def test_bad_arguments_raise():
    base = np.zeros((2, 3))
    free = np.array([1, 1], dtype=np.int64)
    sizes = np.array([5.0, 7.0])
    order = np.array([0, 1], dtype=np.int64)
    levels = np.array([-np.inf])
    where = np.empty(2, dtype=np.int64)
    fast.greedy_swap(base, 3, free, sizes, order, levels, 2, 4, where)  # fine
    assert sorted(where.tolist()) == [0, 1]
    with pytest.raises(ValueError):  # base is not [G, horizon]
        fast.greedy_swap(base, 4, free, sizes, order, levels, 2, 4, where)
    with pytest.raises(ValueError):  # by_size is not a permutation
        fast.greedy_swap(base, 3, free, sizes, np.array([1, 1]), levels, 2, 4, where)
    with pytest.raises(ValueError):  # more admissions than free slots
        fast.greedy_swap(base, 3, np.array([1, 0]), sizes, order, levels, 2, 4, where)
    with pytest.raises(ValueError):  # where has the wrong length
        fast.greedy_swap(base, 3, free, sizes, order, levels, 2, 4, np.empty(3, np.int64))
    with pytest.raises(ValueError):  # a load that is not finite
        fast.greedy_swap(np.full((2, 3), np.nan), 3, free, sizes, order, levels, 2, 4, where)
    with pytest.raises(ValueError):  # a size that is not finite
        fast.greedy_swap(base, 3, free, np.array([5.0, np.inf]), order, levels, 2, 4, where)
    with pytest.raises(ValueError):  # no start
        fast.greedy_swap(base, 3, free, sizes, order, np.array([]), 2, 4, where)
