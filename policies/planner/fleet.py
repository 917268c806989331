"""The planner's answer: the optimum and the baselines of FleetOpt Table 3 (§7.1–7.2).

`plan` runs Algorithm 1 (calibrate + sweep) and reads four fleets off the grid:
- homogeneous: one pool sized for the long context, all traffic;
- pool routing (PR): two pools at the reference boundary B_ref, γ = 1 (no compression);
- PR + C&R: γ = 1.5 (`retrofit_gamma`) at the same B_ref, the long pool co-sized for the
  compressed λ_l;
- FleetOpt: the argmin over the calibrated grid (γ*, and B* when B was swept).
B_ref is the fixed B when only γ is swept (Table 3), else the one given (the paper's B for
the workload, or the deployed one), else the cheapest pool-routing boundary: the baselines
are what one would run *without* FleetOpt's co-design, so they are never read at B*, which
only co-design finds.
Each row carries per-pool utilisation ρ = λ_p/(n μ_gpu) (Table 5's ρ_ana), the Kimura P99
wait, the TTFT floor and which constraint bound the GPU count, so that a reader can see
why a number is what it is. Annualised cost is $/GPU-hr × 8,760 h (Table 3).

`evaluate` prices a given fleet (n_s, n_l) at a given (B, γ) — the "current configuration"
of a live gateway — with the same model, so it can be shown next to the recommendation.
Failure posture: a (B, γ) outside the calibrated grid raises KeyError; nothing is guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.planner.erlang import Binding, p99_wait
from policies.planner.options import DEFAULT, GAMMAS, PlannerOptions
from policies.planner.profile import HOURS_PER_YEAR
from policies.planner.sweep import (
    MAX_SHORT_SHARE,
    FleetSpec,
    Sweep,
    calibrate,
    cheapest_cell,
    load_occupancy,
    sweep,
)
from policies.planner.workload import LengthCdf

RETROFIT_GAMMA = 1.5  # §7.1 baseline 3: C&R at γ = 1.5 on the pool-routing boundary


@dataclass(frozen=True, slots=True)
class PoolReport:
    """One pool of one fleet, as sized."""

    n: int
    rate: float  # λ_p, req/s
    n_slots: int  # n_max per GPU
    mu_gpu: float  # req/s per GPU at full occupancy
    cv2: float  # C_s²
    rho: float  # λ_p / (n μ_gpu): full-batch utilisation (Table 5's ρ_ana)
    rho_load: float  # busy-slot fraction with batch-accurate iterations (service.py)
    p99_wait_s: float  # Kimura W99
    ttft_floor_s: float  # prefill + first decode (per the options' statistic)
    binding: str  # which constraint set n (Binding name)

    @property
    def p99_ttft_s(self) -> float:
        return self.p99_wait_s + self.ttft_floor_s

    @property
    def slo_met(self) -> bool:
        return self.binding != Binding.INFEASIBLE.name


@dataclass(frozen=True, slots=True)
class FleetRow:
    method: str  # homogeneous | pool_routing | pr_cr | fleetopt | current
    b_short: int | None
    gamma: float | None
    alpha: float | None  # α' = share of traffic the short pool serves
    short: PoolReport | None
    long: PoolReport | None
    cost_per_hr: float

    @property
    def n_s(self) -> int:
        return self.short.n if self.short else 0

    @property
    def n_l(self) -> int:
        return self.long.n if self.long else 0

    @property
    def total(self) -> int:
        return self.n_s + self.n_l

    @property
    def annual_cost(self) -> float:
        return self.cost_per_hr * HOURS_PER_YEAR

    @property
    def slo_met(self) -> bool:
        return all(p.slo_met for p in (self.short, self.long) if p is not None)


def _pool(sw: Sweep, i: int, j: int, short: bool) -> PoolReport | None:
    n = int((sw.n_s if short else sw.n_l)[i, j])
    rate = float((sw.lam_s if short else sw.lam_l)[i, j])
    if n == 0 and rate <= 0.0:
        return None
    mu = float((sw.mu_s if short else sw.mu_l)[i, j])
    grid = sw.short if short else sw.long
    slots = int(grid.slots[i, j])
    profile = sw.cal.spec.short_profile if short else sw.cal.spec.long_profile
    return PoolReport(
        n=n,
        rate=rate,
        n_slots=slots,
        mu_gpu=mu,
        cv2=float((sw.cv2_s if short else sw.cv2_l)[i, j]),
        rho=rate / (n * mu) if n else math.inf,
        rho_load=load_occupancy(rate, n, float(grid.k[i, j]), float(grid.ks[i, j]), slots, profile),
        p99_wait_s=float((sw.wait_s if short else sw.wait_l)[i, j]),
        ttft_floor_s=float(grid.floor[i, j]),
        binding=Binding(int((sw.bind_s if short else sw.bind_l)[i, j])).name,
    )


def cell_row(sw: Sweep, i: int, j: int, method: str) -> FleetRow:
    """The two-pool fleet of grid cell (i_B, i_γ)."""
    return FleetRow(
        method=method,
        b_short=int(sw.cal.b[i]),
        gamma=float(sw.cal.gammas[j]),
        alpha=float(sw.alpha[i, j]),
        short=_pool(sw, i, j, True),
        long=_pool(sw, i, j, False),
        cost_per_hr=float(sw.cost_hr[i, j]),
    )


def homogeneous_row(sw: Sweep) -> FleetRow:
    """One pool at the long context for all traffic (§7.1 baseline 1)."""
    h = sw.cal.homogeneous
    budget = sw.slo_s if sw.cal.options.slo_budget == "wait_only" else sw.slo_s - h.ttft_floor_s
    pool = PoolReport(
        n=sw.homogeneous_n,
        rate=sw.rate,
        n_slots=h.n_slots,
        mu_gpu=h.mu_gpu,
        cv2=h.cv2,
        rho=sw.homogeneous_rho,
        rho_load=load_occupancy(
            sw.rate,
            sw.homogeneous_n,
            h.mean_k,
            h.mean_k_sigma,
            h.n_slots,
            sw.cal.spec.long_profile,
        ),
        p99_wait_s=sw.homogeneous_wait,
        ttft_floor_s=h.ttft_floor_s,
        binding=sw.homogeneous_binding.name if budget >= 0 else Binding.INFEASIBLE.name,
    )
    return FleetRow("homogeneous", None, None, None, None, pool, sw.homogeneous_n * sw.price_l)


@dataclass(frozen=True)
class Plan:
    """Algorithm 1's output with the Table 3 baselines, at one reference boundary."""

    workload: str
    rate: float
    slo_s: float
    p_c: float
    b_ref: int  # the boundary the PR and PR + C&R baselines are read at
    homogeneous: FleetRow
    pool_routing: FleetRow
    pr_cr: FleetRow
    fleetopt: FleetRow
    sweep: Sweep

    @property
    def rows(self) -> tuple[FleetRow, ...]:
        return (self.homogeneous, self.pool_routing, self.pr_cr, self.fleetopt)

    def savings(self, row: FleetRow) -> float:
        """Fractional cost saving versus the homogeneous fleet."""
        base = self.homogeneous.cost_per_hr
        return 1.0 - row.cost_per_hr / base if base > 0 else 0.0


