"""Erlang-C against a direct computation, stability at large c, Kimura and Eq. 11 sizing."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from policies.planner.erlang import (
    Binding,
    erlang_c,
    kimura_p99_wait,
    log_erlang_c,
    log_erlang_c_bound,
    p99_wait,
    size_pool,
    size_pools,
)


def erlang_c_fraction(c: int, a: Fraction) -> Fraction:
    """Eq. 5 in exact rational arithmetic with math.factorial."""
    last = a**c / math.factorial(c) * Fraction(c) / (c - a)
    head = sum((a**k / math.factorial(k) for k in range(c)), Fraction(0))
    return last / (head + last)


@pytest.mark.parametrize("c", [1, 2, 3, 5, 8, 13, 21, 34, 55, 89])
@pytest.mark.parametrize(
    "rho", [Fraction(1, 10), Fraction(1, 2), Fraction(17, 20), Fraction(99, 100)]
)
def test_matches_exact_fractions(c: int, rho: Fraction) -> None:
    a = rho * c
    exact = erlang_c_fraction(c, a)
    assert erlang_c(c, float(a)) == pytest.approx(float(exact), rel=1e-10)
    assert log_erlang_c(c, float(a)) == pytest.approx(math.log(exact), rel=1e-9, abs=1e-12)


def test_single_server_is_rho() -> None:
    # M/M/1: P(wait) = ρ
    for rho in (0.1, 0.5, 0.9):
        assert erlang_c(1, rho) == pytest.approx(rho)


def _erlang_b_recursion(c: int, a: float) -> float:
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return b


@pytest.mark.parametrize("rho", [0.5, 0.85, 0.95, 0.99, 0.999])
def test_finite_at_fifty_thousand_servers(rho: float) -> None:
    c = 50_000
    a = rho * c
    log_c = log_erlang_c(c, a)
    assert math.isfinite(log_c) and log_c <= 0.0
    assert 0.0 <= erlang_c(c, a) <= 1.0
    assert log_c <= log_erlang_c_bound(c, a)
    b = _erlang_b_recursion(c, a)  # an independent method, while it does not underflow
    if b > 1e-290:
        assert log_c == pytest.approx(math.log(b / (1 - rho * (1 - b))), rel=1e-7)


def test_edges() -> None:
    assert log_erlang_c(10, 0.0) == -math.inf
    assert erlang_c(10, 10.0) == 1.0  # unstable: everyone waits
    with pytest.raises(ValueError):
        log_erlang_c(0, 1.0)


def test_kimura_p99() -> None:
    # Eq. 6 by hand: C = 0.5, c = 10 slots at μ = 1, λ = 8, C_s² = 1
    w = kimura_p99_wait(math.log(0.5), 10, 8.0, 1.0, 1.0)
    assert w == pytest.approx(math.log(50) * 2 / (2 * 2))
    assert kimura_p99_wait(math.log(0.005), 10, 8.0, 1.0, 1.0) == 0.0  # C ≤ 0.01
    assert kimura_p99_wait(0.0, 10, 10.0, 1.0, 1.0) == math.inf


def test_many_server_regime_is_rho_max_bound() -> None:
    # Azure's long pool at γ = 1 (§7.4): ρ_max binds, the wait is zero
    s = size_pool(101.79, 0.92, 16, 0.08, 0.38)
    assert s.binding is Binding.RHO_MAX and s.p99_wait_s == 0.0
    assert s.n == math.ceil(101.79 / (0.92 * 0.85))


def test_slo_binds_for_few_slow_slots() -> None:
    # one slot per GPU, long services, tight budget: Eq. 11 needs more than the cap
    lam, mu, cv2, budget = 5.0, 1.0, 1.0, 0.05
    s = size_pool(lam, mu, 1, cv2, budget)
    assert s.binding is Binding.SLO
    assert p99_wait(s.n, lam, mu, 1, cv2) <= budget < p99_wait(s.n - 1, lam, mu, 1, cv2)
    assert s.n > math.ceil(lam / (mu * 0.85))


def test_infeasible_floor_is_flagged_not_hidden() -> None:
    s = size_pool(100.0, 1.0, 16, 1.0, -0.2)
    assert s.binding is Binding.INFEASIBLE and not s.slo_met
    assert s.n == math.ceil(100.0 / 0.85)


def test_vectorised_equals_scalar() -> None:
    rng = np.random.default_rng(7)
    k = 400
    lam = rng.uniform(0.0, 2000.0, k)
    lam[:20] = 0.0
    mu = rng.uniform(0.05, 50.0, k)
    slots = rng.choice([1, 2, 16, 128, 682], k)
    cv2 = rng.uniform(0.01, 3.0, k)
    budget = rng.uniform(-0.1, 1.0, k)
    n, wait, bind = size_pools(lam, mu, slots, cv2, budget, 0.85, 1)
    for i in range(k):
        s = size_pool(float(lam[i]), float(mu[i]), int(slots[i]), float(cv2[i]), float(budget[i]))
        assert (int(n[i]), int(bind[i])) == (s.n, int(s.binding))
        assert float(wait[i]) == pytest.approx(s.p99_wait_s, abs=1e-12)
