"""The pair-selection extension point of a `pd` pool (policies/pd/): choosing a prefill
worker and a decode worker for one request.

A selector is a small object with one verb, `select(request, prefill, decode)`, registered
under a name so that configuration picks it (`pd.pair.policy: kv_cost_decode_load`). It
sees the pool's workers of each role as `WorkerView`s (the same merged telemetry and
gateway counts as routing) and answers a pair, or None when no pair can take the request
now (then the request waits for room, as for any pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from policies.registry import Registry, config_from
from policies.types import RequestInfo, WorkerView


class PairSelector(Protocol):
    name: str

    def select(
        self,
        request: RequestInfo,
        prefill: Sequence[WorkerView],
        decode: Sequence[WorkerView],
    ) -> tuple[WorkerView, WorkerView] | None:
        """(prefill worker, decode worker) for `request`, one of each given sequence; None
        when either role has no worker that can take it."""
        ...


PAIR_SELECTORS: Registry[PairSelector] = Registry("pair selector")
register = PAIR_SELECTORS.register

__all__ = ["PAIR_SELECTORS", "PairSelector", "config_from", "register"]
