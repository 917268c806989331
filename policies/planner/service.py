"""The iteration model and per-pool service moments (FleetOpt §3.1–3.2, Eq. 3, 4, 7).

A request of L_total tokens, split into L_in = max(1, ⌊f·L⌋) and L_out = max(1, L − L_in)
(PlannerOptions.input_fraction; or L_out = min(k, L − 1) with a fixed output budget k),
holds one KV slot of a pool with n_max slots per GPU for

    S(L) = (⌈L_in / C_chunk⌉ + L_out) · t_iter,   t_iter = W + H·σ(L)·n_max   (Eq. 3–4)

where σ(L) = (L_in + L_out)/C_calib when H scales with the request's context ("request",
the reference simulator) and σ = 1 for Eq. 3 as printed ("none"). Under continuous batching
all n_max slots step together, so one GPU serves μ_gpu = n_max / E[S] requests per second.

Writing S = k·(W + H·σ·n_active) with k = ⌈L_in/C_chunk⌉ + L_out iterations, E[k] and
E[k·σ] are kept too: they give the slot occupancy a pool settles at when each iteration
costs what the batch actually running costs (n_active = busy slots, not n_max) — the fixed
point of ρ = λ·(W·E[k] + H·ρ·n_max·E[kσ])/(n·n_max), i.e.

    ρ_load = λ·W·E[k] / (n_max·(n − λ·H·E[kσ]))          (in (0, ρ) whenever ρ < 1)

which is what a batch-accurate engine (our simulator, a live vLLM's running/max_num_seqs)
shows, while ρ = λ/(n μ_gpu) is the paper's full-batch figure (Table 5's ρ_ana).

The part of TTFT no GPU count can buy (Eq. 7 without the queue) is
    floor(L) = ⌈L_in / C_chunk⌉ · t_iter' + t_iter'
with t_iter' at one active sequence ("solo") or at n_max ("full"), taken at the pool's P99
length (prefill is monotone in L, so this is the P99 of prefill) or averaged ("mean").

Moments E[S], E[S²] come either from the paper's Monte Carlo estimate — `mc_draws` draws
from a fresh `random.Random(mc_seed)`, one `random()` to pick the bin and one `randint`
inside it, exactly the reference simulator's sampler, on whose noise the paper's tables
depend — or exactly, from prefix sums of S and S² over every integer length.

A request Compress-and-Route moved into a pool of context B (`compress_to` = B) keeps its
output and has its prompt cut to T_c = B − L_out (§5.1, Eq. 15): S = (⌈T_c/C_chunk⌉ +
L_out)·t_iter, σ = B/C_calib. Its answer is what it holds a slot for: an Azure band request
(4–8K tokens) decodes ~1,100 tokens against ~230 for a request below 4,096.

Failure posture: pure arithmetic; a distribution with no mass raises ValueError.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from policies.planner.options import PlannerOptions
from policies.planner.profile import HardwareProfile
from policies.planner.workload import PoolDistribution

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PoolMoments:
    """What sizing needs to know about one pool's requests."""

    n_slots: int  # n_max: KV slots per GPU at the pool's context
    mean_s: float  # E[S], seconds a request holds a slot
    mean_s2: float  # E[S²]
    ttft_floor_s: float  # T_prefill + t_iter (Eq. 7 without the queue), per prefill_stat
    p99_length: int  # the pool's P99 L_total (tokens)
    mean_length: float  # E[L_total] (tokens)
    # S = k·(W + H·σ·n_active) with k = ⌈L_in/C⌉ + L_out iterations and σ the H scale:
    mean_k: float  # E[k]
    mean_k_sigma: float  # E[k·σ]

    @property
    def mu_gpu(self) -> float:
        """Requests per second one GPU completes at full occupancy."""
        return self.n_slots / self.mean_s

    @property
    def cv2(self) -> float:
        """Squared coefficient of variation of S, floored at 0.01 as the reference does."""
        return max(0.01, self.mean_s2 / (self.mean_s * self.mean_s) - 1.0)


