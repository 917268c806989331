"""Round-robin pairs: the next prefill worker and the next decode worker, each in turn
(vLLM's disaggregated-serving proxy, `toy_proxy_server.py`: two `itertools.cycle`s).

A baseline: it reads nothing but the default filters' fields (healthy, stale, has_room);
a worker the filters drop is skipped, and the turn moves on past the one chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.protocols.pairs import config_from, register
from policies.routing import with_room
from policies.types import RequestInfo, WorkerView

NAME = "round_robin"


@dataclass(frozen=True, slots=True)
class RoundRobinPairsConfig:
    pass


@dataclass(slots=True)
class RoundRobinPairs:
    name: str = NAME
    _turn: int = 0  # both sides advance together (each cycles over its own list)

    def select(
        self, request: RequestInfo, prefill: Sequence[WorkerView], decode: Sequence[WorkerView]
    ) -> tuple[WorkerView, WorkerView] | None:
        p_ok = with_room(prefill)
        d_ok = with_room(decode)
        if not p_ok or not d_ok:
            return None
        turn = self._turn
        self._turn += 1
        return p_ok[turn % len(p_ok)], d_ok[turn % len(d_ok)]


@register(NAME)
def _factory(params: Mapping[str, Any]) -> RoundRobinPairs:
    config_from(RoundRobinPairsConfig, params)
    return RoundRobinPairs()
