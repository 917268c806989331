"""Algorithm 1 (FleetOpt §6): calibrate once, then sweep (B_short, γ) in well under 1 ms.

    for B in 𝓑 (hardware-feasible boundaries), γ in {1.0, 1.1, …, 2.0}:
        α' = F(B) + [F(⌊γB⌋) − F(B)]·p_c                                  (Eq. 1, 14)
        λ_s = α'λ,  λ_l = (1 − α')λ                                        (Eq. 1–2)
        μ_s, C²_s from F on [1, B];  μ_l, C²_l from F on (⌊γB⌋, ∞)         (steps 5–6)
        n_s, n_l by Erlang-C inversion under ρ_max                        (Eq. 11)
        cost = c_s n_s + c_l n_l,  c_l = φ c_s                             (Eq. 9)
    return the argmin

The work splits in two. `calibrate` depends only on the CDF, the hardware and the options:
it computes the per-pool service moments for every B candidate (short pool) and every
distinct ⌊γB⌋ (long pool, recalibrated on the post-compression distribution — §6's
"critical" step), cached by ⌊γB⌋. `sweep` depends on λ, the SLO, p_c and φ: it is pure
array arithmetic over the (B, γ) grid (numpy, one pass for all pools), so re-planning when
traffic shifts costs microseconds.

Ties in cost go to the SLO-feasible cell, then the smaller γ (less compression, less
fidelity risk), then the smaller B (the reference's order). Failure posture: a cell whose
TTFT floor exceeds the SLO is sized by ρ_max and flagged (slo_met False); the argmin prefers
feasible cells and reports an infeasible optimum only if no cell is feasible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from policies.planner.erlang import Binding, size_pools
from policies.planner.options import GAMMAS, PAPER, PlannerOptions
from policies.planner.profile import A100_LLAMA3_70B, HardwareProfile
from policies.planner.service import (
    LengthTable,
    PoolMoments,
    exact_moments,
    moments,
    point_moments,
)
from policies.planner.workload import LengthCdf, band_pool, long_pool, short_pool, whole

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """The hardware: one GPU type per pool and the long pool's context window."""

    short_profile: HardwareProfile = A100_LLAMA3_70B
    long_profile: HardwareProfile = A100_LLAMA3_70B
    long_ctx: int = 65536  # C_max^(l): the long (and homogeneous) pool is sized for 64K (§7.1)

    def __post_init__(self) -> None:
        if self.long_profile.n_slots(self.long_ctx) < 1:
            raise ValueError(f"no slot of {self.long_ctx} tokens fits {self.long_profile.name}")


def feasible_boundaries(cdf: LengthCdf, spec: FleetSpec) -> tuple[int, ...]:
    """𝓑: CDF breakpoints below the long context where the short GPU holds ≥ 1 slot and
    some traffic falls (§6, "Candidate set")."""
    return tuple(
        t
        for t, f in cdf.points
        if t < spec.long_ctx and f > 0.0 and spec.short_profile.n_slots(t) >= 1
    )


def _arrays(ms: list[PoolMoments]) -> tuple[IntArray, FloatArray, FloatArray, FloatArray]:
    return (
        np.array([m.n_slots for m in ms], dtype=np.int64),
        np.array([m.mean_s for m in ms], dtype=np.float64),
        np.array([m.mean_s2 for m in ms], dtype=np.float64),
        np.array([m.ttft_floor_s for m in ms], dtype=np.float64),
    )


@dataclass(frozen=True)
class Calibration:
    """Everything the sweep needs that does not depend on λ, the SLO, p_c or φ."""

    cdf: LengthCdf
    spec: FleetSpec
    options: PlannerOptions
    b: IntArray  # (nB,) candidate boundaries
    gammas: FloatArray  # (nG,)
    f_b: FloatArray  # (nB,) F(B)
    f_g: FloatArray  # (nB, nG) F(⌊γB⌋)
    short: list[PoolMoments | None]  # per B: F on [1, B]
    edge: list[PoolMoments]  # per B: every request at L = B (compressed, Eq. 15)
    long: list[list[PoolMoments | None]]  # per (B, γ): F on (⌊γB⌋, ∞)
    band: list[list[PoolMoments | None]]  # per (B, γ): F on (B, ⌊γB⌋], exact moments
    homogeneous: PoolMoments
    # flattened per-cell arrays, (nB, nG)
    s_slots: IntArray = field(repr=False)
    s_m1: FloatArray = field(repr=False)
    s_m2: FloatArray = field(repr=False)
    s_floor: FloatArray = field(repr=False)
    e_m1: FloatArray = field(repr=False)
    e_m2: FloatArray = field(repr=False)
    e_floor: FloatArray = field(repr=False)
    l_present: BoolArray = field(repr=False)
    l_slots: IntArray = field(repr=False)
    l_m1: FloatArray = field(repr=False)
    l_m2: FloatArray = field(repr=False)
    l_floor: FloatArray = field(repr=False)
    b_present: BoolArray = field(repr=False)
    b_m1: FloatArray = field(repr=False)
    b_m2: FloatArray = field(repr=False)
    b_floor: FloatArray = field(repr=False)


