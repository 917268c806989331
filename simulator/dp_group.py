"""A lockstep data-parallel (DP) group under a permanent backlog: the balancing paper's
simulator ("A Universal Load Balancing Principle and Its Application to LLM Serving", §6),
driven by the assignment policies of policies/assign/ — the same `decide` code a live
`dp_group` pool will call.

Model. G ranks of B slots step together. At step k every running request on rank g reads
its whole context (prompt + tokens generated so far), so rank g's work is
    t_g = W + H·n_g + K·L_g            (n_g running requests, L_g their summed context)
and the step lasts t_step = T_sync + max_g t_g: the barrier makes every rank wait for the
slowest (`StepModel`). The paper's own step model is T_sync = C, W = H = 0, K = t_ℓ.
Each step every running request makes one token; a request with output length o leaves
after its o-th step. The holding pool is refilled to R requests before every decision
(the paper's revelation target: the system is always backlogged), and the policy fills
the free slots from it.

Metrics (after a warm-up): per-step imbalance Imb(k) = G·max_g L_g − Σ_g L_g (the paper's
eq. 2) and its mean; the barrier-idle fraction idle(k) = Σ_g (max t − t_g) / (G·t_step);
throughput = Σ_k |A(k)| / Σ_k t_step (eq. 8); TPOT = mean over finished requests of
(finish − start of service) / o (eq. 9: pool wait not counted); pool wait (reveal →
admission) P50/P99, which the paper does not report; energy (the paper's eq. 58,
`EnergyModel`). Optionally every rank's L_g per step, or a `StepRecord` per measured step
to a recorder callback (bench/bfio_plots.py draws them).

This module never goes through simulator/driver.py: a backlogged lockstep group has no
arrival process or per-request routing, only an assignment at every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from policies.assign import Assigner, Instance
from policies.assign.predict import resident_profile
from simulator.dp_lengths import Lengths, synthetic_burstgpt


@dataclass(frozen=True)
class StepModel:
    """t_step = T_sync + max_g (W + H·n_g + K·L_g), in seconds.

    Defaults (our assumptions; the paper gives neither C nor t_ℓ): T_sync = 2 ms for the
    barrier's collectives, W = 5 ms of per-step weight reads, H = 50 µs per running request,
    K = 0.25 µs per context token of attention reads. At the paper's setting (B = 72, about
    1.1k context tokens a slot, L ≈ 80k a rank) a step lasts ≈ 31 ms, near the 28.8 ms that
    the paper's Table 1 implies (2304 slots ÷ 8.0e4 tok/s), with the context term about
    two thirds of it. Gains shrink as the fixed part grows: report them against
    (T_sync + W + H·B) / (K · mean L).
    """

    t_sync: float = 2e-3
    w: float = 5e-3
    h: float = 5e-5
    k: float = 2.5e-7

    def rank_times(
        self, running: npt.NDArray[np.int64], loads: npt.NDArray[np.float64]
    ) -> npt.NDArray[np.float64]:
        out: npt.NDArray[np.float64] = self.w + self.h * running + self.k * loads
        return out

    def step_time(self, running: npt.NDArray[np.int64], loads: npt.NDArray[np.float64]) -> float:
        return self.t_sync + float(self.rank_times(running, loads).max())


@dataclass(frozen=True)
class EnergyModel:
    """The paper's energy (its eq. 58): E = Σ_k Σ_g P(mfu_g(k))·Δt(k), with its power curve
    P(mfu) = P_idle + (P_max − P_idle)·(mfu / mfu_sat)^γ (eq. 57) and its constants.

    The paper does not say how it gets a rank's mfu_g(k); ours (an assumption): a rank
    computes at `mfu_busy` for its own work t_g of the step and idles (mfu 0) for the rest,
    the barrier wait and the collectives (T_sync), so mfu_g(k) = mfu_busy·t_g / Δt(k).
    mfu_busy = mfu_sat by default: a computing rank at the utilisation where the paper's
    power saturates ("inference workloads rarely exceed this threshold"), so a rank busy the
    whole step draws P_max and one idle the whole step P_idle. The model size and GPU the
    paper's eq. 56 needs are not given either; this needs neither."""

    p_idle: float = 100.0  # W
    p_max: float = 400.0  # W
    mfu_sat: float = 0.45
    gamma: float = 0.7
    mfu_busy: float = 0.45

    def step_energy(self, rank_times: npt.NDArray[np.float64], dt: float) -> float:
        """Σ_g P(mfu_g)·Δt of one step, joules."""
        mfu = self.mfu_busy * np.minimum(rank_times / dt, 1.0)
        power = self.p_idle + (self.p_max - self.p_idle) * (mfu / self.mfu_sat) ** self.gamma
        return float(power.sum() * dt)