def plan_from_sweep(sw: Sweep, b_short: int | None = None, b_ref: int | None = None) -> Plan:
    """Read the Table 3 rows off a swept grid: the optimum at `b_short` if fixed, else over
    the grid; the baselines at `b_short`, else `b_ref`, else the cheapest PR boundary."""
    bi, bj = sw.best
    if b_short is not None:
        bi = sw.index(b_short, 1.0)[0]
        bj = sw.best_gamma_at(bi)
    gammas = [float(g) for g in sw.cal.gammas]
    ref = b_short if b_short is not None else b_ref
    if ref is not None:
        ri = sw.index(ref, 1.0)[0]
    elif 1.0 in gammas:
        ri = best_pool_routing(sw)
    else:
        ri = bi
    b0 = int(sw.cal.b[ri])
    pr = cell_row(sw, *sw.index(b0, 1.0), "pool_routing") if 1.0 in gammas else None
    retro = (
        cell_row(sw, *sw.index(b0, RETROFIT_GAMMA), "pr_cr") if RETROFIT_GAMMA in gammas else None
    )
    best = cell_row(sw, bi, bj, "fleetopt")
    return Plan(
        workload=sw.cal.cdf.name,
        rate=sw.rate,
        slo_s=sw.slo_s,
        p_c=sw.p_c,
        b_ref=b0,
        homogeneous=homogeneous_row(sw),
        pool_routing=pr or best,
        pr_cr=retro or best,
        fleetopt=best,
        sweep=sw,
    )