def calibrate(
    cdf: LengthCdf,
    b_candidates: tuple[int, ...] | None = None,
    gammas: tuple[float, ...] = GAMMAS,
    spec: FleetSpec | None = None,
    options: PlannerOptions = PAPER,
) -> Calibration:
    """Per-pool service moments for every (B, γ) cell (Algorithm 1 steps 5–6)."""
    spec = spec or FleetSpec()
    bs = b_candidates if b_candidates is not None else feasible_boundaries(cdf, spec)
    if not bs:
        raise ValueError(f"{cdf.name}: no feasible B_short candidate below {spec.long_ctx}")
    for b in bs:
        if not 0 < b < spec.long_ctx or spec.short_profile.n_slots(b) < 1:
            raise ValueError(f"B_short={b} is not a feasible short-pool context")
    interp = options.interpolation
    long_slots = spec.long_profile.n_slots(spec.long_ctx)
    long_table = LengthTable.build(spec.long_ctx, long_slots, spec.long_profile, options)
    homogeneous = moments(whole(cdf, spec.long_ctx, interp), long_table, options)

    short: list[PoolMoments | None] = []
    edge: list[PoolMoments] = []
    long: list[list[PoolMoments | None]] = []
    band: list[list[PoolMoments | None]] = []
    long_cache: dict[int, PoolMoments | None] = {}
    f_g = np.zeros((len(bs), len(gammas)))
    for i, b in enumerate(bs):
        table = LengthTable.build(b, spec.short_profile.n_slots(b), spec.short_profile, options)
        dist = short_pool(cdf, b, interp)
        short.append(moments(dist, table, options) if dist is not None else None)
        edge.append(point_moments(b, table))
        row: list[PoolMoments | None] = []
        band_row: list[PoolMoments | None] = []
        for j, gamma in enumerate(gammas):
            lower = int(gamma * b)  # ⌊γB⌋ in the reference's float arithmetic
            f_g[i, j] = cdf.cdf(lower, interp)
            if lower not in long_cache:
                ldist = long_pool(cdf, lower, spec.long_ctx, interp, options.long_edge)
                long_cache[lower] = (
                    moments(ldist, long_table, options) if ldist is not None else None
                )
            row.append(long_cache[lower])
            # the band's moments only matter when p_c < 1; exact is cheap and noise-free
            bdist = band_pool(cdf, b, min(lower, spec.long_ctx), spec.long_ctx, interp)
            band_row.append(exact_moments(bdist, long_table, options) if bdist else None)
        long.append(row)
        band.append(band_row)

    placeholder = edge[0]
    s_slots, s_m1, s_m2, s_floor = _arrays([m or placeholder for m in short])
    _, e_m1, e_m2, e_floor = _arrays(edge)
    flat_long = [m for row in long for m in row]
    l_slots, l_m1, l_m2, l_floor = _arrays([m or homogeneous for m in flat_long])
    flat_band = [m for row in band for m in row]
    _, b_m1, b_m2, b_floor = _arrays([m or homogeneous for m in flat_band])
    shape = (len(bs), len(gammas))
    return Calibration(
        cdf=cdf,
        spec=spec,
        options=options,
        b=np.array(bs, dtype=np.int64),
        gammas=np.array(gammas, dtype=np.float64),
        f_b=np.array([cdf.cdf(b, interp) for b in bs]),
        f_g=f_g,
        short=short,
        edge=edge,
        long=long,
        band=band,
        homogeneous=homogeneous,
        s_slots=s_slots,
        s_m1=s_m1,
        s_m2=s_m2,
        s_floor=s_floor,
        e_m1=e_m1,
        e_m2=e_m2,
        e_floor=e_floor,
        l_present=np.array([m is not None for m in flat_long]).reshape(shape),
        l_slots=l_slots.reshape(shape),
        l_m1=l_m1.reshape(shape),
        l_m2=l_m2.reshape(shape),
        l_floor=l_floor.reshape(shape),
        b_present=np.array([m is not None for m in flat_band]).reshape(shape),
        b_m1=b_m1.reshape(shape),
        b_m2=b_m2.reshape(shape),
        b_floor=b_floor.reshape(shape),
    )


