"""Choosing a worker as llm-d's endpoint picker does: filters → weighted scorers → picker.

    candidates ─▶ filters (each keeps a subset) ─▶ scorers (Σ weight·score, lower is
    better) ─▶ picker (one worker, or None)

The posture every router shares lives in the filters, applied once per decision rather
than repeated inside each router:
- `healthy`: a worker that failed health checks or whose circuit is open is never chosen;
- `fresh_unless_all_stale`: a worker whose telemetry is older than the bound counts as
  saturated — chosen only when every healthy worker is stale, so a scrape outage degrades
  to blind balancing instead of refusing traffic;
- `has_room`: a worker at its capacity (max_num_seqs) is not chosen; when none has room
  the request waits in the dispatcher (policies/dispatch.py).
Later filters (per-worker capacity, prefill/decode roles) and scorers (queue depth, KV
pressure, prefix affinity, predicted tail latency) plug in the same way. A `Profile` is a
`Router`: configuration still picks routers by name (policies/routing/__init__.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from policies.types import RequestInfo, WorkerView

Filter = Callable[[RequestInfo, list[WorkerView]], list[WorkerView]]
Scored = list[tuple[float, WorkerView]]


def healthy(request: RequestInfo, workers: list[WorkerView]) -> list[WorkerView]:
    return [w for w in workers if w.healthy]


def fresh_unless_all_stale(request: RequestInfo, workers: list[WorkerView]) -> list[WorkerView]:
    fresh = [w for w in workers if not w.stale]
    return fresh or workers


def has_room(request: RequestInfo, workers: list[WorkerView]) -> list[WorkerView]:
    """Workers below their capacity (policies/dispatch.py: the rest wait for room)."""
    return [w for w in workers if w.has_room]


DEFAULT_FILTERS: tuple[Filter, ...] = (healthy, fresh_unless_all_stale, has_room)


class Scorer(Protocol):
    @property
    def name(self) -> str: ...

    def score(self, request: RequestInfo, worker: WorkerView) -> float:
        """Lower is better; finite."""
        ...


class Picker(Protocol):
    def pick(self, request: RequestInfo, scored: Scored) -> WorkerView | None:
        """One of the scored workers (in candidate order), or None when there is none."""
        ...


@dataclass(frozen=True, slots=True)
class Load:
    """Requests on the worker: max(engine running + waiting, gateway in flight)."""

    name: str = "load"

    def score(self, request: RequestInfo, worker: WorkerView) -> float:
        return float(worker.load)


@dataclass(slots=True)
class LowestScore:
    """The lowest score; ties go round-robin so light load still spreads."""

    _turn: int = 0

    def pick(self, request: RequestInfo, scored: Scored) -> WorkerView | None:
        if not scored:
            return None
        best = min(s for s, _ in scored)
        tied = [w for s, w in scored if s == best]
        self._turn += 1
        return tied[self._turn % len(tied)]


@dataclass(slots=True)
class InTurn:
    """Each candidate in turn, scores ignored (round-robin)."""

    _turn: int = -1

    def pick(self, request: RequestInfo, scored: Scored) -> WorkerView | None:
        if not scored:
            return None
        self._turn += 1
        return scored[self._turn % len(scored)][1]


@dataclass(slots=True)
class TwoChoices:
    """Two candidates at random, the lower score of the two (Mitzenmacher); seeded."""

    seed: int = 0
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def pick(self, request: RequestInfo, scored: Scored) -> WorkerView | None:
        if len(scored) <= 1:
            return scored[0][1] if scored else None
        (sa, a), (sb, b) = self._rng.sample(scored, 2)
        return a if sa <= sb else b


@dataclass(slots=True)
class Profile:
    """A router made of filters, weighted scorers and a picker."""

    name: str
    picker: Picker
    scorers: tuple[tuple[Scorer, float], ...] = ()
    filters: tuple[Filter, ...] = DEFAULT_FILTERS

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        workers = list(candidates)
        for keep in self.filters:
            workers = keep(request, workers)
            if not workers:
                return None
        scorers = self.scorers
        if not scorers:
            scored: Scored = [(0.0, w) for w in workers]
        elif len(scorers) == 1:
            scorer, weight = scorers[0]
            scored = [(weight * scorer.score(request, w), w) for w in workers]
        else:
            scored = [
                (sum(weight * s.score(request, w) for s, weight in scorers), w) for w in workers
            ]
        return self.picker.pick(request, scored)
