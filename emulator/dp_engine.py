"""A data-parallel group: G engine models stepping in lockstep (`--data-parallel-size G`).

Large MoE deployments run one engine as G data-parallel ranks (DP attention with expert
parallelism) that wait for each other at every forward pass: a rank with no work runs a
dummy pass, and a step lasts as long as the slowest rank. Each rank here is one
`emulator.engine.Engine` (its own batch of `max_num_seqs`, its own KV cache); the group's
step is

    t_g    = W + H·n_g + prefill_token_s·prefill_g + K·L_g     (rank g's own work)
    t_step = T_sync + max_g t_g

with L_g the context tokens of rank g's running requests (prompt + generated: the KV a
decode step reads). With K = 0 count balancing is already optimal; the per-context-token
term is what makes the choice of rank matter (docs/BFIO.md). An idle rank's dummy pass
costs W.

A request names its rank (`EngineRequest.dp_rank`: vLLM's `X-data-parallel-rank` header,
SGLang's `routed_dp_rank`/`data_parallel_rank`, WIRE_SPEC §10); a request naming none is
placed as vLLM's internal balancer does, on the rank with the fewest running + waiting
requests (lowest index on ties). The same class is the simulator's engine for a dp_group
pool (simulator/cluster.py), so both drivers see the same barrier.

It has `Engine`'s driving interface (submit, abort, step, has_work, num_running,
num_waiting, kv_usage, stats): the emulator's driver and the simulator's worker step it
unchanged. Per-rank figures (`rank_stats`, `loads`, `counts`) and the barrier accounting
(`busy_rank_seconds`, `step_rank_seconds`: Σ_g t_g and G·Σ t_step) feed per-rank metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from emulator.engine import (
    Engine,
    EngineConfig,
    EngineRequest,
    EngineStats,
    FinishedRequest,
    StepResult,
)
from policies.clock import Clock


@dataclass(frozen=True, slots=True)
class DpConfig:
    ranks: int = 1  # G
    t_sync: float = 0.002  # T_sync: the barrier's own cost per step (seconds)
    k: float = 0.25e-6  # K: seconds per context token a rank holds, per step

    def __post_init__(self) -> None:
        if self.ranks < 1:
            raise ValueError("--data-parallel-size must be >= 1")
        if self.t_sync < 0 or self.k < 0:
            raise ValueError("the DP step's T_sync and K must be >= 0")


class DpEngine:
    """G `Engine`s stepping in lockstep (see the module docstring)."""

    def __init__(self, config: EngineConfig, clock: Clock, dp: DpConfig) -> None:
        self.config = config
        self.clock = clock
        self.dp = dp
        self.ranks = [Engine(config, clock) for _ in range(dp.ranks)]
        self._rank_of: dict[str, int] = {}
        self._first: dict[str, float] = {}  # first-token times at the barrier's end
        self.busy_rank_seconds = 0.0  # Σ over steps and ranks of t_g
        self.step_rank_seconds = 0.0  # Σ over steps of G·t_step
        self.last_rank_times: tuple[float, ...] = ()
        self._steps = 0

    # -- Engine's driving interface --------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        g = request.dp_rank
        if g is None:
            g = min(range(len(self.ranks)), key=lambda i: self._queued(i))
        elif not 0 <= g < len(self.ranks):
            raise ValueError(f"data parallel rank {g} is out of range [0, {len(self.ranks)})")
        self.ranks[g].submit(request)
        self._rank_of[request.id] = g

    def abort(self, request_id: str) -> FinishedRequest | None:
        g = self._rank_of.pop(request_id, None)
        if g is None:
            return None
        self._first.pop(request_id, None)
        return self.ranks[g].abort(request_id)

    def has_work(self) -> bool:
        return any(e.has_work() for e in self.ranks)

    def step(self) -> StepResult:
        now = self.clock.now()
        if not self.has_work():
            return StepResult(now, 0.0, 0, 0, (), ())
        cfg, dp = self.config, self.dp
        loads = [e.context_tokens for e in self.ranks]  # what this step's decode reads
        results = [e.step() for e in self.ranks]
        times = tuple(
            (r.duration if r.batch_size else cfg.w) + dp.k * load
            for r, load in zip(results, loads, strict=True)
        )
        duration = dp.t_sync + max(times)
        end = now + duration
        self.last_rank_times = times
        self._steps += 1
        self.busy_rank_seconds += sum(times)
        self.step_rank_seconds += len(times) * duration
        tokens: list[str] = []
        finished: list[FinishedRequest] = []
        preempted: list[str] = []
        first = self._first
        for r in results:
            for rid in r.tokens:
                if rid not in first:
                    first[rid] = end
            tokens.extend(r.tokens)
            preempted.extend(r.preempted)
            for f in r.finished:
                self._rank_of.pop(f.id, None)
                t_first = first.pop(f.id, None)
                finished.append(dataclasses.replace(f, finished=end, first_token=t_first))
        return StepResult(
            now,
            duration,
            sum(r.batch_size for r in results),
            sum(r.prefill_tokens for r in results),
            tuple(tokens),
            tuple(finished),
            tuple(preempted),
        )

    @property
    def num_running(self) -> int:
        return sum(e.num_running for e in self.ranks)

    @property
    def num_waiting(self) -> int:
        return sum(e.num_waiting for e in self.ranks)

    @property
    def kv_usage(self) -> float:
        return sum(e.kv_usage for e in self.ranks) / len(self.ranks)

    @property
    def stats(self) -> EngineStats:
        """The group's figures: counters summed over the ranks, KV usage their mean."""
        out = EngineStats()
        reasons: dict[str, int] = {}
        for e in self.ranks:
            s = e.stats
            for f in dataclasses.fields(EngineStats):
                if f.name in ("kv_usage", "finished_by_reason", "steps"):
                    continue
                setattr(out, f.name, getattr(out, f.name) + getattr(s, f.name))
            for k, v in s.finished_by_reason.items():
                reasons[k] = reasons.get(k, 0) + v
        out.kv_usage = self.kv_usage
        out.finished_by_reason = reasons
        out.steps = self._steps
        return out

    def check_invariants(self) -> None:
        for e in self.ranks:
            e.check_invariants()

    # -- per rank ------------------------------------------------------------------------
    def rank_stats(self, g: int) -> EngineStats:
        return self.ranks[g].stats

    def loads(self) -> list[int]:
        """L_g: context tokens of each rank's running requests."""
        return [e.context_tokens for e in self.ranks]

    def counts(self) -> list[int]:
        return [e.num_running + e.num_waiting for e in self.ranks]

    def rank_of(self, request_id: str) -> int | None:
        return self._rank_of.get(request_id)

    @property
    def barrier_idle(self) -> float:
        """Σ_g (t_step − t_g) / (G·Σ t_step) so far: the share of rank time spent waiting
        at the barrier (the T_sync part counts as busy for nobody: it is idle too)."""
        if self.step_rank_seconds <= 0:
            return 0.0
        return 1.0 - self.busy_rank_seconds / self.step_rank_seconds

    def _queued(self, g: int) -> int:
        e = self.ranks[g]
        return e.num_running + e.num_waiting


def requested_rank(headers: Mapping[str, str], body: object, vllm: bool) -> int | None:
    """The rank a request names (WIRE_SPEC §10). vLLM: the `X-data-parallel-rank` header
    (not an integer: ignored, as vLLM's `_get_data_parallel_rank` does). SGLang: the
    `X-Data-Parallel-Rank` header wins over the body's `routed_dp_rank`, then its
    deprecated `data_parallel_rank`; a header that is not an integer is a 400."""
    value = headers.get("X-Data-Parallel-Rank")  # aiohttp's headers: case-insensitive
    if vllm:
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None
    if value is not None:
        try:
            return int(value)
        except ValueError:
            raise ValueError(
                f"Invalid X-Data-Parallel-Rank header: must be an integer, got '{value}'"
            ) from None
    if isinstance(body, dict):
        for key in ("routed_dp_rank", "data_parallel_rank"):
            v = body.get(key)
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return None
