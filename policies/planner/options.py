"""Every modelling choice FleetOpt leaves open, as one explicit option set.

The paper (§3–4, §6, App. A) fixes the queueing model but not how it is fed. Each field
below is one such choice. `PAPER` is the combination that reproduces the paper's Tables 3,
5 (ρ_ana) and 6 cell for cell (the reference simulator's choices, inference-fleet-sim,
which the paper's numbers were computed with — see simulator/data/README.md). The
defaults (`DEFAULT`) differ from it in one place: how compressed requests load the short
pool (`compressed_mass`). Algorithm 1 step 5 calibrates the short pool on F over [1, B]
whatever γ, so a compressed request is priced as an ordinary short one; but compression
shortens the prompt, not the answer — a band request keeps its original output (about
5× a short request's on Azure at B 4,096), and the fleet sized the paper's way is unstable
in simulation (bench/sim_compress_and_route.py). `EXACT` is the defaults with exact
moments instead of Monte Carlo ones: the principled choice for a live planner.

Failure posture: an unknown option value raises ValueError at construction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Moments = Literal["monte_carlo", "exact"]
Interpolation = Literal["linear", "step"]
HScaling = Literal["request", "none"]
LongEdge = Literal["inclusive", "exclusive"]
CompressedMass = Literal["band", "restricted", "at_boundary"]
UncompressedBand = Literal["ignore", "long"]
PrefillStat = Literal["p99", "mean"]
TtftBatch = Literal["solo", "full"]
SloBudget = Literal["eq8", "wait_only"]
SloCheck = Literal["per_class", "paper"]

CHOICES: dict[str, tuple[str, ...]] = {
    "moments": ("monte_carlo", "exact"),
    "interpolation": ("linear", "step"),
    "h_scaling": ("request", "none"),
    "long_edge": ("inclusive", "exclusive"),
    "compressed_mass": ("band", "restricted", "at_boundary"),
    "uncompressed_band": ("ignore", "long"),
    "prefill_stat": ("p99", "mean"),
    "ttft_batch": ("solo", "full"),
    "slo_budget": ("eq8", "wait_only"),
    "slo_check": ("per_class", "paper"),
}

# γ ∈ {1.0, 1.1, …, 2.0} (§4.3, Algorithm 1), built as the reference builds it so that
# ⌊γ·B⌋ lands on the same integers.
GAMMAS: tuple[float, ...] = tuple(round(1.0 + 0.1 * k, 1) for k in range(11))


@dataclass(frozen=True, slots=True)
class PlannerOptions:
    """How the planner turns a CDF into per-pool service moments and sizes the pools."""

    # E[S], E[S²] per pool: "monte_carlo" = the paper's §3.1 estimate (the tables depend on
    # its noise), "exact" = expectations over the piecewise-uniform CDF.
    moments: Moments = "monte_carlo"
    mc_draws: int = 3000  # reference calibration: 3,000 draws per pool
    mc_seed: int = 42  # a fresh Random(42) per pool calibration, as the reference does
    # F between breakpoints: "linear" (uniform integer lengths within a bin, origin (0,0):
    # the data files' stated semantics) or "step" (all of a bin's mass at its upper edge).
    interpolation: Interpolation = "linear"
    # L_total → (L_in, L_out): L_in = max(1, ⌊f·L⌋), L_out = max(1, L − L_in). The traces give
    # only totals; 0.8 is the reference simulator's split (raw Azure is 0.90, see README).
    input_fraction: float = 0.8
    # If set, L_out = min(this, L − 1) instead of the fraction (e.g. a gateway's max_tokens).
    fixed_output_tokens: int | None = None
    # H in Eq. 3: "request" = H·(L/C_calib), attention cost grows with the request's context
    # (reference; needed to reproduce the tables), "none" = Eq. 3 as printed.
    h_scaling: HScaling = "request"
    # The long pool's first bin after ⌊γB⌋: "inclusive" samples [⌊γB⌋, t] (reference),
    # "exclusive" samples [⌊γB⌋+1, t] (strictly above the band).
    long_edge: LongEdge = "inclusive"
    # Short-pool service under C&R, a mixture weighted by arrival rate (F(B) short requests,
    # (F(⌊γB⌋) − F(B))·p_c compressed ones): "band" = the band (B, ⌊γB⌋]'s own requests
    # as C&R serves them, prompt cut to T_c = B − L_out (§5.1, Eq. 15), original output;
    # "restricted" = F on [1, B] whatever γ (Algorithm 1 step 5, the paper's tables: a
    # compressed request priced as a short one); "at_boundary" = every compressed request
    # at L_total = B split like any other (its output shrinks to B's share).
    compressed_mass: CompressedMass = "band"
    # Long-pool distribution when p_c < 1: "ignore" = F on (⌊γB⌋, ∞) only (Algorithm 1 step
    # 6; the band is used only if nothing lies above ⌊γB⌋, so its traffic is never dropped),
    # "long" = that mixed with the uncompressed band (B, ⌊γB⌋] in proportion (1 − p_c)β.
    uncompressed_band: UncompressedBand = "ignore"
    # T_prefill in the TTFT floor: "p99" (Eq. 8) or "mean" (the reference's TTFT report).
    prefill_stat: PrefillStat = "p99"
    # Iterations in the TTFT floor: "solo" = the request alone in the batch (§3.2: prefill is
    # "independent of batch size"), "full" = Eq. 3 at n_max active slots (pessimistic).
    ttft_batch: TtftBatch = "solo"
    # Eq. 8 budget: "eq8" = W99 ≤ T_slo − T_prefill − t_iter; "wait_only" = W99 ≤ T_slo (the
    # reference simulator's sizing loop).
    slo_budget: SloBudget = "eq8"
    # Whose P99 request sets a pool's TTFT floor (with prefill_stat "p99"): "per_class" =
    # each request judged in its class as a user sees it — short requests at the P99 of
    # [1, B], compressed ones at L = B (Eq. 15), the long class (B, ∞) at its own P99
    # request wherever C&R moved its shorter members, so that draining the long pool with
    # a larger γ (no request slower) never fails a plan; "paper" = Eq. 8 per pool, at the
    # P99 of whatever the pool holds after compression (the long pool's P99 rises with γ).
    # Equal at γ = 1; see sweep.py.
    slo_check: SloCheck = "per_class"
    rho_max: float = 0.85  # §4.1: utilisation cap, keeps Kimura in its accurate range
    headroom_gpus: int = 1  # n ≥ ⌈λ/μ_gpu⌉ + 1: the reference's stable starting point
    # Pools offered less than this (req/s) get no GPUs (the reference uses 0.01 for the
    # long pool); 0 keeps a pool for any traffic at all.
    min_pool_rate: float = 0.0

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}={value!r}: expected one of {allowed}")
        if not 0.0 < self.input_fraction < 1.0:
            raise ValueError("input_fraction must be in (0, 1)")
        if self.fixed_output_tokens is not None and self.fixed_output_tokens < 1:
            raise ValueError("fixed_output_tokens must be ≥ 1")
        if not 0.0 < self.rho_max < 1.0:
            raise ValueError("rho_max must be in (0, 1)")
        if self.mc_draws < 1:
            raise ValueError("mc_draws must be ≥ 1")
        if self.headroom_gpus < 0 or self.min_pool_rate < 0:
            raise ValueError("headroom_gpus and min_pool_rate must be ≥ 0")

    def describe(self) -> dict[str, object]:
        """The options as plain data (for JSON output and reports)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


DEFAULT = PlannerOptions()
PAPER = replace(DEFAULT, compressed_mass="restricted")  # reproduces Tables 3, 5, 6
EXACT = replace(DEFAULT, moments="exact")
