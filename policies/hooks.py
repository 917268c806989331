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
"""

from __future__ import annotations

from typing import Protocol

from policies.types import Outcome, RequestInfo


class Hook(Protocol):
    def on_arrival(self, request: RequestInfo, now: float) -> None: ...

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None: ...

    def on_first_token(self, request: RequestInfo, now: float) -> None: ...

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None: ...
