"""Sort-based set operations (compressor/arrays.py) against NumPy's own."""

from __future__ import annotations

import numpy as np
import pytest

from compressor.arrays import member, unique, unique_counts, unique_inverse


@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000])
@pytest.mark.parametrize("high", [1, 5, 1 << 40])
def test_same_arrays_as_numpy_unique(size: int, high: int) -> None:
    rng = np.random.default_rng(size * 31 + high)
    values = rng.integers(-high, high + 1, size, dtype=np.int64)
    assert np.array_equal(unique(values), np.unique(values))
    uniq, inverse = unique_inverse(values)
    want_uniq, want_inverse = np.unique(values, return_inverse=True)
    assert np.array_equal(uniq, want_uniq) and np.array_equal(inverse, want_inverse)
    assert np.array_equal(uniq[inverse], values)
    uniq, counts = unique_counts(values)
    want_uniq, want_counts = np.unique(values, return_counts=True)
    assert np.array_equal(uniq, want_uniq) and np.array_equal(counts, want_counts)


def test_member_is_isin_for_a_sorted_table() -> None:
    rng = np.random.default_rng(3)
    values = rng.integers(0, 50, 200, dtype=np.int64)
    for table in (np.zeros(0, dtype=np.int64), np.array([7]), np.unique(values[:30])):
        assert np.array_equal(member(values, table), np.isin(values, table))
