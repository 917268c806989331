"""Algorithm 1 (FleetOpt §6): calibrate once, then sweep (B_short, γ) in well under 1 ms.

    for B in 𝓑 (hardware-feasible boundaries), γ in {1.0, 1.1, …, 2.0}:
        α' = F(B) + [F(⌊γB⌋) − F(B)]·p_c                                  (Eq. 1, 14)
        λ_s = α'λ,  λ_l = (1 − α')λ                                        (Eq. 1–2)
        μ_s, C²_s from F on [1, B] and the compressed band                (step 5, see below)
        μ_l, C²_l from F on (⌊γB⌋, ∞)                                       (step 6)
        n_s, n_l by Erlang-C inversion under ρ_max                        (Eq. 11)
        cost = c_s n_s + c_l n_l,  c_l = φ c_s                             (Eq. 9)
    return the argmin

The work splits in two. `calibrate` depends only on the CDF, the hardware and the options:
it computes the per-pool service moments for every B candidate (short pool) and every
distinct ⌊γB⌋ (long pool, recalibrated on the post-compression distribution — §6's
"critical" step), cached by ⌊γB⌋. `sweep` depends on λ, the SLO, p_c and φ: it is pure
array arithmetic over the (B, γ) grid (numpy, one pass for all pools), so re-planning when
traffic shifts costs microseconds.

The short pool serves F(B)·λ short requests and (F(⌊γB⌋) − F(B))·p_c·λ compressed ones.
Algorithm 1 step 5 prices it on F over [1, B] alone (`compressed_mass="restricted"`, the
paper's tables). By default ("band") its service distribution is the rate-weighted mixture
of that slice and the band (B, ⌊γB⌋] as C&R serves it: each band request with its prompt
cut to T_c = B − L_out (Eq. 15) and its original output, which is what it holds a slot
for. Its moments are exact (prefix sums over a per-B table of compressed requests), so
the mixture is continuous in γ and re-weighting for p_c is array arithmetic.

𝓑 leaves out boundaries with F(B) > 0.999 (a long pool of < 0.1 % of traffic). When
⌊γB⌋ reaches the CDF's last point the tail (⌊γB⌋, ∞) is empty; under Algorithm 1's
tail-only moments the long pool (still serving the uncompressed band when p_c < 1) keeps
the tail's limit — its longest request — so E[S]_l stays continuous in γ instead of
jumping to the band's moments (which put a false optimum on that jump).

The SLO check (PlannerOptions.slo_check) sets each pool's TTFT floor, and so its wait
budget T_slo − floor (Eq. 8): "paper" takes the P99 request of whatever the pool holds;
"per_class" (default) judges each request in its class — the long class (B, ∞) at its
own P99 request at every γ, compressed requests at L = B — see `_per_class_floors`.

Ties in cost go to the SLO-feasible cell, then the smaller γ (less compression, less
fidelity risk), then the smaller B (the reference's order). Failure posture: a cell whose
TTFT floor exceeds the SLO is sized by ρ_max and flagged (slo_met False); the argmin prefers
feasible cells and reports an infeasible optimum only if no cell is feasible.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from policies.planner.erlang import Binding, size_pools
from policies.planner.grid import MomentGrid
from policies.planner.options import DEFAULT, GAMMAS, PlannerOptions
from policies.planner.profile import A100_LLAMA3_70B, HardwareProfile
from policies.planner.service import (
    LengthTable,
    PoolMoments,
    exact_moments,
    moments,
    point_moments,
)
from policies.planner.workload import (
    LengthCdf,
    PoolDistribution,
    band_pool,
    long_pool,
    short_pool,
    whole,
)

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


# A boundary below which more than this share of traffic falls leaves the long pool a
# sliver (< 0.1 % of requests): its sizing is noise and C&R then empties it into fleets
# with no long pool at all, while the long requests still exist. Not a candidate.
MAX_SHORT_SHARE = 0.999


def feasible_boundaries(cdf: LengthCdf, spec: FleetSpec) -> tuple[int, ...]:
    """𝓑: CDF breakpoints below the long context where the short GPU holds ≥ 1 slot, some
    traffic falls (§6, "Candidate set") and F(B) ≤ MAX_SHORT_SHARE."""
    return tuple(
        t
        for t, f in cdf.points
        if t < spec.long_ctx and 0.0 < f <= MAX_SHORT_SHARE and spec.short_profile.n_slots(t) >= 1
    )


@dataclass(frozen=True)
class Calibration:
    """Everything the sweep needs that does not depend on λ, the SLO, p_c or φ."""

    cdf: LengthCdf
    spec: FleetSpec
    options: PlannerOptions
    b: IntArray  # (nB,) calibrated boundaries
    eligible: BoolArray  # (nB,) the optimum may be at this B (False: reference only)
    gammas: FloatArray  # (nG,)
    f_b: FloatArray  # (nB,) F(B)
    f_g: FloatArray  # (nB, nG) F(⌊γB⌋)
    short: list[PoolMoments | None]  # per B: F on [1, B]
    edge: list[PoolMoments]  # per B: every request at L = B (compressed, Eq. 15)
    # per (B, γ): the band (B, ⌊γB⌋] served compressed (prompt ≤ B − L_out, its own
    # output), exact moments, TTFT floor at L = B's; None if the band is empty
    compressed: list[list[PoolMoments | None]]
    long: list[list[PoolMoments | None]]  # per (B, γ): F on (⌊γB⌋, ∞); None if empty
    band: list[list[PoolMoments | None]]  # per (B, γ): F on (B, ⌊γB⌋], exact moments
    homogeneous: PoolMoments
    lower: IntArray  # (nB, nG) ⌊γB⌋
    class_p99: IntArray  # (nB,) the long class (B, ∞)'s P99 L_total (0: no long class)
    class_floor: FloatArray  # (nB,) its TTFT floor in the long pool (per_class check)
    short_grid: MomentGrid = field(repr=False)  # (nB,)
    edge_grid: MomentGrid = field(repr=False)  # (nB,)
    compressed_grid: MomentGrid = field(repr=False)  # (nB, nG)
    # (nB, nG); where (⌊γB⌋, ∞) is empty: absent, holding the tail's limit (see calibrate)
    long_grid: MomentGrid = field(repr=False)
    band_grid: MomentGrid = field(repr=False)  # (nB, nG)


def calibrate(
    cdf: LengthCdf,
    b_candidates: tuple[int, ...] | None = None,
    gammas: tuple[float, ...] = GAMMAS,
    spec: FleetSpec | None = None,
    options: PlannerOptions = DEFAULT,
    reference_b: tuple[int, ...] = (),
) -> Calibration:
    """Per-pool service moments for every (B, γ) cell (Algorithm 1 steps 5–6).

    `reference_b` adds boundaries that are calibrated (for baselines, the deployed fleet)
    but never chosen as the optimum unless they are candidates too."""
    spec = spec or FleetSpec()
    cands = b_candidates if b_candidates is not None else feasible_boundaries(cdf, spec)
    bs = tuple(sorted({*cands, *reference_b}))
    eligible = np.array([b in cands for b in bs], dtype=np.bool_)
    if not bs:
        raise ValueError(f"{cdf.name}: no feasible B_short candidate below {spec.long_ctx}")
    for b in bs:
        if not 0 < b < spec.long_ctx or spec.short_profile.n_slots(b) < 1:
            raise ValueError(f"B_short={b} is not a feasible short-pool context")
    interp = options.interpolation
    long_slots = spec.long_profile.n_slots(spec.long_ctx)
    long_table = LengthTable.build(spec.long_ctx, long_slots, spec.long_profile, options)
    homogeneous = moments(whole(cdf, spec.long_ctx, interp), long_table, options)

    # The tail (⌊γB⌋, ∞) empties as ⌊γB⌋ reaches the top of the CDF; its moments then tend
    # to those of its last request, the longest the long pool holds. An empty tail keeps
    # that limit (absent, but continuous in γ) instead of jumping to other moments.
    top = point_moments(min(cdf.max_tokens, spec.long_ctx), long_table)
    short: list[PoolMoments | None] = []
    edge: list[PoolMoments] = []
    long: list[list[PoolMoments | None]] = []
    band: list[list[PoolMoments | None]] = []
    compressed: list[list[PoolMoments | None]] = []
    long_cache: dict[int, PoolMoments | None] = {}
    f_g = np.zeros((len(bs), len(gammas)))
    lowers = np.zeros((len(bs), len(gammas)), dtype=np.int64)
    class_p99 = np.zeros(len(bs), dtype=np.int64)
    class_floor = np.zeros(len(bs))
    for i, b in enumerate(bs):
        # one short-pool table: lengths ≤ B as they are (compression never touches them),
        # the band's above B as C&R serves them (prompt cut to B − L_out)
        top_band = max(min(int(g * b), spec.long_ctx) for g in gammas)
        n_short = spec.short_profile.n_slots(b)
        table = LengthTable.build(max(b, top_band), n_short, spec.short_profile, options, b)
        dist = short_pool(cdf, b, interp)
        short.append(moments(dist, table, options) if dist is not None else None)
        edge.append(point_moments(b, table))
        # the long class: every request above B, whichever pool C&R sends it to
        cdist = long_pool(cdf, b, spec.long_ctx, interp, options.long_edge)
        if cdist is not None:
            class_p99[i] = cdist.quantile(0.99)
            class_floor[i] = float(long_table.floor[class_p99[i]])
        row: list[PoolMoments | None] = []
        band_row: list[PoolMoments | None] = []
        cut_row: list[PoolMoments | None] = []
        for j, gamma in enumerate(gammas):
            lower = int(gamma * b)  # ⌊γB⌋ in the reference's float arithmetic
            lowers[i, j] = lower
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
            cut_row.append(_compressed(bdist, table, edge[-1], options) if bdist else None)
        long.append(row)
        band.append(band_row)
        compressed.append(cut_row)

    shape = (len(bs), len(gammas))
    long_grid = MomentGrid.of([m or top for r in long for m in r], top, shape)
    long_present = np.array([m is not None for r in long for m in r]).reshape(shape)
    return Calibration(
        cdf=cdf,
        spec=spec,
        options=options,
        b=np.array(bs, dtype=np.int64),
        eligible=eligible,
        gammas=np.array(gammas, dtype=np.float64),
        f_b=np.array([cdf.cdf(b, interp) for b in bs]),
        f_g=f_g,
        short=short,
        edge=edge,
        long=long,
        band=band,
        compressed=compressed,
        homogeneous=homogeneous,
        lower=lowers,
        class_p99=class_p99,
        class_floor=class_floor,
        short_grid=MomentGrid.of(list(short), edge[0], (len(bs),)),
        edge_grid=MomentGrid.of(list(edge), edge[0], (len(bs),)),
        compressed_grid=MomentGrid.of([m for r in compressed for m in r], edge[0], shape),
        long_grid=replace(long_grid, present=long_present),
        band_grid=MomentGrid.of([m for r in band for m in r], homogeneous, shape),
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
    short: MomentGrid  # the short pool's requests per cell (after C&R mixing)
    long: MomentGrid  # the long pool's requests per cell (tail, ± uncompressed band)
    mu_s: FloatArray
    mu_l: FloatArray
    cv2_s: FloatArray
    cv2_l: FloatArray
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

    def index(self, b_short: int, gamma: float) -> tuple[int, int]:
        """The grid cell of (B, γ); KeyError if it was not calibrated."""
        ib = np.flatnonzero(self.cal.b == b_short)
        ig = np.flatnonzero(np.isclose(self.cal.gammas, gamma, rtol=0.0, atol=1e-9))
        if not len(ib) or not len(ig):
            raise KeyError(f"(B_short={b_short}, γ={gamma}) is not in the calibrated grid")
        return int(ib[0]), int(ig[0])

    def best_gamma_at(self, i_b: int) -> int:
        """The γ index Algorithm 1 picks when B is fixed at row i_b."""
        rows = slice(i_b, i_b + 1)
        order = cheapest_cell(
            self.cost_hr[rows], self.slo_met[rows], self.cal.b[rows], self.cal.gammas
        )
        return int(order[1])


def cheapest_cell(
    cost: FloatArray,
    ok: BoolArray,
    bs: IntArray,
    gammas: FloatArray,
    eligible: BoolArray | None = None,
) -> tuple[int, int]:
    """(i, j) of the cheapest cell of a (len(bs), len(gammas)) grid: eligible B first, then
    SLO-feasible, then cost, then the smaller γ, then the smaller B."""
    nb, ng = cost.shape
    g = np.broadcast_to(gammas[None, :], (nb, ng)).ravel()
    b = np.broadcast_to(bs[:, None], (nb, ng)).ravel()
    el = np.ones(nb * ng, dtype=np.bool_)
    if eligible is not None:
        el = np.broadcast_to(eligible[:, None], (nb, ng)).ravel()
    first = int(np.lexsort((b, g, cost.ravel(), ~ok.ravel(), ~el))[0])
    return first // ng, first % ng


def load_occupancy(
    lam: float, n: int, grid_k: float, grid_ks: float, slots: int, profile: HardwareProfile
) -> float:
    """ρ_load: the busy-slot fraction when iterations cost the batch actually running
    (service.py's fixed point); 0 without traffic, 1 if the batch would have to be full."""
    if lam <= 0 or n <= 0:
        return 0.0
    spare = n - lam * profile.h_s * grid_ks
    if spare <= 0:
        return 1.0
    return min(1.0, lam * profile.w_s * grid_k / (slots * spare))


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

    short = cal.short_grid.broadcast(shape)
    if opt.compressed_mass != "restricted":  # compressed requests share the short pool
        edge = cal.edge_grid.broadcast(shape)
        # "band": the band's own requests, prompt cut to T_c; "at_boundary": all at L = B
        comp = cal.compressed_grid if opt.compressed_mass == "band" else edge
        w = border * p_c
        native = short
        short = short.mix(comp, f_b, w)
        if opt.prefill_stat == "p99":  # the mixture's P99 sits at B once B holds > 1 %
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(alpha > 0, w / alpha, 0.0)
            short = replace(short, floor=np.where(share > 0.01, edge.floor, short.floor))
        else:
            short = replace(short, floor=_mix(short.floor, comp.floor, f_b, w))
        short = short.where(w > 0, native)  # no compressed traffic: the slice, bit for bit
    band_w = border * (1.0 - p_c)
    tail, band = cal.long_grid, cal.band_grid
    band_on = band.present & (band_w > 0)
    if opt.uncompressed_band == "long":
        long = tail.mix(
            band, np.where(tail.present, 1.0 - cal.f_g, 0.0), np.where(band_on, band_w, 0.0)
        )
    else:  # Algorithm 1 step 6: the tail alone (its limit once nothing lies above ⌊γB⌋)
        long = tail
    long = replace(long, present=tail.present | band_on)
    if opt.slo_check == "per_class" and opt.prefill_stat == "p99":
        short, long = _per_class_floors(cal, short, long, border * p_c > 0)

    mu_s = short.slots / short.m1
    mu_l = long.slots / long.m1
    cv2_s = np.maximum(0.01, short.m2 / (short.m1 * short.m1) - 1.0)
    cv2_l = np.maximum(0.01, long.m2 / (long.m1 * long.m1) - 1.0)
    lam_l_sized = np.where(long.present & (lam_l > opt.min_pool_rate), lam_l, 0.0)
    lam_s_sized = np.where(lam_s > opt.min_pool_rate, lam_s, 0.0)

    homo = cal.homogeneous
    wait_budget = opt.slo_budget == "wait_only"
    budget = [
        np.full(shape, slo_s) if wait_budget else slo_s - short.floor,
        np.full(shape, slo_s) if wait_budget else slo_s - long.floor,
        np.array([slo_s if wait_budget else slo_s - homo.ttft_floor_s]),
    ]
    n, wait, bind = size_pools(
        np.concatenate([lam_s_sized.ravel(), lam_l_sized.ravel(), [rate]]),
        np.concatenate([mu_s.ravel(), mu_l.ravel(), [homo.mu_gpu]]),
        np.concatenate([short.slots.ravel(), long.slots.ravel(), [homo.n_slots]]),
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
        short=short,
        long=long,
        mu_s=mu_s,
        mu_l=mu_l,
        cv2_s=cv2_s,
        cv2_l=cv2_l,
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
        best=cheapest_cell(cost, ok, cal.b, cal.gammas, cal.eligible),
    )


def _compressed(
    band: PoolDistribution, cut: LengthTable, edge: PoolMoments, options: PlannerOptions
) -> PoolMoments:
    """The band's requests as the short pool serves them after C&R: exact moments over
    `cut` (LengthTable with compress_to = B). A compressed request's prefill is longest
    when its output is shortest, at the band's lower end, where it is B's own: the TTFT
    floor under "p99" is the edge's (L = B), the per-class check's compressed class."""
    m = exact_moments(band, cut, options)
    return m if options.prefill_stat == "mean" else replace(m, ttft_floor_s=edge.ttft_floor_s)


def _per_class_floors(
    cal: Calibration, short: MomentGrid, long: MomentGrid, compressed: BoolArray
) -> tuple[MomentGrid, MomentGrid]:
    """The TTFT floors of the per-class SLO check (PlannerOptions.slo_check).

    A P99 TTFT target is a promise to users about their requests, so each request is
    judged in its class: short requests (L ≤ B) at the P99 of [1, B] plus the short
    pool's wait; compressed requests at their served length B (Eq. 15: T_c + L_out = B);
    the long class (B, ∞) at its own P99 request plus the long pool's wait. That request
    is the same at every γ: C&R moves the class's *shorter* members to the short pool and
    makes none of them slower, so a larger γ can no longer fail a plan merely because the
    long pool's P99 length rises as it drains (the paper's per-pool Eq. 8, "paper"). At
    γ = 1 the two checks coincide for the long pool."""
    shape = short.floor.shape
    edge = cal.edge_grid.broadcast(shape).floor
    native = cal.short_grid.broadcast(shape).floor
    short_floor = np.where(compressed, np.maximum(native, edge), native)
    long_floor = np.broadcast_to(cal.class_floor[:, None], shape)
    return replace(short, floor=short_floor), replace(long, floor=long_floor.copy())


def _mix(a: FloatArray, b: FloatArray, wa: FloatArray, wb: FloatArray) -> FloatArray:
    tot = wa + wb
    out: FloatArray = np.where(tot > 0, (wa * a + wb * b) / np.where(tot > 0, tot, 1.0), a)
    return out
