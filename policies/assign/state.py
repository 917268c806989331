"""What an assignment policy sees: the ranks of one data-parallel group and the holding pool.

A data-parallel (DP) group is G ranks of one engine that step in lockstep: every decode step
lasts as long as the most loaded rank (DP attention with expert parallelism waits at a
barrier every forward pass). Requests wait in a holding pool in front of the group, and an
assignment policy chooses which of them fill which free slots (policies/assign/__init__.py).

Two views of the same state:
- plain dataclasses (`Resident`, `RankState`, `PooledRequest`) that a driver fills from what
  it observed: the exact prompt count and the tokens streamed so far;
- `Instance`, the arrays the solvers work on: each rank's predicted resident load over the
  next H+1 steps, its free slots, and the pooled requests' prompt lengths, oldest first. A
  simulator that already keeps its state in arrays builds an `Instance` directly, so both
  drivers run the very same decision code.

A rank's load is L_g = Σ over its residents of (prompt tokens + tokens generated so far):
the KV each decode step reads (the full prompt even on a prefix-cache hit: a hit saves
prefill and memory, not decode attention reads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from policies.assign.predict import Predictor, resident_profile

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Resident:
    """A request running on a rank.

    `output_tokens` is its true output length: only a simulator knows it (the `oracle`
    predictors read it; live drivers leave it None). `max_tokens` is what the client allowed
    (the `max_tokens_bound` predictor reads it).
    """

    id: str
    prompt_tokens: int
    generated: int = 0
    max_tokens: int | None = None
    output_tokens: int | None = None

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(frozen=True, slots=True)
class RankState:
    """One DP rank: `slots` = B (the engine's max_num_seqs), the requests running on it."""

    id: str
    slots: int
    residents: tuple[Resident, ...] = ()

    @property
    def free(self) -> int:
        return max(0, self.slots - len(self.residents))

    @property
    def load(self) -> int:
        return sum(r.context for r in self.residents)


@dataclass(frozen=True, slots=True)
class PooledRequest:
    """A request waiting in the holding pool (prefill not yet started)."""

    id: str
    prompt_tokens: int
    arrival: float
    max_tokens: int | None = None
    output_tokens: int | None = None  # simulator only, like Resident.output_tokens


@dataclass(frozen=True, slots=True)
class Instance:
    """One assignment decision as arrays.

    base[g, h]: the predicted load of rank g's residents at step k+h, h = 0..H (h = 0 is
    the current step); free[g]: its free slots; count[g]: its residents; sizes[i]: pooled
    request i's prompt tokens, oldest first; waited[i]: how long it has been pooled.
    A newly admitted request is predicted to contribute sizes[i] + h at step k+h (no
    prediction is made for new requests: the lookahead covers active ones only).
    """

    base: FloatArray
    free: IntArray
    count: IntArray
    sizes: IntArray
    waited: FloatArray

    @property
    def ranks(self) -> int:
        return int(self.base.shape[0])

    @property
    def horizon(self) -> int:
        """H + 1: the number of steps the objective sums over."""
        return int(self.base.shape[1])

    @property
    def fillable(self) -> int:
        """U = min(|pool|, Σ free): how many requests every policy admits."""
        return int(min(len(self.sizes), int(self.free.sum())))


def build_instance(
    pool: Sequence[PooledRequest],
    ranks: Sequence[RankState],
    now: float,
    lookahead_steps: int,
    predictor: Predictor,
) -> Instance:
    """The arrays for `pool` (already in arrival order) and `ranks`."""
    horizon = lookahead_steps + 1
    base = np.zeros((len(ranks), horizon), dtype=np.float64)
    for g, rank in enumerate(ranks):
        if not rank.residents:
            continue
        context = np.array([r.context for r in rank.residents], dtype=np.float64)
        remaining = np.array([predictor.remaining(r) for r in rank.residents], dtype=np.float64)
        base[g] = resident_profile(context, remaining, horizon).sum(axis=0)
    return Instance(
        base=base,
        free=np.array([r.free for r in ranks], dtype=np.int64),
        count=np.array([len(r.residents) for r in ranks], dtype=np.int64),
        sizes=np.array([p.prompt_tokens for p in pool], dtype=np.int64),
        waited=np.array([max(0.0, now - p.arrival) for p in pool], dtype=np.float64),
    )


def admitted_profile(sizes: IntArray, horizon: int) -> FloatArray:
    """[P, H+1]: what each pooled request would add at k+h once admitted (s_i + h)."""
    return sizes.astype(np.float64)[:, None] + np.arange(horizon, dtype=np.float64)[None, :]


def objective(inst: Instance, decision: Sequence[tuple[int, int]]) -> float:
    """J = Σ_h Imb(k+h) = Σ_h (G·max_g L_g(k+h) − Σ_g L_g(k+h)) after `decision`."""
    loads = inst.base.copy()
    hs = np.arange(inst.horizon, dtype=np.float64)
    for i, g in decision:
        loads[g] += float(inst.sizes[i]) + hs
    return float((inst.ranks * loads.max(axis=0) - loads.sum(axis=0)).sum())