@dataclass(frozen=True)
class GroupConfig:
    ranks: int = 32  # G
    slots: int = 72  # B
    pool_target: int = 128  # R
    steps: int = 5000  # measured steps, after the warm-up
    warmup: int = 1500  # steps run before measuring (fill the group, age the residents)
    seed: int = 0
    step_model: StepModel = field(default_factory=StepModel)
    energy_model: EnergyModel = field(default_factory=EnergyModel)
    record_loads: bool = False  # keep every rank's L_g per measured step
    # Instant dispatch (the paper's §7.3 interface; ablation): each request is bound to a
    # rank the moment it is revealed and waits in that rank's FIFO queue; a rank admits from
    # its own queue only. "count": the rank with the fewest running + queued requests;
    # "tokens": the smallest running load + queued prompts. None: the central pool and the
    # assigner (every policy of policies/assign/).
    instant_dispatch: str | None = None
    # Clients' max_tokens (for the max_tokens_bound predictor; BurstGPT has none): each
    # request's true output length o times (1 + slack·u), u ~ U(0, 1) from a generator of
    # its own (the lengths stay those of every other run), rounded up. None: no max_tokens.
    max_tokens_slack: float | None = None

    def __post_init__(self) -> None:
        if self.instant_dispatch not in (None, "count", "tokens"):
            raise ValueError(
                f"instant_dispatch: count, tokens or None, not {self.instant_dispatch!r}"
            )
        if self.max_tokens_slack is not None and self.max_tokens_slack < 0:
            raise ValueError("max_tokens_slack cannot be negative")


