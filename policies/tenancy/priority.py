"""Priority, debt and burst (the token-pools paper, §3.3, Eqs. 1–3).

Priority (Eq. 1), one scalar that orders every admission decision under contention:

    w_e = w_κ · (1 + α_slo·ℓ*_e/ℓ̄*)⁻¹ · (1 + α_burst·b_e)⁻¹ · (1 + α_debt·d_e)

w_κ the class weight (Table 1), ℓ*_e the SLO target and ℓ̄* the pool's average over its
bound entitlements (a tighter target, a higher priority), b_e the burst intensity, d_e the
service debt. Defaults are the paper's: α_slo 2.0, α_burst 1.0, α_debt 4.0.

Debt (Eq. 2), an EWMA of the service gap g_e = (λ_e − λ̂_e)/λ_e:

    d_e(k) = γ_d·d_e(k−1) + (1 − γ_d)·g_e(k)        γ_d = 0.7

positive while underserved (priority rises), negative while bursting above baseline
(priority falls); γ_d is the anti-windup of this integral term. One deviation, stated:
the gap counts only *unmet demand* — an entitlement served all it asked for is not
underserved, however far below baseline it asked (otherwise an idle elastic tenant would
accrue debt forever). Underservice is min(λ_e, λ̂_e + refused_e) − λ̂_e.

Burst (Eq. 3), overconsumption above baseline summed over the three dimensions,

    δ_e = max(0, λ̂_e/λ_e − 1) + max(0, χ̂_e/χ_e − 1) + max(0, r̂_e/r_e − 1)
    b_e(k) = γ_b·b_e(k−1) + (1 − γ_b)·δ_e(k)

so a brief burst costs little and a sustained one lowers priority. The paper gives no γ_b;
it defaults to γ_d's 0.7.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.tenancy.classes import CLASS_WEIGHTS, ServiceClass


@dataclass(frozen=True, slots=True)
class PriorityConfig:
    alpha_slo: float = 2.0  # sensitivity to SLO tightness (paper's typical value)
    alpha_burst: float = 1.0  # sensitivity to sustained bursting
    alpha_debt: float = 4.0  # sensitivity to accumulated underservice
    gamma_debt: float = 0.7  # γ_d: the debt EWMA's memory (paper: tuned by hand)
    gamma_burst: float = 0.7  # γ_b: not given by the paper; γ_d's value
    class_weights: Mapping[ServiceClass, float] = field(default_factory=lambda: dict(CLASS_WEIGHTS))

    def __post_init__(self) -> None:
        if min(self.alpha_slo, self.alpha_burst, self.alpha_debt) < 0:
            raise ValueError("priority: the α coefficients cannot be negative")
        if not (0.0 <= self.gamma_debt < 1.0 and 0.0 <= self.gamma_burst < 1.0):
            raise ValueError("priority: γ_d and γ_b must be in [0, 1)")


def priority(
    service_class: ServiceClass,
    slo_target_s: float | None,
    pool_mean_slo_s: float | None,
    burst: float,
    debt: float,
    config: PriorityConfig,
) -> float:
    """Eq. 1. Without an SLO (or a pool average) the SLO term is its neutral 1/(1 + α_slo).
    A debt below −1/α_debt would make the priority negative: it is floored at zero."""
    ratio = 1.0
    if slo_target_s is not None and pool_mean_slo_s:
        ratio = slo_target_s / pool_mean_slo_s
    w = config.class_weights[service_class]
    w /= 1.0 + config.alpha_slo * ratio
    w /= 1.0 + config.alpha_burst * max(0.0, burst)
    return max(0.0, w * (1.0 + config.alpha_debt * debt))


def service_gap(baseline: float, served: float, refused: float) -> float:
    """g_e, positive while demand went unmet below baseline, negative while served above
    it; 0 without a baseline (spot, preemptible)."""
    if baseline <= 0:
        return 0.0
    if served >= baseline:
        return (baseline - served) / baseline
    return (min(baseline, served + refused) - served) / baseline


def ewma(previous: float, sample: float, gamma: float) -> float:
    """x(k) = γ·x(k−1) + (1 − γ)·sample(k): Eq. 2 for debt, Eq. 3's update for burst."""
    return gamma * previous + (1.0 - gamma) * sample


def burst_excess(
    tokens_per_s: float, kv_bytes: float, concurrency: float, baseline: tuple[float, float, float]
) -> float:
    """δ_e of Eq. 3: how far above baseline, summed over throughput, KV and concurrency;
    a dimension without a baseline contributes nothing."""
    total = 0.0
    for used, base in zip((tokens_per_s, kv_bytes, concurrency), baseline, strict=True):
        if base > 0:
            total += max(0.0, used / base - 1.0)
    return total


def pool_mean_slo(targets: list[float | None]) -> float | None:
    """ℓ̄*: the mean SLO target over a pool's bound entitlements that set one."""
    known = [t for t in targets if t is not None]
    return sum(known) / len(known) if known else None