def best_pool_routing(sw: Sweep) -> int:
    """The B index of the cheapest pool-routing fleet (γ = 1), SLO-feasible first."""
    j = sw.index(int(sw.cal.b[0]), 1.0)[1]
    col = slice(j, j + 1)
    return cheapest_cell(
        sw.cost_hr[:, col], sw.slo_met[:, col], sw.cal.b, sw.cal.gammas[col], sw.cal.eligible
    )[0]


def plan(
    cdf: LengthCdf,
    rate: float,
    slo_s: float = 0.5,
    p_c: float = 1.0,
    b_short: int | None = None,
    *,
    b_candidates: tuple[int, ...] | None = None,
    b_ref: int | None = None,
    gammas: tuple[float, ...] = GAMMAS,
    spec: FleetSpec | None = None,
    options: PlannerOptions = DEFAULT,
    phi: float | None = None,
) -> Plan:
    """FleetOpt end to end: the optimal (n_s, n_l, B, γ) and the Table 3 baselines.

    With `b_short` the boundary is fixed (the paper's Table 3) and only γ is swept;
    otherwise every hardware-feasible breakpoint (or `b_candidates`) is swept too, and the
    baselines are read at `b_ref` (calibrated for them, never the optimum unless swept),
    else at the cheapest PR boundary.
    A candidate with F(B) > MAX_SHORT_SHARE is refused (ValueError), as in the default set."""
    if b_short is not None:
        cands: tuple[int, ...] | None = (b_short,)
    else:
        if b_candidates is not None:
            thin = [b for b in b_candidates if cdf.cdf(b, options.interpolation) > MAX_SHORT_SHARE]
            if thin:
                raise ValueError(
                    f"B_short candidate(s) {thin}: more than {MAX_SHORT_SHARE:.1%} of traffic "
                    "lies below, which leaves the long pool a sliver (use --b-short to price one)"
                )
        cands = b_candidates
    refs = (b_ref,) if b_ref is not None and b_short is None else ()
    gs = tuple(sorted({*gammas, 1.0, RETROFIT_GAMMA}))
    cal = calibrate(cdf, cands, gs, spec, options, reference_b=refs)
    return plan_from_sweep(sweep(cal, rate, slo_s, p_c, phi), b_short, b_ref)


def evaluate(sw: Sweep, b_short: int, gamma: float, n_s: int, n_l: int) -> FleetRow:
    """A given fleet at (B, γ), priced and checked with the planner's own model. A pool's
    `binding` reads OK, OVER_RHO_MAX (busier than the cap) or INFEASIBLE (its P99 wait
    misses the SLO budget, or it has traffic and no GPUs)."""
    i, j = sw.index(b_short, gamma)
    need = cell_row(sw, i, j, "current")
    pools: list[PoolReport | None] = []
    spec = sw.cal.spec
    for req, n, grid, prof in (
        (need.short, n_s, sw.short, spec.short_profile),
        (need.long, n_l, sw.long, spec.long_profile),
    ):
        if req is None:
            pools.append(None)
            continue
        rho = req.rate / (n * req.mu_gpu) if n > 0 else math.inf
        k, ks = float(grid.k[i, j]), float(grid.ks[i, j])
        wait = p99_wait(n, req.rate, req.mu_gpu, req.n_slots, req.cv2) if rho < 1 else math.inf
        floor = 0.0 if sw.cal.options.slo_budget == "wait_only" else req.ttft_floor_s
        if wait > sw.slo_s - floor:
            verdict = Binding.INFEASIBLE.name
        elif rho > sw.cal.options.rho_max:
            verdict = "OVER_RHO_MAX"
        else:
            verdict = "OK"
        pools.append(
            PoolReport(n, req.rate, req.n_slots, req.mu_gpu, req.cv2, rho,
                       load_occupancy(req.rate, n, k, ks, req.n_slots, prof), wait,
                       req.ttft_floor_s, verdict)
        )  # fmt: skip
    cost = n_s * sw.price_s + n_l * sw.price_l
    return FleetRow("current", b_short, gamma, need.alpha, pools[0], pools[1], cost)