@dataclass(frozen=True)
class Sweep:
    """Algorithm 1's cost grid for one (λ, SLO, p_c, φ); arrays are (nB, nG)."""

    cal: Calibration
    rate: float
    slo_s: float
    p_c: float
    price_s: float  # c_s, $/GPU-hr
    price_l: float  # c_l = φ c_s
    alpha: FloatArray  # α' (Eq. 1)
    lam_s: FloatArray
    lam_l: FloatArray
    mu_s: FloatArray
    mu_l: FloatArray
    cv2_s: FloatArray
    cv2_l: FloatArray
    floor_s: FloatArray  # TTFT floor (prefill + first decode), seconds
    floor_l: FloatArray
    n_s: IntArray
    n_l: IntArray
    wait_s: FloatArray  # Kimura W99, seconds
    wait_l: FloatArray
    bind_s: IntArray  # Binding codes
    bind_l: IntArray
    cost_hr: FloatArray
    homogeneous_n: int
    homogeneous_rho: float
    homogeneous_wait: float
    homogeneous_binding: Binding
    best: tuple[int, int]  # (i_B, i_γ) of the optimum

    @property
    def slo_met(self) -> BoolArray:
        infeasible = Binding.INFEASIBLE
        result: BoolArray = (self.bind_s != infeasible) & (self.bind_l != infeasible)
        return result

    def rho_s(self) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            result: FloatArray = np.where(self.n_s > 0, self.lam_s / (self.n_s * self.mu_s), 0.0)
        return result

    def rho_l(self) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            result: FloatArray = np.where(self.n_l > 0, self.lam_l / (self.n_l * self.mu_l), 0.0)
        return result

    def index(self, b_short: int, gamma: float) -> tuple[int, int]:
        """The grid cell of (B, γ); KeyError if it was not calibrated."""
        ib = np.flatnonzero(self.cal.b == b_short)
        ig = np.flatnonzero(np.isclose(self.cal.gammas, gamma, rtol=0.0, atol=1e-9))
        if not len(ib) or not len(ig):
            raise KeyError(f"(B_short={b_short}, γ={gamma}) is not in the calibrated grid")
        return int(ib[0]), int(ig[0])

    def best_gamma_at(self, i_b: int) -> int:
        """The γ index Algorithm 1 picks when B is fixed at row i_b."""
        order = _order(self.cost_hr[i_b : i_b + 1], self.slo_met[i_b : i_b + 1], self.cal)
        return int(order[1])


def _order(cost: FloatArray, ok: BoolArray, cal: Calibration) -> tuple[int, int]:
    nb, ng = cost.shape
    g = np.broadcast_to(cal.gammas[None, :], (nb, ng)).ravel()
    b = np.broadcast_to(cal.b[:nb, None], (nb, ng)).ravel()
    first = int(np.lexsort((b, g, cost.ravel(), ~ok.ravel()))[0])
    return first // ng, first % ng


def _long_moments(
    cal: Calibration, w_band: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray, BoolArray]:
    """The long pool's (E[S], E[S²], TTFT floor) per cell, and whether it has any requests:
    the tail above ⌊γB⌋, mixed with the uncompressed band per `uncompressed_band`."""
    tail, band = cal.l_present, cal.b_present
    floor = np.where(tail, cal.l_floor, cal.b_floor)  # the tail's P99 dominates when present
    if cal.options.uncompressed_band == "long":
        wt = np.where(tail, 1.0 - cal.f_g, 0.0)
        wb = np.where(band, w_band, 0.0)
        tot = np.where(wt + wb > 0, wt + wb, 1.0)
        m1 = np.where(wt + wb > 0, (wt * cal.l_m1 + wb * cal.b_m1) / tot, cal.l_m1)
        m2 = np.where(wt + wb > 0, (wt * cal.l_m2 + wb * cal.b_m2) / tot, cal.l_m2)
        return m1, m2, floor, tail | (band & (w_band > 0))
    m1 = np.where(tail, cal.l_m1, cal.b_m1)
    m2 = np.where(tail, cal.l_m2, cal.b_m2)
    return m1, m2, floor, tail | (band & (w_band > 0))


