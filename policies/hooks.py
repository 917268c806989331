"""A policy's view of a request's life, the same in both drivers.

    on_arrival      placed (steps 3–4 done), before it waits or is routed
    on_dispatch     sent to `worker` (once per attempt: a retry on another worker is a
                    second dispatch)
    on_first_token  the first token came back (streams; a whole answer counts on arrival)
    on_complete     the request is over, whatever the outcome (ok, error, disconnect)

The pipeline core (policies/core.py) calls the hooks a driver gives it — the gateway
(gateway/proxy.py) or the simulator (simulator/driver.py) — at these points and in this
order, so a policy that learns from
outcomes (a predictor's calibration, a tenant's debt) sees the same stream of events live
and simulated. Hooks must be cheap and must not raise: they run on the request path.

A `pd` pool's request runs on two workers (policies/pd/); `on_dispatch` names the prefill
worker. A hook that needs both, or the hand-off, is also a `PairHook`:

    on_pair         a pair was chosen and both slots taken (once per attempt: a retry on a
                    new pair is a second `on_pair`), after `on_dispatch`
    on_handoff      the prefill answered and its KV left it (`HANDED_OFF`): the prefill
                    worker's slot is back, its cache holds the prompt, the decode reads it

The core calls a pool's pair hooks for that pool's requests only: its selector's
(`hooks()`, policies/build.py) and the driver's hooks that are `PairHook`s.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from policies.types import Outcome, RequestInfo


class Hook(Protocol):
    def on_arrival(self, request: RequestInfo, now: float) -> None: ...

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None: ...

    def on_first_token(self, request: RequestInfo, now: float) -> None: ...

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None: ...


@runtime_checkable
class PairHook(Protocol):
    def on_pair(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None: ...

    def on_handoff(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None: ...
