"""Erlang-C in log space, Kimura's P99 wait, and the per-pool GPU count (FleetOpt §3.1,
§4.1, Appendix A).

A pool of n GPUs is an M/G/c queue with c = n·n_max KV slots, each serving at
μ = 1/E[S]; its offered load is a = λ/μ erlangs and ρ = a/c. The probability that an
arrival waits (Eq. 5) is evaluated in the numerically stable form of Eq. 16,

    C(c, ρ) = 1 / (1 + (1 − ρ) · c! · Σ_{k<c} a^{k−c} / k!),

entirely in log space (log-sum-exp over the k terms, ln k! by cumulative sums), so that c
in the tens of thousands neither overflows nor underflows: ln C is returned, and C itself
may be 1e-400. Kimura's two-moment approximation (Eq. 6) gives the P99 wait

    W99 = ln(C / 0.01) · (1 + C_s²) / (2 (cμ − λ)),  taken as 0 when C ≤ 0.01.

Sizing (Eq. 11 with §4.1's cap): the smallest n ≥ max(⌈a_gpu⌉ + headroom, ⌈λ/(ρ_max μ_gpu)⌉)
with W99 ≤ the SLO budget, found by binary search upward from that floor (App. A; the
interval [n0, 10⌈a_gpu⌉] is doubled until it holds a feasible n). W99 falls monotonically
in n, so the search is exact.

Speed: the exact C is O(c). A rigorous O(1) upper bound decides almost every case first:
with X ~ Poisson(a), Erlang-B = P(X = c)/P(X ≤ c) and P(X ≤ c) ≥ 1/2 whenever c ≥ a + 1/3
(the Poisson median is below a + 1/3, Choi 1994), and C = B/(1 − ρ(1 − B)) ≤ B/(1 − ρ), so

    ln C ≤ ln 2 + c ln a − a − ln c! − ln(1 − ρ).

When that bound is already ≤ ln 0.01, W99 is exactly 0 and the O(c) sum is skipped — the
many-server regime of §7.4 where ρ_max alone binds.

Failure posture: a pool whose TTFT floor exceeds the SLO (budget < 0) cannot be fixed by
adding GPUs; it is sized by ρ_max alone and reported with slo_met = False.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

LOG_P99 = math.log(0.01)  # Kimura's tail: P(W > w) = 0.01
_LOG2 = math.log(2.0)


def log_erlang_c(c: int, a: float) -> float:
    """ln C(c, ρ = a/c): the log probability an arrival waits, exact (Eq. 16 in log space)."""
    if c <= 0:
        raise ValueError(f"c must be ≥ 1, got {c}")
    if a <= 0.0:
        return -math.inf
    if a >= c:
        return 0.0  # unstable queue: every arrival waits
    rho = a / c
    k = np.arange(c, dtype=np.float64)
    log_fact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, c, dtype=np.float64)))))
    log_terms = (k - c) * math.log(a) - log_fact
    peak = float(log_terms.max())
    log_sum = peak + math.log(float(np.exp(log_terms - peak).sum()))
    x = math.log1p(-rho) + math.lgamma(c + 1) + log_sum
    return -float(np.logaddexp(0.0, x))


def erlang_c(c: int, a: float) -> float:
    """C(c, ρ) of Eq. 5 (may underflow to 0.0 for huge c: use log_erlang_c)."""
    return math.exp(log_erlang_c(c, a))


def log_erlang_c_bound(c: int, a: float) -> float:
    """An O(1) upper bound on ln C(c, a), valid for c ≥ a + 1/3 (0.0 otherwise)."""
    if a <= 0.0:
        return -math.inf
    if c < a + 1.0 / 3.0:
        return 0.0
    bound = _LOG2 + c * math.log(a) - a - math.lgamma(c + 1) - math.log1p(-a / c)
    return min(0.0, bound)


def kimura_p99_wait(log_c: float, c: int, lam: float, mu_slot: float, cv2: float) -> float:
    """W99 of Eq. 6 in seconds, given ln C; 0 when C ≤ 0.01, inf when unstable."""
    slack = c * mu_slot - lam
    if slack <= 0:
        return math.inf
    if log_c <= LOG_P99:
        return 0.0
    return (log_c - LOG_P99) * (1.0 + cv2) / (2.0 * slack)


class Binding(IntEnum):
    """Which constraint set a pool's GPU count."""

    NONE = 0  # no traffic: no GPUs
    STABILITY = 1  # ⌈a⌉ + headroom (tiny pools)
    RHO_MAX = 2  # the utilisation cap (§4.1, the many-server regime)
    SLO = 3  # the P99 wait (Eq. 11) needed more GPUs than the cap
    INFEASIBLE = 4  # the TTFT floor alone exceeds the SLO: no n meets it


@dataclass(frozen=True, slots=True)
class Sizing:
    n: int
    rho: float  # λ / (n μ_gpu): the utilisation the analysis predicts (Table 5's ρ_ana)
    p99_wait_s: float
    binding: Binding

    @property
    def slo_met(self) -> bool:
        return self.binding is not Binding.INFEASIBLE


