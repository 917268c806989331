"""The assignment extension point: `Assigner` and its registry (see policies/assign/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from policies.assign.predict import Predictor
from policies.assign.state import Instance, PooledRequest, RankState, build_instance
from policies.registry import Registry

# (pooled request index, rank index) pairs, pooled indices into the pool in arrival order
Decision = list[tuple[int, int]]


@dataclass(frozen=True)
class Assigner:
    """An assignment policy: a name, its decision over arrays, and what it needs to see.

    `decide` is the policy (pure, deterministic given its seed); `assign` is the driver-facing
    verb that builds the arrays from plain state and maps the decision back.
    """

    name: str
    decide: Callable[[Instance], Decision]
    lookahead_steps: int = 0
    predictor: Predictor = field(default_factory=Predictor)

    def assign(
        self, pool: Sequence[PooledRequest], ranks: Sequence[RankState], now: float
    ) -> list[tuple[PooledRequest, RankState]]:
        """Which pooled requests go to which ranks now. `pool` is taken in arrival order
        (stable by `arrival`); every fillable slot is filled: min(|pool|, Σ free) pairs."""
        ordered = sorted(pool, key=lambda p: p.arrival)
        inst = build_instance(ordered, ranks, now, self.lookahead_steps, self.predictor)
        return [(ordered[i], ranks[g]) for i, g in self.decide(inst)]


# filled by the built-ins' own modules, which policies/assign/__init__.py imports by one
# explicit list (registration never loops back here)
ASSIGNERS: Registry[Assigner] = Registry("assignment policy")
register = ASSIGNERS.register
