"""Properties of the planner's Erlang-C and sizing (hypothesis)."""

from __future__ import annotations

import math
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.planner.erlang import (
    Binding,
    erlang_c,
    log_erlang_c,
    log_erlang_c_bound,
    p99_wait,
    size_pool,
)

rhos = st.floats(min_value=1e-3, max_value=0.999, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(c=st.integers(1, 40), num=st.integers(1, 999))
def test_agrees_with_fractions(c: int, num: int) -> None:
    a = Fraction(num, 1000) * c
    last = a**c / math.factorial(c) * Fraction(c) / (c - a)
    head = sum((a**k / math.factorial(k) for k in range(c)), Fraction(0))
    exact = float(last / (head + last))
    got = erlang_c(c, float(a))
    assert math.isclose(got, exact, rel_tol=1e-9, abs_tol=1e-300)


@settings(max_examples=40, deadline=None)
@given(c=st.integers(1, 60_000), rho=rhos)
def test_log_space_is_finite_probability_and_bounded(c: int, rho: float) -> None:
    a = rho * c
    log_c = log_erlang_c(c, a)
    assert math.isfinite(log_c) and log_c <= 1e-12
    if c >= a + 1 / 3:
        assert log_c <= log_erlang_c_bound(c, a) + 1e-9


@settings(max_examples=40, deadline=None)
@given(c=st.integers(2, 5000), rho=st.floats(0.05, 0.95))
def test_monotone_in_servers_and_load(c: int, rho: float) -> None:
    a = rho * c
    assert log_erlang_c(c + 1, a) <= log_erlang_c(c, a) + 1e-12
    assert log_erlang_c(c, a * 1.01) >= log_erlang_c(c, a) - 1e-12


@settings(max_examples=60, deadline=None)
@given(
    lam=st.floats(0.01, 3000.0),
    mu=st.floats(0.01, 100.0),
    slots=st.sampled_from([1, 4, 16, 128, 682]),
    cv2=st.floats(0.01, 4.0),
    budget=st.floats(0.001, 2.0),
)
def test_size_pool_is_the_minimum(
    lam: float, mu: float, slots: int, cv2: float, budget: float
) -> None:
    s = size_pool(lam, mu, slots, cv2, budget)
    assert s.n >= math.ceil(lam / (mu * 0.85)) and s.n >= math.ceil(lam / mu) + 1
    assert s.rho <= 0.85 + 1e-12
    assert p99_wait(s.n, lam, mu, slots, cv2) <= budget
    if s.binding is Binding.SLO:
        assert p99_wait(s.n - 1, lam, mu, slots, cv2) > budget
