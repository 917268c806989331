"""`bfio`: Balance Future with Integer Optimization.

At each decision choose the set of pooled requests to admit and their ranks so that the
predicted imbalance summed over the next `lookahead_steps` steps is smallest (the paper's
(IO); J in policies/assign/state.py). Parameters:
- `lookahead_steps` (H, default 0): the window; 0 = balance the current step only;
- `solver`: `greedy_swap` (default, the live path) or `milp` (exact, HiGHS; the oracle);
- `predictor`: `none` | `oracle` | `noisy_oracle` (with `noise_eps`, `seed`) |
  `max_tokens_bound` — when running requests end (policies/assign/predict.py);
Guard rails (fleetgate's, off by default as in the paper):
- `candidate_window` (α): consider only the oldest ⌈α·U⌉ pooled requests, bounding both
  the decision cost and how long a request can be passed over while the pool churns;
- `max_pool_wait_s`: requests pooled at least this long are admitted first, each to the
  rank with the least token load, before the solver chooses the rest.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.assign.greedy_swap import greedy_swap
from policies.assign.milp import solve_milp
from policies.assign.predict import PREDICTORS, Predictor
from policies.assign.registry import Assigner, Decision, register
from policies.assign.state import Instance, admitted_profile
from policies.registry import ParamError, config_from

SOLVERS = {"greedy_swap": greedy_swap, "milp": solve_milp}


@dataclass(frozen=True, slots=True)
class BfioConfig:
    lookahead_steps: int = 0
    solver: str = "greedy_swap"
    predictor: str = "none"
    noise_eps: float = 0.0
    seed: int = 0
    candidate_window: float | None = None
    max_pool_wait_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lookahead_steps, int) or self.lookahead_steps < 0:
            raise ParamError(
                "lookahead_steps", f"must be an integer >= 0, got {self.lookahead_steps!r}"
            )
        if self.solver not in SOLVERS:
            raise ParamError("solver", f"unknown {self.solver!r}; known: {', '.join(SOLVERS)}")
        if self.solver == "milp" and importlib.util.find_spec("scipy") is None:
            # fail at start-up, not at the first decision (scipy is imported on first use)
            raise ParamError("solver", "milp needs scipy (pip install scipy); use greedy_swap")
        if self.predictor not in PREDICTORS:
            raise ParamError(
                "predictor", f"unknown {self.predictor!r}; known: {', '.join(PREDICTORS)}"
            )
        if self.noise_eps < 0:
            raise ParamError("noise_eps", f"cannot be negative, got {self.noise_eps!r}")
        if self.candidate_window is not None and self.candidate_window < 1:
            raise ParamError("candidate_window", f"must be >= 1, got {self.candidate_window!r}")
        if self.max_pool_wait_s is not None and self.max_pool_wait_s <= 0:
            raise ParamError("max_pool_wait_s", f"must be positive, got {self.max_pool_wait_s!r}")


def bfio(config: BfioConfig | None = None) -> Assigner:
    c = config or BfioConfig()
    solve = SOLVERS[c.solver]

    def decide(inst: Instance) -> Decision:
        out: Decision = []
        if c.max_pool_wait_s is not None:
            forced = np.flatnonzero(inst.waited >= c.max_pool_wait_s)[: inst.fillable]
            if len(forced):
                out, inst, rest = _force(inst, forced)
            else:
                rest = np.arange(len(inst.sizes))
        else:
            rest = np.arange(len(inst.sizes))
        u = inst.fillable
        if c.candidate_window is not None and u:
            window = min(len(rest), math.ceil(c.candidate_window * u))
            inst, rest = _subset(inst, rest, np.arange(window))
        out += [(int(rest[i]), g) for i, g in solve(inst)]
        return sorted(out)

    return Assigner(
        "bfio",
        decide,
        lookahead_steps=c.lookahead_steps,
        predictor=Predictor(c.predictor, c.noise_eps, c.seed),
    )


def _subset(
    inst: Instance, original: np.ndarray[Any, Any], keep: np.ndarray[Any, Any]
) -> tuple[Instance, np.ndarray[Any, Any]]:
    return (
        Instance(inst.base, inst.free, inst.count, inst.sizes[keep], inst.waited[keep]),
        original[keep],
    )


def _force(
    inst: Instance, forced: np.ndarray[Any, Any]
) -> tuple[Decision, Instance, np.ndarray[Any, Any]]:
    """Admit `forced` (oldest first) each to the lightest rank with room; the rest remain."""
    base = inst.base.copy()
    free = inst.free.copy()
    count = inst.count.copy()
    add = admitted_profile(inst.sizes[forced], inst.horizon)
    out: Decision = []
    for k, i in enumerate(forced):
        g = int(np.argmin(np.where(free > 0, base[:, 0], np.inf)))
        out.append((int(i), g))
        base[g] += add[k]
        free[g] -= 1
        count[g] += 1
    rest = np.setdiff1d(np.arange(len(inst.sizes)), forced)
    return (
        out,
        Instance(base, free, count, inst.sizes[rest], inst.waited[rest]),
        rest,
    )


@register("bfio")
def _factory(params: Mapping[str, Any]) -> Assigner:
    return bfio(config_from(BfioConfig, params))