def p99_wait(n: int, lam: float, mu_gpu: float, n_slots: int, cv2: float) -> float:
    """Kimura's W99 for n GPUs of n_slots slots each (the bound first, exact if needed)."""
    if n <= 0:
        return math.inf
    c = n * n_slots
    a = lam * n_slots / mu_gpu
    log_c = log_erlang_c_bound(c, a)
    if log_c > LOG_P99:
        log_c = log_erlang_c(c, a)
    return kimura_p99_wait(log_c, c, lam, mu_gpu / n_slots, cv2)


def floor_gpus(lam: float, mu_gpu: float, rho_max: float, headroom: int) -> tuple[int, Binding]:
    """max(⌈a⌉ + headroom, ⌈λ/(ρ_max μ)⌉), in the reference's arithmetic order."""
    stab = math.ceil(lam / mu_gpu) + headroom
    cap = math.ceil(lam / (mu_gpu * rho_max))
    return (cap, Binding.RHO_MAX) if cap >= stab else (stab, Binding.STABILITY)


def size_pool(
    lam: float,
    mu_gpu: float,
    n_slots: int,
    cv2: float,
    budget_s: float,
    rho_max: float = 0.85,
    headroom: int = 1,
) -> Sizing:
    """The minimum GPU count of Eq. 11 under the ρ_max cap (budget_s = the wait allowed)."""
    if lam <= 0.0:
        return Sizing(0, 0.0, 0.0, Binding.NONE)
    n0, why = floor_gpus(lam, mu_gpu, rho_max, headroom)
    w0 = p99_wait(n0, lam, mu_gpu, n_slots, cv2)
    if budget_s < 0:
        return Sizing(n0, lam / (n0 * mu_gpu), w0, Binding.INFEASIBLE)
    if w0 <= budget_s:
        return Sizing(n0, lam / (n0 * mu_gpu), w0, why)
    lo, hi = n0, max(n0 + 1, 10 * math.ceil(lam / mu_gpu))
    while p99_wait(hi, lam, mu_gpu, n_slots, cv2) > budget_s:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # invariant: lo infeasible, hi feasible
        mid = (lo + hi) // 2
        if p99_wait(mid, lam, mu_gpu, n_slots, cv2) <= budget_s:
            hi = mid
        else:
            lo = mid
    return Sizing(hi, lam / (hi * mu_gpu), p99_wait(hi, lam, mu_gpu, n_slots, cv2), Binding.SLO)


# ── vectorised fast path for the sweep ──────────────────────────────────────────────
_SMALL = 64
_LOG_FACT_SMALL = np.array([math.lgamma(k + 1) for k in range(_SMALL)], dtype=np.float64)


def _log_factorial(n: FloatArray) -> FloatArray:
    """ln n! for non-negative integer-valued n: a table below 64, Stirling above (error < 1e-16)."""
    big = np.maximum(n, _SMALL)
    inv = 1.0 / big
    stirling = (
        big * np.log(big)
        - big
        + 0.5 * np.log(2.0 * math.pi * big)
        + inv * (1.0 / 12.0 - inv * inv * (1.0 / 360.0 - inv * inv / 1260.0))
    )
    small = _LOG_FACT_SMALL[np.minimum(n, _SMALL - 1).astype(np.int64)]
    result: FloatArray = np.where(n < _SMALL, small, stirling)
    return result


def size_pools(
    lam: FloatArray,
    mu_gpu: FloatArray,
    n_slots: IntArray,
    cv2: FloatArray,
    budget_s: FloatArray,
    rho_max: float,
    headroom: int,
) -> tuple[IntArray, FloatArray, IntArray]:
    """`size_pool` over arrays: (n, W99, Binding code). The O(1) bound settles every pool in
    the many-server regime; the rest fall back to the exact scalar search."""
    active = lam > 0.0
    safe_mu = np.where(active, mu_gpu, 1.0)
    stab = np.ceil(lam / safe_mu) + headroom
    cap = np.ceil(lam / (safe_mu * rho_max))
    n = np.where(active, np.maximum(stab, cap), 0.0)
    binding = np.where(
        active, np.where(cap >= stab, Binding.RHO_MAX, Binding.STABILITY), Binding.NONE
    ).astype(np.int64)
    c: FloatArray = n * n_slots.astype(np.float64)
    a: FloatArray = lam * n_slots / safe_mu
    with np.errstate(divide="ignore", invalid="ignore"):
        log_pmf: FloatArray = c * np.log(np.where(active, a, 1.0)) - a - _log_factorial(c)
        bound = _LOG2 + log_pmf - np.log1p(-a / np.where(active, c, 1.0))
    settled = ~active | ((bound <= LOG_P99) & (c >= a + 1.0 / 3.0))
    wait = np.zeros_like(lam)
    infeasible = active & (budget_s < 0)
    binding = np.where(settled & infeasible, Binding.INFEASIBLE, binding).astype(np.int64)
    n_out = n.astype(np.int64)
    for i in np.flatnonzero(~settled):
        s = size_pool(
            float(lam[i]),
            float(mu_gpu[i]),
            int(n_slots[i]),
            float(cv2[i]),
            float(budget_s[i]),
            rho_max,
            headroom,
        )
        n_out[i], wait[i], binding[i] = s.n, s.p99_wait_s, int(s.binding)
    return n_out, wait, binding
