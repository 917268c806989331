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

`output_blocks` (the decode side): the decode worker's active blocks also count each
request's output blocks — ⌈max_tokens / block⌉ per sequence, unshared — from `on_pair` to
`on_complete`. Dynamo adds a request's output blocks as they are generated; the core
reports no per-token progress for a pair, so the most the request may generate is charged
at once and settled at its end. Without it the count is the in-flight prompts' blocks with
a shared block counted once, which is blind to how many requests a worker holds when they
share a prompt template (docs/PD.md, "the τ = 0 lock-in").
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.routing.kv_state import KvState, blocks_for
from policies.types import Outcome, RequestInfo


@dataclass(slots=True)
class PairKvState:
    state: KvState
    role: str  # "prefill" | "decode": the side whose cache and active blocks it follows
    output_blocks: bool = False  # the decode side: charge each request's output blocks

    def __post_init__(self) -> None:
        if self.role not in ("prefill", "decode"):
            raise ValueError("role: must be prefill or decode")
        if self.output_blocks and self.role != "decode":
            raise ValueError("output_blocks: a decode side's only")

    def _side(self, prefill: str, decode: str) -> str:
        return prefill if self.role == "prefill" else decode

    # --- policies/hooks.py PairHook -----------------------------------------------------
    def on_pair(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        worker = self._side(prefill, decode)
        state = self.state
        if state.knows(worker):
            state.hold(request, worker)
            if self.output_blocks:
                out = request.sequences * blocks_for(request.max_tokens, state.block_size)
                state.charge(request.id, out)
        else:
            state.release(request.id)

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
