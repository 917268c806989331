"""Disaggregated prefill/decode pools (docs/PD.md): the pool model (pool.py) and the pair
selectors, one per file, registered in `PAIR_SELECTORS` (policies/protocols/pairs.py).

The import list below is the one place that loads the built-in selectors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.pd import (  # noqa: F401  (each registers itself)
    kv_cost_decode,
    kv_cost_decode_load,
    random_pair,
    regime_adaptive,
    round_robin,
)
from policies.pd.pool import PROTOCOLS, ROLES, PdLeg, PdPool
from policies.protocols.pairs import PAIR_SELECTORS, PairSelector

DEFAULT_SELECTOR = kv_cost_decode_load.NAME

names = PAIR_SELECTORS.names


def make_pair_selector(name: str, params: Mapping[str, Any] | None = None) -> PairSelector:
    """Build a pair selector by name; unknown names and parameters fail here, at start-up."""
    return PAIR_SELECTORS.make(name, params)


__all__ = [
    "DEFAULT_SELECTOR",
    "PAIR_SELECTORS",
    "PROTOCOLS",
    "ROLES",
    "PairSelector",
    "PdLeg",
    "PdPool",
    "make_pair_selector",
    "names",
]
