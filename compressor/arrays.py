"""Sort-based set operations on small integer arrays, for the compressor's hot path.

NumPy 2's `np.unique` goes through a hash table and a final sort, with a fixed cost of
tens of microseconds per call: on the few thousand int64 values a 10K-token prompt gives
(unit boundaries, term ids, (unit, term) keys) a plain `np.sort` and a neighbour
comparison are 3–4× faster. The results are the same arrays `np.unique` returns (sorted
unique values, inverse indices, counts); tests/unit/compressor/test_arrays.py checks it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


def unique(values: IntArray) -> IntArray:
    """`np.unique(values)`: the sorted distinct values."""
    s = np.sort(values)
    if len(s) < 2:
        return s
    new = np.empty(len(s), dtype=np.bool_)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    out: IntArray = s[new]
    return out


def unique_inverse(values: IntArray) -> tuple[IntArray, IntArray]:
    """`np.unique(values, return_inverse=True)`: distinct values and, per element, the
    index of its value among them."""
    order = np.argsort(values, kind="stable")
    s = values[order]
    new = np.empty(len(s), dtype=np.bool_)
    if len(s):
        new[0] = True
        np.not_equal(s[1:], s[:-1], out=new[1:])
    rank = np.cumsum(new) - 1
    inverse = np.empty(len(s), dtype=np.int64)
    inverse[order] = rank
    uniq: IntArray = s[new]
    return uniq, inverse


def unique_counts(values: IntArray) -> tuple[IntArray, IntArray]:
    """`np.unique(values, return_counts=True)`: distinct values and how often each occurs."""
    s = np.sort(values)
    if len(s) == 0:
        return s, np.zeros(0, dtype=np.int64)
    new = np.empty(len(s), dtype=np.bool_)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    first = np.flatnonzero(new)
    counts: IntArray = np.diff(first, append=len(s))
    uniq: IntArray = s[first]
    return uniq, counts


def member(values: IntArray, table: IntArray) -> npt.NDArray[np.bool_]:
    """`np.isin(values, table)` for a sorted, distinct `table`."""
    if len(table) == 0:
        return np.zeros(len(values), dtype=np.bool_)
    at = np.minimum(np.searchsorted(table, values), len(table) - 1)
    out: npt.NDArray[np.bool_] = table[at] == values
    return out
