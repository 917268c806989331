"""The control step: every interval, observed usage → debt, burst, priority (§3.3, §4.3).

Each control interval (the paper's k) a pool's view — every entitlement's cumulative
counters and current holds — becomes, per entitlement:

    λ̂_e = Δ tokens charged / Δt        refused_e = Δ tokens refused / Δt
    χ̂_e, r̂_e = KV bytes and slots held now
    g_e  = service_gap(λ_e, λ̂_e, refused_e)           (priority.py; 0 for spot/preemptible)
    d_e  ← γ_d·d_e + (1 − γ_d)·g_e                      (Eq. 2)
    b_e  ← γ_b·b_e + (1 − γ_b)·δ_e(λ̂_e, χ̂_e, r̂_e)      (Eq. 3)
    w_e  = Eq. 1 with ℓ̄* the mean SLO of the pool's bound entitlements

A store applies the result only if no other replica has stepped the pool since this view
was taken (compare-and-set on the step time), so with N gateway replicas each interval is
stepped once, by whichever replica gets there first; the equations live only here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policies.tenancy.bucket import MICRO, MILLI
from policies.tenancy.entitlement import Entitlement, EntitlementState
from policies.tenancy.priority import (
    PriorityConfig,
    burst_excess,
    ewma,
    pool_mean_slo,
    priority,
    service_gap,
)


@dataclass(frozen=True, slots=True)
class Usage:
    """One entitlement in a pool's view: its definition, holds, counters, dynamics."""

    definition: Entitlement
    in_flight: int
    kv: int
    charged: int  # milli-tokens, cumulative
    refused: int  # milli-tokens, cumulative
    charged_mark: int  # `charged` at the last step
    refused_mark: int
    debt: float
    burst: float
    priority: float
    admitted: int = 0  # requests admitted, cumulative
    refusals: Mapping[str, int] | None = None  # refusals by check, cumulative


@dataclass(frozen=True, slots=True)
class PoolView:
    pool: str
    now_us: int
    step_us: int  # the last step's time (-1: never stepped)
    in_flight: int
    kv: int
    threshold: float | None
    typical_s: float
    entitlements: tuple[Usage, ...]
    holds: int = 0


@dataclass(frozen=True, slots=True)
class Dynamics:
    """What a step writes back for one entitlement."""

    debt: float
    burst: float
    priority: float
    charged_mark: int
    refused_mark: int


def priorities(
    entitlements: Iterable[Entitlement],
    dynamics: Mapping[str, tuple[float, float]],
    config: PriorityConfig,
) -> dict[str, float]:
    """Eq. 1 for each entitlement, ℓ̄* over the bound ones; `dynamics`: name → (debt, burst)."""
    ents = list(entitlements)
    mean = pool_mean_slo([e.slo_target_s for e in ents if e.state is EntitlementState.BOUND])
    out = {}
    for e in ents:
        debt, burst = dynamics.get(e.name, (0.0, 0.0))
        out[e.name] = priority(e.service_class, e.slo_target_s, mean, burst, debt, config)
    return out


def step(view: PoolView, config: PriorityConfig) -> dict[str, Dynamics]:
    """One control interval over `view`. The first step (no previous one) only sets the
    marks and the priorities: there is no interval to measure a rate over yet."""
    dt = (view.now_us - view.step_us) / MICRO if view.step_us >= 0 else 0.0
    updated: dict[str, tuple[float, float]] = {}
    for u in view.entitlements:
        e = u.definition
        debt, burst = u.debt, u.burst
        if dt > 0:
            served = (u.charged - u.charged_mark) / MILLI / dt
            refused = (u.refused - u.refused_mark) / MILLI / dt
            gap = service_gap(e.tokens_per_s, served, refused) if e.rules.accrues_debt else 0.0
            debt = ewma(debt, gap, config.gamma_debt)
            excess = burst_excess(
                served, u.kv, u.in_flight, (e.tokens_per_s, e.kv_bytes, e.concurrency)
            )
            burst = ewma(burst, excess, config.gamma_burst)
        updated[e.name] = (debt, burst)
    weights = priorities((u.definition for u in view.entitlements), updated, config)
    return {
        u.definition.name: Dynamics(
            updated[u.definition.name][0],
            updated[u.definition.name][1],
            weights[u.definition.name],
            u.charged,
            u.refused,
        )
        for u in view.entitlements
    }
