"""A pair selector's KV state kept by the core's pair events (policies/hooks.py
`PairHook`): the prefix index and active blocks of one side of a `pd` pool.

An ordinary `KvState` hook would be wrong for a pair: `on_dispatch` names the prefill
worker and `on_complete` comes when the decode's answer ends, so the prompt's blocks would
stay active on the prefill worker for the whole answer. `PairKvState` follows one role:

| event       | prefill side                                   | decode side                          |
|-------------|------------------------------------------------|--------------------------------------|
| on_pair     | the prompt's blocks active on the prefill      | … active on the decode               |
| on_handoff  | the prefill's cache holds the prompt (index); its blocks no longer active | the decode's cache holds it (the KV arrived) |
| on_complete | released if still held (failed before the hand-off) | released                        |

A retry is a second `on_pair`: the blocks move to the new pair. Workers the state never saw
as candidates (another pool's) are ignored, as `KvState` does.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.routing.kv_state import KvState
from policies.types import Outcome, RequestInfo


@dataclass(slots=True)
class PairKvState:
    state: KvState
    role: str  # "prefill" | "decode": the side whose cache and active blocks it follows

    def __post_init__(self) -> None:
        if self.role not in ("prefill", "decode"):
            raise ValueError("role: must be prefill or decode")

    def _side(self, prefill: str, decode: str) -> str:
        return prefill if self.role == "prefill" else decode

    # --- policies/hooks.py PairHook -----------------------------------------------------
    def on_pair(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        worker = self._side(prefill, decode)
        if self.state.knows(worker):
            self.state.hold(request, worker)
        else:
            self.state.release(request.id)

    def on_handoff(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        worker = self._side(prefill, decode)
        if not self.state.knows(worker):
            return
        self.state.record(request, worker, now)
        if self.role == "prefill":
            self.state.release(request.id)  # its prefill is done: nothing active there

    # --- policies/hooks.py Hook (every request; only paired ones are held) ---------------
    def on_arrival(self, request: RequestInfo, now: float) -> None:
        return None

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        return None  # the prefill alone: `on_pair` names both

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        return None

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self.state.release(request.id)
