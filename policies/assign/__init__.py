"""Assigning pooled requests to the ranks of a data-parallel group.

Beside per-request routing (`Router.choose(request, candidates)`), a `dp_group` pool holds
its requests in a pool and assigns them to ranks in batches: `assign(pool, ranks, now) ->
[(request, rank)]`, called on arrival and completion events (live) or on every step
(simulator). Every policy fills every fillable slot (min(|pool|, Σ free) requests); they
differ in *which* requests they admit and *where* they put them.

Policies (registered by name, built with their parameters: `make_assigner(name, params)`):
- `fcfs_maxfree` — the paper's FCFS (Algorithm 2): oldest first, to the most free slots;
- `jsq_count` — oldest first, to the fewest requests (seeded tie-break);
- `least_token_load` — oldest first, to the smallest token load L_g;
- `bfio` — Balance Future with Integer Optimization: choose the set and the placement that
  minimise the predicted imbalance summed over the next `lookahead_steps` steps; solver
  `milp` (exact, HiGHS: the test oracle) or `greedy_swap` (the fast path); predictor `none`,
  `oracle`, `noisy_oracle` (with `noise_eps`), `max_tokens_bound`; guard rails for live use
  (`candidate_window`, `max_pool_wait_s`), off by default as in the paper.

Source: "A Universal Load Balancing Principle and Its Application to LLM Serving".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.assign import (  # noqa: F401  (each registers itself; the one import list)
    bfio,
    fcfs_maxfree,
    jsq_count,
    least_token_load,
)
from policies.assign.predict import Predictor
from policies.assign.registry import ASSIGNERS, Assigner, Decision
from policies.assign.state import Instance, PooledRequest, RankState, Resident, objective


def make_assigner(name: str, params: Mapping[str, Any] | None = None) -> Assigner:
    """Build an assignment policy by name; unknown names and parameters fail here."""
    return ASSIGNERS.make(name, params)


def names() -> list[str]:
    return ASSIGNERS.names()


__all__ = [
    "ASSIGNERS",
    "Assigner",
    "Decision",
    "Instance",
    "PooledRequest",
    "Predictor",
    "RankState",
    "Resident",
    "make_assigner",
    "names",
    "objective",
]
