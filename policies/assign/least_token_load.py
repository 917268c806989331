"""`least_token_load`: instant dispatch to the lightest rank by tokens.

The oldest pooled request goes to the rank with the smallest current load L_g (its
residents' contexts plus the prompts just given to it) among ranks with a free slot; ties
to the lowest index. Token-aware placement without pool selection: the ablation that
separates the value of weighting by tokens from the value of choosing *which* requests to
admit — and the baseline that survives for independent replicas, where there is no barrier.
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
class LeastTokenLoadConfig:
    pass


def least_token_load(inst: Instance) -> Decision:
    free = inst.free.copy()
    load = inst.base[:, 0].copy()
    out: Decision = []
    for i in range(inst.fillable):
        g = int(np.argmin(np.where(free > 0, load, np.inf)))
        out.append((i, g))
        free[g] -= 1
        load[g] += float(inst.sizes[i])
    return out


@register("least_token_load")
def _factory(params: Mapping[str, Any]) -> Assigner:
    config_from(LeastTokenLoadConfig, params)
    return Assigner("least_token_load", least_token_load)
