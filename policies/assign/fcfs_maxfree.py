"""`fcfs_maxfree`: the paper's FCFS baseline (its Algorithm 2).

Pop the oldest pooled request and give it to the rank with the most free slots (ties: the
lowest index, as the paper scans ranks in order); repeat until the pool or the free slots
run out. Arrival order, count balancing, blind to request sizes: what the paper says vLLM
and SGLang do.
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
class FcfsConfig:
    pass


def fcfs_maxfree(inst: Instance) -> Decision:
    free = inst.free.copy()
    out: Decision = []
    for i in range(inst.fillable):
        g = int(np.argmax(free))  # first maximum: the lowest index among ties
        out.append((i, g))
        free[g] -= 1
    return out


@register("fcfs_maxfree")
def _factory(params: Mapping[str, Any]) -> Assigner:
    config_from(FcfsConfig, params)
    return Assigner("fcfs_maxfree", fcfs_maxfree)
