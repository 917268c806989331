"""What the gateway learns about one request as it carries out the core's actions: the
answer's status and counts, the worker, the timings and the headers to add. The settle
step (gateway/settle.py) turns it into metrics and a request-log line."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.relay import StreamScanner
from gateway.responder import Headers
from policies.actions import Action
from policies.quantile.predictor import Prediction
from policies.ticket import Ticket


class Attempt:
    """The request's driver-side state (`Ticket.token`), filled in along the way."""

    __slots__ = (
        "admission",
        "completion_tokens",
        "dispatched",
        "entitlement",
        "error",
        "evicted",
        "extra_headers",
        "pending",
        "pool",
        "prediction",
        "prefill_s",
        "prompt_tokens",
        "status",
        "stream",
        "t0",
        "task",
        "tenancy_headers",
        "ticket",
        "ttft",
        "woken",
        "worker",
    )

    def __init__(self, t0: float) -> None:
        self.t0 = t0  # the loop's time when the request arrived
        self.pool = "-"
        self.worker = "-"
        self.status = 0
        self.ttft: float | None = None
        # QUARTZ (when configured): the prediction routing used on the worker it was
        # sent to, when it was sent, and the observed prefill (dispatch → first token)
        self.prediction: Prediction | None = None
        self.dispatched: float | None = None
        self.prefill_s: float | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.error: str | None = None
        self.extra_headers: Headers = []
        self.stream: StreamScanner | None = None  # set once a stream is being relayed
        self.ticket: Ticket | None = None  # the core's, once the request is placed
        self.entitlement: str | None = None  # the key's, when it names one
        self.admission: str | None = None  # "admitted" or the refusing check
        self.tenancy_headers: Headers = []  # x-fleetgate-entitlement, x-fleetgate-priority
        self.evicted = False  # cancelled for a protected class (token pools)
        self.task: asyncio.Task[Any] | None = None  # its handler, when it may be evicted
        # waiting for room: the future the core's wake resolves with the next action
        self.woken: asyncio.Future[Action] | None = None
        self.pending: Action | None = None  # a wake's action nobody awaited yet

    def count_usage(self, usage: dict[str, Any] | None) -> None:
        if usage:
            self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            self.completion_tokens = int(usage.get("completion_tokens") or 0)