@dataclass
class GroupResult:
    avg_imbalance: float  # tokens
    avg_gap: float  # max_g L_g − min_g L_g, tokens
    idle_fraction: float  # mean per-step barrier-idle share of rank time
    throughput: float  # tokens/s
    tpot: float  # s/token
    pool_wait_p50: float  # s
    pool_wait_p99: float  # s
    mean_load: float  # mean L_g, tokens
    step_time: float  # mean t_step, s
    finished: int
    energy: float = 0.0  # J over the measured steps (eq. 58, EnergyModel)
    energy_per_token: float = 0.0  # J per generated token over the measured steps
    decide_s: list[float] = field(default_factory=list)  # per-step decision cost, s (unused here)
    loads: npt.NDArray[np.float32] | None = None  # [steps, G] when recorded

    def row(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("loads", "decide_s")}


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One measured step as a recorder sees it (after the step's admissions)."""

    step: int  # measured step index, 0 after the warm-up
    loads: npt.NDArray[np.float64]  # L_g of every rank, [G]
    rank_times: npt.NDArray[np.float64]  # t_g of every rank, [G], s
    step_time: float  # t_step, s
    imbalance: float  # G·max L − Σ L (eq. 2)
    idle: float  # Σ_g (max t − t_g) / (G·t_step)
    waits: tuple[float, ...]  # pool waits (reveal → admission) of this step's admissions, s


def run_group(
    assigner: Assigner,
    config: GroupConfig,
    lengths: Lengths | None = None,
    warmup_with: Assigner | None = None,
    recorder: Callable[[StepRecord], None] | None = None,
) -> GroupResult:
    """One backlogged run of `assigner` on a lockstep group; deterministic given the seed.

    `warmup_with` decides during the warm-up instead (e.g. BF-IO with H = 0 before a costly
    H = 20 run: the warm-up only has to bring the group to its steady state). `recorder`, if
    given, is called with every measured step's `StepRecord` (it must not keep the arrays
    past the call without copying: they are fresh per step, but that is not promised)."""
    lengths = lengths or synthetic_burstgpt()
    g_n, b_n = config.ranks, config.slots
    horizon = max(assigner.lookahead_steps, warmup_with.lookahead_steps if warmup_with else 0) + 1
    rng = np.random.default_rng(config.seed)
    model = config.step_model

    active = np.zeros((g_n, b_n), dtype=bool)
    context = np.zeros((g_n, b_n), dtype=np.float64)  # s + τ
    generated = np.zeros((g_n, b_n), dtype=np.int64)
    output = np.ones((g_n, b_n), dtype=np.int64)
    predicted = np.full((g_n, b_n), math.inf)  # the predictor's output length
    started = np.zeros((g_n, b_n), dtype=np.float64)

    pool_s: list[int] = []
    pool_o: list[int] = []
    pool_t: list[float] = []
    pool_id: list[int] = []
    pool_rank: list[int] = []  # instant dispatch: the rank each pooled request is bound to
    pool_mt: list[int | None] = []  # each pooled request's max_tokens
    mt_rng = np.random.default_rng([config.seed, 1])
    next_id = 0
    batch_s, batch_o = lengths.draw(rng, 4096)
    batch_at = 0

    now = 0.0
    total = config.warmup + config.steps
    imb = np.zeros(config.steps)
    gap = np.zeros(config.steps)
    idle = np.zeros(config.steps)
    dts = np.zeros(config.steps)
    tokens = np.zeros(config.steps)
    joules = np.zeros(config.steps)
    waits: list[float] = []
    tpots: list[float] = []
    mean_loads = np.zeros(config.steps)
    trace = np.zeros((config.steps, g_n), dtype=np.float32) if config.record_loads else None
    predictor = assigner.predictor

    for k in range(total):
        measuring = k >= config.warmup
        if config.instant_dispatch is not None and len(pool_s) < config.pool_target:
            # what each rank holds now: running + queued requests, and their tokens
            held = active.sum(axis=1) + np.bincount(pool_rank, minlength=g_n)
            held_tokens = np.where(active, context, 0.0).sum(axis=1) + np.bincount(
                pool_rank, weights=pool_s, minlength=g_n
            )
            by = held if config.instant_dispatch == "count" else held_tokens
        while len(pool_s) < config.pool_target:
            if batch_at == len(batch_s):
                batch_s, batch_o = lengths.draw(rng, 4096)
                batch_at = 0
            pool_s.append(int(batch_s[batch_at]))
            pool_o.append(int(batch_o[batch_at]))
            if config.max_tokens_slack is None:
                pool_mt.append(None)
            else:
                factor = 1.0 + config.max_tokens_slack * float(mt_rng.random())
                pool_mt.append(math.ceil(pool_o[-1] * factor))
            if config.instant_dispatch is not None:
                g = int(np.argmin(by))  # ties: the lowest index
                pool_rank.append(g)
                held[g] += 1
                held_tokens[g] += pool_s[-1]
            pool_t.append(now)
            pool_id.append(next_id)
            next_id += 1
            batch_at += 1

        count = active.sum(axis=1)
        deciding = assigner if measuring or warmup_with is None else warmup_with
        if horizon == 1:
            base = np.where(active, context, 0.0).sum(axis=1)[:, None]
        else:
            remaining = np.where(active, np.maximum(1.0, predicted - generated), 0.0)
            base = (
                resident_profile(context.reshape(-1), remaining.reshape(-1), horizon)
                .reshape(g_n, b_n, horizon)
                .sum(axis=1)
            )
        inst = Instance(
            base=np.ascontiguousarray(base[:, : deciding.lookahead_steps + 1]),
            free=(b_n - count).astype(np.int64),
            count=count.astype(np.int64),
            sizes=np.array(pool_s, dtype=np.int64),
            waited=now - np.array(pool_t, dtype=np.float64),
        )
        if config.instant_dispatch is None:
            decision = deciding.decide(inst)
        else:  # each rank admits the head of its own queue
            room = inst.free.copy()
            decision = []
            for i, g in enumerate(pool_rank):
                if room[g] > 0:
                    room[g] -= 1
                    decision.append((i, g))
        taken = []
        step_waits: list[float] = []
        for i, g in decision:
            b = int(np.flatnonzero(~active[g])[0])
            active[g, b] = True
            context[g, b] = pool_s[i]
            generated[g, b] = 0
            output[g, b] = pool_o[i]
            seen = _Seen(str(pool_id[i]), pool_o[i], max_tokens=pool_mt[i])
            predicted[g, b] = predictor.predicted_length(seen)
            started[g, b] = now
            if measuring:
                waits.append(now - pool_t[i])
                step_waits.append(now - pool_t[i])
            taken.append(i)
        for i in sorted(taken, reverse=True):
            del pool_s[i], pool_o[i], pool_t[i], pool_id[i], pool_mt[i]
            if pool_rank:
                del pool_rank[i]

        running = active.sum(axis=1)
        loads = np.where(active, context, 0.0).sum(axis=1)
        times = model.rank_times(running, loads)
        dt = model.t_sync + float(times.max())
        if measuring:
            j = k - config.warmup
            imb[j] = g_n * loads.max() - loads.sum()
            gap[j] = loads.max() - loads.min()
            idle[j] = float((times.max() - times).sum()) / (g_n * dt)
            dts[j] = dt
            tokens[j] = running.sum()
            joules[j] = config.energy_model.step_energy(times, dt)
            mean_loads[j] = loads.mean()
            if trace is not None:
                trace[j] = loads
            if recorder is not None:
                recorder(
                    StepRecord(
                        j, loads, times, dt, float(imb[j]), float(idle[j]), tuple(step_waits)
                    )
                )
        now += dt
        generated[active] += 1
        context[active] += 1
        done = active & (generated >= output)
        if measuring and done.any():
            tpots.extend(((now - started[done]) / output[done]).tolist())
        active &= ~done

    wait = np.array(waits) if waits else np.zeros(1)
    return GroupResult(
        avg_imbalance=float(imb.mean()),
        avg_gap=float(gap.mean()),
        idle_fraction=float(idle.mean()),
        throughput=float(tokens.sum() / dts.sum()),
        tpot=float(np.mean(tpots)) if tpots else math.nan,
        pool_wait_p50=float(np.percentile(wait, 50)),
        pool_wait_p99=float(np.percentile(wait, 99)),
        mean_load=float(mean_loads.mean()),
        step_time=float(dts.mean()),
        finished=len(tpots),
        energy=float(joules.sum()),
        energy_per_token=float(joules.sum() / tokens.sum()) if tokens.sum() else math.nan,
        loads=trace,
    )


@dataclass(frozen=True, slots=True)
class _Seen:
    """What a predictor may read of a request at admission (the simulator knows o)."""

    id: str
    output_tokens: int
    generated: int = 0
    max_tokens: int | None = None
