"""Greedy selection (compressor/select.py)."""

from __future__ import annotations

import numpy as np

from compressor.select import greedy_select, trim


def test_greedy_takes_best_scores_that_fit_and_skips_too_large_ones() -> None:
    tokens = np.array([5, 50, 10, 10, 5], dtype=np.int64)
    score = np.array([0.0, 0.9, 0.8, 0.1, 0.0])
    mandatory = np.array([True, False, False, False, True])
    keep = greedy_select(tokens, score, mandatory, 32)
    assert keep is not None
    assert keep.tolist() == [True, False, True, True, True]  # 50 skipped, both 10s fit


def test_greedy_none_when_mandatory_exceeds_and_all_when_everything_fits() -> None:
    tokens = np.array([10, 10, 10], dtype=np.int64)
    score = np.zeros(3)
    assert greedy_select(tokens, score, np.array([True, True, False]), 15) is None
    keep = greedy_select(tokens, score, np.array([True, False, False]), 30)
    assert keep is not None and keep.all()


def test_ties_break_towards_earlier_units() -> None:
    tokens = np.ones(6, dtype=np.int64)
    keep = greedy_select(tokens, np.zeros(6), np.zeros(6, dtype=bool), 3)
    assert keep is not None and keep.tolist() == [True, True, True, False, False, False]


def test_trim_drops_lowest_scores_until_the_excess_is_gone() -> None:
    keep = np.array([True, True, True, True])
    tokens = np.array([4, 4, 4, 4], dtype=np.int64)
    score = np.array([0.5, 0.1, 0.2, 0.9])
    mandatory = np.array([True, False, False, False])
    assert trim(keep, tokens, score, mandatory, 5)
    assert keep.tolist() == [True, False, False, True]
    keep = np.array([True, False])
    assert not trim(keep, tokens[:2], score[:2], np.array([True, False]), 1)