def split(
    lengths: IntArray, options: PlannerOptions, compress_to: int | None = None
) -> tuple[IntArray, IntArray]:
    """(L_in, L_out) for each L_total.

    With `compress_to` = B the request is served as Compress-and-Route serves it (§5.1):
    its prompt cut to T_c = B − L_out (Eq. 15), never lengthened, its output unchanged —
    compression shortens the question, not the answer."""
    if options.fixed_output_tokens is not None:
        l_out = np.maximum(1, np.minimum(options.fixed_output_tokens, lengths - 1))
        l_in = np.maximum(1, lengths - l_out)
    else:
        # float product then truncation, as the reference computes int(L * 0.8)
        l_in = np.maximum(1, (lengths * options.input_fraction).astype(np.int64))
        l_out = np.maximum(1, lengths - l_in)
    if compress_to is not None:
        l_in = np.minimum(l_in, np.maximum(1, compress_to - l_out))
    return l_in, l_out


def iterations_and_sigma(
    lengths: IntArray,
    profile: HardwareProfile,
    options: PlannerOptions,
    compress_to: int | None = None,
) -> tuple[FloatArray, FloatArray]:
    """(k, σ) per L_total: iterations a request holds its slot for, and its H scale."""
    l_in, l_out = split(lengths, options, compress_to)
    k = (-(-l_in // profile.chunk) + l_out).astype(np.float64)
    if options.h_scaling == "request":
        sigma = (l_in + l_out).astype(np.float64) / profile.calib_ctx
    else:
        sigma = np.ones_like(k)
    return k, sigma


def _iter_time(
    seq: FloatArray, n_active: int | FloatArray, profile: HardwareProfile, options: PlannerOptions
) -> FloatArray:
    if options.h_scaling == "request":
        h_eff = profile.h_s * (seq / profile.calib_ctx)
    else:
        h_eff = np.full_like(seq, profile.h_s)
    result: FloatArray = profile.w_s + h_eff * n_active
    return result


def service_time(
    lengths: IntArray,
    n_slots: int,
    profile: HardwareProfile,
    options: PlannerOptions,
    compress_to: int | None = None,
) -> FloatArray:
    """S(L) of Eq. 4 for each L_total, in a pool of n_slots slots per GPU."""
    l_in, l_out = split(lengths, options, compress_to)
    t_iter = _iter_time((l_in + l_out).astype(np.float64), n_slots, profile, options)
    chunks = -(-l_in // profile.chunk)
    result: FloatArray = (chunks + l_out) * t_iter
    return result


def ttft_floor(
    lengths: IntArray,
    n_slots: int,
    profile: HardwareProfile,
    options: PlannerOptions,
    compress_to: int | None = None,
) -> FloatArray:
    """T_prefill + one decode iteration for each L_total (Eq. 7 without the queue wait)."""
    l_in, l_out = split(lengths, options, compress_to)
    n_active = 1 if options.ttft_batch == "solo" else n_slots
    t_iter = _iter_time((l_in + l_out).astype(np.float64), n_active, profile, options)
    chunks = -(-l_in // profile.chunk)
    result: FloatArray = (chunks + 1) * t_iter
    return result


@dataclass(frozen=True, slots=True)
class LengthTable:
    """Prefix sums over L = 1..max_len of S, S², floor and L for one pool context: any
    bin's exact mean is then two look-ups."""

    n_slots: int
    s: FloatArray  # S(L) at index L (index 0 unused, = 0)
    cum_s: FloatArray
    cum_s2: FloatArray
    floor: FloatArray
    cum_floor: FloatArray
    k: FloatArray  # iterations k(L)
    ks: FloatArray  # k(L)·σ(L)
    cum_k: FloatArray
    cum_ks: FloatArray

    @staticmethod
    def build(
        max_len: int,
        n_slots: int,
        profile: HardwareProfile,
        options: PlannerOptions,
        compress_to: int | None = None,
    ) -> LengthTable:
        """The table for original lengths 1..max_len; with `compress_to` = B, each as
        Compress-and-Route serves it in a pool of context B (prompt ≤ B − L_out)."""
        lengths = np.arange(0, max_len + 1, dtype=np.int64)
        lengths[0] = 1  # placeholder; index 0 is excluded by the prefix sums below
        s = service_time(lengths, n_slots, profile, options, compress_to)
        fl = ttft_floor(lengths, n_slots, profile, options, compress_to)
        k, sigma = iterations_and_sigma(lengths, profile, options, compress_to)
        for arr in (s, fl, k):
            arr[0] = 0.0
        return LengthTable(
            n_slots,
            s,
            np.cumsum(s),
            np.cumsum(s * s),
            fl,
            np.cumsum(fl),
            k,
            k * sigma,
            np.cumsum(k),
            np.cumsum(k * sigma),
        )


def _bin_means(table: LengthTable, cum: FloatArray, lo: IntArray, hi: IntArray) -> FloatArray:
    result: FloatArray = (cum[hi] - cum[lo - 1]) / (hi - lo + 1)
    return result


def exact_moments(
    dist: PoolDistribution, table: LengthTable, options: PlannerOptions
) -> PoolMoments:
    """E[S], E[S²] and the TTFT floor as exact expectations over the distribution."""
    p = np.asarray(dist.probabilities(), dtype=np.float64)
    total = float(p.sum())
    if total <= 0:
        raise ValueError("a pool distribution without mass")
    p = p / total
    lo = np.asarray(dist.lo, dtype=np.int64)
    hi = np.asarray(dist.hi, dtype=np.int64)
    m1 = float(p @ _bin_means(table, table.cum_s, lo, hi))
    m2 = float(p @ _bin_means(table, table.cum_s2, lo, hi))
    mean_len = float(p @ ((lo + hi) / 2.0))
    return PoolMoments(
        table.n_slots,
        m1,
        m2,
        _floor(dist, table, p, lo, hi, options),
        dist.quantile(0.99),
        mean_len,
        float(p @ _bin_means(table, table.cum_k, lo, hi)),
        float(p @ _bin_means(table, table.cum_ks, lo, hi)),
    )


def _floor(
    dist: PoolDistribution,
    table: LengthTable,
    p: FloatArray,
    lo: IntArray,
    hi: IntArray,
    options: PlannerOptions,
) -> float:
    if options.prefill_stat == "mean":
        return float(p @ _bin_means(table, table.cum_floor, lo, hi))
    return float(table.floor[dist.quantile(0.99)])


def monte_carlo_moments(
    dist: PoolDistribution, table: LengthTable, options: PlannerOptions
) -> PoolMoments:
    """The paper's estimate: sample moments of S over `mc_draws` seeded draws.

    The draw sequence is the reference simulator's (a fresh Random(seed); per draw one
    random() u, the first bin with cum ≥ u, one randint in the bin unless the bin is a
    single clamped length), and the sums are accumulated in the same order, so the moments
    agree with it bit for bit."""
    rng = random.Random(options.mc_seed)
    s_of = table.s
    total = 0.0
    total2 = 0.0
    total_len = 0
    lengths: list[int] = []
    n = 0
    bins = list(zip(dist.cum, dist.lo, dist.hi, dist.drawn, strict=True))
    for _ in range(options.mc_draws):
        u = rng.random()
        for c, lo, hi, drawn in bins:
            if u <= c:
                length = rng.randint(lo, hi) if drawn else hi
                s = float(s_of[length])
                total += s
                total2 += s * s
                total_len += length
                lengths.append(length)
                n += 1
                break
    if n == 0:
        raise ValueError("no Monte Carlo draw landed in the distribution")
    p = np.asarray(dist.probabilities(), dtype=np.float64)
    p = p / float(p.sum())
    lo_a = np.asarray(dist.lo, dtype=np.int64)
    hi_a = np.asarray(dist.hi, dtype=np.int64)
    picked = np.asarray(lengths, dtype=np.int64)
    return PoolMoments(
        table.n_slots,
        total / n,
        total2 / n,
        _floor(dist, table, p, lo_a, hi_a, options),
        dist.quantile(0.99),
        total_len / n,
        float(table.k[picked].mean()),
        float(table.ks[picked].mean()),
    )


def point_moments(length: int, table: LengthTable) -> PoolMoments:
    """Every request at one length (compressed requests at B, Eq. 15)."""
    s = float(table.s[length])
    fl = float(table.floor[length])
    k, ks = float(table.k[length]), float(table.ks[length])
    return PoolMoments(table.n_slots, s, s * s, fl, length, float(length), k, ks)


def moments(dist: PoolDistribution, table: LengthTable, options: PlannerOptions) -> PoolMoments:
    if options.moments == "exact":
        return exact_moments(dist, table, options)
    return monte_carlo_moments(dist, table, options)
