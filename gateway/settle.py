"""The end of a request in the gateway: the core settles it (`Finished`: ĉ_k learns, the
reservation is charged, every lease given back), then metrics and the request log; and
the answer of a request evicted for a protected class (token pools)."""

from __future__ import annotations

import asyncio

from gateway import quartz
from gateway.attempt import Attempt
from gateway.errors import RateLimited, sse_error_frame
from gateway.fitting import compressed_header
from gateway.metrics import GatewayMetrics
from gateway.openai_request import ParsedRequest
from gateway.requestlog import RequestLog
from gateway.responder import Responder
from gateway.tenancy import Tenancy, charge_of
from policies.core import Core
from policies.events import Finished
from policies.quantile.predictor import Predictor
from policies.ticket import Ticket
from policies.types import Outcome, Status

_JSON = b"application/json"


class Settler:
    def __init__(
        self,
        core: Core,
        metrics: GatewayMetrics,
        request_log: RequestLog,
        predictor: Predictor | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.core = core
        self.metrics = metrics
        self.request_log = request_log
        self.predictor = predictor
        self.loop = loop
        self.tenancy: Tenancy | None = None  # token pools: set by the Gateway at start

    def settle(
        self,
        att: Attempt,
        parsed: ParsedRequest | None,
        ticket: Ticket | None,
        arrival: float,
        rid: str,
    ) -> None:
        now = self.loop.time()
        latency = now - att.t0
        placed = info = None
        if ticket is not None:
            placed = ticket.placed
            info = placed.info
            status = att.status
            outcome = Outcome(
                Status.OK
                if status == 200
                else Status.DISCONNECT
                if status == 499
                else Status.ERROR,
                att.prompt_tokens,
                att.completion_tokens,
                att.ttft,
                None,
                latency,
            )
            # settle: ĉ_k learns, the reservation is charged, every lease given back
            self.core.on(ticket, Finished(outcome), now)
            used = att.prompt_tokens + att.completion_tokens
            if used and self.tenancy is not None and att.admission == "admitted":
                labels = self.tenancy.labels(info.entitlement)
                if labels is not None:
                    self.metrics.count_entitlement_tokens(labels, used)
        pool = att.pool
        # per pool and per model (bounded: the configured pools' models, else "other"); a
        # 499 is not counted; latency, TTFT and tokens of answered (200) requests only
        self.metrics.count_settled(
            pool,
            parsed.model if parsed else None,
            att.status,
            latency,
            att.ttft,
            att.prompt_tokens,
            att.completion_tokens,
        )
        if self.request_log.enabled:
            entry = {
                "ts": round(arrival, 6),
                "request_id": rid,
                "engine_request_id": info.id if info else None,
                "endpoint": parsed.endpoint if parsed else None,
                "model": parsed.model if parsed else None,
                "stream": parsed.stream if parsed else None,
                "pool": pool,
                "worker": att.worker,
                "status": att.status,
                "est_prompt_tokens": placed.estimated_prompt_tokens if placed else None,
                "max_tokens": info.max_tokens if info else None,
                "category": placed.info.category.value if placed and placed.classified else None,
                "placement": placed.placement.reason if placed else None,
                "compressed": compressed_header(ticket) if ticket else None,
                "prompt_tokens": att.prompt_tokens,
                "completion_tokens": att.completion_tokens,
                "ttft_s": None if att.ttft is None else round(att.ttft, 6),
                "latency_s": round(latency, 6),
                "retries": ticket.retries if ticket else 0,
                "retried": "context_length" if ticket and ticket.context_retried else None,
                "error": att.error,
                "entitlement": info.entitlement if info else att.entitlement,
                "admission": att.admission,
            }
            if self.predictor is not None:  # QUARTZ: the training set of the predictor
                p = att.prediction
                entry["features"] = None if p is None else quartz.rounded(p.features)
                entry["prefill_s"] = None if att.prefill_s is None else round(att.prefill_s, 6)
                entry["predicted"] = (
                    None
                    if p is None
                    else {
                        "mean": round(p.q.mean, 6),
                        "q90": round(p.q.q90, 6),
                        "q95": round(p.q.q95, 6),
                    }
                )
            self.request_log.write(entry)

    async def answer_evicted(
        self, ticket: Ticket | None, att: Attempt, responder: Responder, rid: str
    ) -> None:
        """The request was cancelled for a protected class: tell the client so."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        if att.stream is not None:
            att.count_usage(att.stream.usage)
            if att.stream.done:  # it had its whole answer: a success after all
                await responder.end_stream()
                return
        info = ticket.info if ticket is not None else None
        tenancy = self.tenancy
        if info is not None and tenancy is not None:
            labels = tenancy.labels(info.entitlement)
            if labels is not None:
                self.metrics.evictions.labels(*labels).inc()
        charge = charge_of(ticket.reservation) if ticket is not None else None
        token_pool = charge.pool if charge is not None else ""
        retry = tenancy.typical_s(token_pool) if tenancy is not None else 1.0
        name = info.entitlement if info is not None else "?"
        err = RateLimited(
            f"preempted: entitlement {name!r} is preemptible and a protected service class "
            "needed its capacity; retry after Retry-After",
            code="preempted",
            retry_after=retry,
        )
        att.status, att.error = err.status, "preempted"
        if responder.started:  # a stream (a whole answer starts and finishes at once)
            if not responder.finished:
                await responder.write(sse_error_frame(err))
                await responder.end_stream()
            return
        headers = [
            (b"content-type", _JSON),
            (b"x-request-id", rid.encode()),
            *err.headers(),
            *att.tenancy_headers,
        ]
        await responder.send(err.status, headers, err.body())