def sweep(
    cal: Calibration,
    rate: float,
    slo_s: float = 0.5,
    p_c: float = 1.0,
    phi: float | None = None,
) -> Sweep:
    """Size both pools in every (B, γ) cell and the homogeneous baseline; pick the optimum."""
    if rate <= 0:
        raise ValueError("the arrival rate must be > 0")
    if not 0.0 <= p_c <= 1.0:
        raise ValueError("p_c must be in [0, 1]")
    opt = cal.options
    price_s = cal.spec.short_profile.cost_per_hr
    price_l = phi * price_s if phi is not None else cal.spec.long_profile.cost_per_hr
    shape = cal.f_g.shape
    f_b = np.broadcast_to(cal.f_b[:, None], shape)
    border = np.maximum(0.0, cal.f_g - f_b)
    alpha = np.minimum(1.0, f_b + border * p_c)
    lam_s = alpha * rate
    lam_l = (1.0 - alpha) * rate

    s_m1 = np.broadcast_to(cal.s_m1[:, None], shape)
    s_m2 = np.broadcast_to(cal.s_m2[:, None], shape)
    s_floor = np.broadcast_to(cal.s_floor[:, None], shape)
    if opt.compressed_mass == "at_boundary":
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(alpha > 0, border * p_c / alpha, 0.0)
        e_m1 = cal.e_m1[:, None]
        s_m1 = (1.0 - w) * s_m1 + w * e_m1
        s_m2 = (1.0 - w) * s_m2 + w * cal.e_m2[:, None]
        e_floor = np.broadcast_to(cal.e_floor[:, None], shape)
        if opt.prefill_stat == "mean":
            s_floor = (1.0 - w) * s_floor + w * e_floor
        else:  # the P99 of the mixture is at B once B holds more than 1 % of the pool
            s_floor = np.where(w > 0.01, e_floor, s_floor)
    s_slots = np.broadcast_to(cal.s_slots[:, None], shape)
    l_m1, l_m2, l_floor, l_any = _long_moments(cal, border * (1.0 - p_c))
    mu_s = s_slots / s_m1
    mu_l = cal.l_slots / l_m1
    cv2_s = np.maximum(0.01, s_m2 / (s_m1 * s_m1) - 1.0)
    cv2_l = np.maximum(0.01, l_m2 / (l_m1 * l_m1) - 1.0)
    lam_l_sized = np.where(l_any & (lam_l > opt.min_pool_rate), lam_l, 0.0)
    lam_s_sized = np.where(lam_s > opt.min_pool_rate, lam_s, 0.0)

    homo = cal.homogeneous
    wait_budget = opt.slo_budget == "wait_only"
    budget = [
        np.full(shape, slo_s) if wait_budget else slo_s - s_floor,
        np.full(shape, slo_s) if wait_budget else slo_s - l_floor,
        np.array([slo_s if wait_budget else slo_s - homo.ttft_floor_s]),
    ]
    n, wait, bind = size_pools(
        np.concatenate([lam_s_sized.ravel(), lam_l_sized.ravel(), [rate]]),
        np.concatenate([mu_s.ravel(), mu_l.ravel(), [homo.mu_gpu]]),
        np.concatenate([s_slots.ravel(), cal.l_slots.ravel(), [homo.n_slots]]),
        np.concatenate([cv2_s.ravel(), cv2_l.ravel(), [homo.cv2]]),
        np.concatenate([x.ravel() for x in budget]),
        opt.rho_max,
        opt.headroom_gpus,
    )
    k = shape[0] * shape[1]
    n_s, n_l = n[:k].reshape(shape), n[k : 2 * k].reshape(shape)
    cost = n_s * price_s + n_l * price_l
    bind_s, bind_l = bind[:k].reshape(shape), bind[k : 2 * k].reshape(shape)
    ok = (bind_s != Binding.INFEASIBLE) & (bind_l != Binding.INFEASIBLE)
    n_h = int(n[-1])
    return Sweep(
        cal=cal,
        rate=rate,
        slo_s=slo_s,
        p_c=p_c,
        price_s=price_s,
        price_l=price_l,
        alpha=alpha,
        lam_s=lam_s,
        lam_l=lam_l,
        mu_s=mu_s,
        mu_l=mu_l,
        cv2_s=cv2_s,
        cv2_l=cv2_l,
        floor_s=np.asarray(s_floor, dtype=np.float64),
        floor_l=l_floor,
        n_s=n_s,
        n_l=n_l,
        wait_s=wait[:k].reshape(shape),
        wait_l=wait[k : 2 * k].reshape(shape),
        bind_s=bind_s,
        bind_l=bind_l,
        cost_hr=cost,
        homogeneous_n=n_h,
        homogeneous_rho=rate / (n_h * homo.mu_gpu) if n_h else 0.0,
        homogeneous_wait=float(wait[-1]),
        homogeneous_binding=Binding(int(bind[-1])),
        best=_order(cost, ok, cal),
    )
