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
from policies.routing import eligible
from policies.types import RequestInfo, WorkerView

NAME = "round_robin"


@dataclass(frozen=True, slots=True)
class RoundRobinPairsConfig:
    pass


@dataclass(slots=True)
class RoundRobinPairs:
    name: str = NAME
    _prefill_turn: int = 0
    _decode_turn: int = 0

    def select(
        self, request: RequestInfo, prefill: Sequence[WorkerView], decode: Sequence[WorkerView]
    ) -> tuple[WorkerView, WorkerView] | None:
        p_ok = [w for w in eligible(prefill) if w.has_room]
        d_ok = [w for w in eligible(decode) if w.has_room]
        if not p_ok or not d_ok:
            return None
        p = p_ok[self._prefill_turn % len(p_ok)]
        d = d_ok[self._decode_turn % len(d_ok)]
        self._prefill_turn += 1
        self._decode_turn += 1
        return p, d


@register(NAME)
def _factory(params: Mapping[str, Any]) -> RoundRobinPairs:
    config_from(RoundRobinPairsConfig, params)
    return RoundRobinPairs()
