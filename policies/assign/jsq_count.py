"""`jsq_count`: join the shortest queue, by request count.

The oldest pooled request goes to the rank with the fewest requests on it (its residents
plus those just given to it) among ranks with a free slot; ties are broken at random with a
seeded generator (the paper leaves JSQ's tie-break unstated). With equal B on every rank
this is the paper's FCFS up to the tie-break — which is why the two measure alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from policies.assign.registry import Assigner, Decision, register
from policies.assign.state import Instance
from policies.registry import config_from


@dataclass(frozen=True, slots=True)
class JsqConfig:
    seed: int = 0


def jsq_count(seed: int = 0) -> Assigner:
    rng = np.random.default_rng(seed)

    def decide(inst: Instance) -> Decision:
        free = inst.free.copy()
        count = inst.count.copy()
        out: Decision = []
        for i in range(inst.fillable):
            open_count = np.where(free > 0, count, np.iinfo(np.int64).max)
            ties = np.flatnonzero(open_count == open_count.min())
            g = int(ties[rng.integers(len(ties))]) if len(ties) > 1 else int(ties[0])
            out.append((i, g))
            free[g] -= 1
            count[g] += 1
        return out

    return Assigner("jsq_count", decide)


@register("jsq_count")
def _factory(params: Mapping[str, Any]) -> Assigner:
    return jsq_count(config_from(JsqConfig, params).seed)
