"""Leases (policies/leases.py): whatever happens to a request, and in whatever order,
every count a lease took is given back exactly once."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.leases import Leases, WorkerSlot


@dataclass
class Load:
    pool: str = "short"
    in_flight: int = 0
    outstanding_tokens: int = 0


# arrive (take a slot), first token (nothing), complete, disconnect, error, retry on
# another worker, timeout, cancellation: every exit path is a release, some twice
EXITS = ("complete", "disconnect", "error", "timeout", "cancel")
op = st.one_of(
    st.tuples(st.just("dispatch"), st.integers(0, 3), st.integers(1, 10_000)),
    st.tuples(st.sampled_from(EXITS), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("retry"), st.integers(0, 50), st.integers(0, 3)),
)


@given(st.lists(op, max_size=80))
def test_any_interleaving_leaves_every_count_at_zero(ops):
    loads = [Load() for _ in range(4)]
    open_slots: list[WorkerSlot] = []
    every: list[WorkerSlot] = []
    for kind, a, b in ops:
        if kind == "dispatch":
            slot = WorkerSlot(loads[a], b)
            open_slots.append(slot)
            every.append(slot)
        elif kind == "retry" and open_slots:
            old = open_slots.pop(a % len(open_slots))
            old.release()  # the failed attempt's worker is given back first
            new = WorkerSlot(loads[b], old.tokens)
            open_slots.append(new)
            every.append(new)
        elif open_slots:
            slot = open_slots.pop(a % len(open_slots))
            slot.release()
            if b:
                slot.release()  # a second exit path for the same request: no effect
        for load in loads:
            assert load.in_flight >= 0 and load.outstanding_tokens >= 0
        # each count is exactly what the unreleased slots hold
        for load in loads:
            mine = [s for s in open_slots if s.load is load]
            assert load.in_flight == len(mine)
            assert load.outstanding_tokens == sum(s.tokens for s in mine)
    for slot in every:
        slot.release()
    assert all(load.in_flight == 0 and load.outstanding_tokens == 0 for load in loads)


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 100)), min_size=1, max_size=6),
       st.booleans())  # fmt: skip
def test_a_with_block_releases_on_every_exit(takes, fail):
    loads = [Load() for _ in range(3)]
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext():  # noqa: SIM117
        with Leases() as leases:
            for i, tokens in takes:
                leases.take(WorkerSlot(loads[i], tokens))
            assert sum(load.in_flight for load in loads) == len(takes)
            if fail:
                raise RuntimeError("the engine failed")
    assert all(load.in_flight == 0 and load.outstanding_tokens == 0 for load in loads)
    leases.release()  # again: nothing left to give back
    assert all(load.in_flight == 0 for load in loads)
