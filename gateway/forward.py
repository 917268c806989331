"""Carrying out the core's `Send` and `Wait` for one request: forward it to the worker
the core chose, relay the answer, report what happened (policies/events.py) and carry
out whatever the core answers — a retry on another worker, a re-placement on a longer
context after an engine's refusal, a wait for room — until the client has its answer.

Every decision is the core's (policies/core.py): this module moves bytes and keeps time.
The worker's slot was taken by the core when it chose the worker; it goes back when the
core settles the request (or, for a retry, when the core moves it).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Protocol

import orjson

from gateway import tracing
from gateway.attempt import Attempt
from gateway.config import GatewayConfig
from gateway.errors import (
    BadGateway,
    GatewayError,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
    UpstreamTimeout,
    sse_error_frame,
)
from gateway.fitting import rewritten_body
from gateway.metrics import GatewayMetrics
from gateway.openai_request import CHAT, ParsedRequest
from gateway.pd_forward import PairForwarder
from gateway.pd_metrics import PdMetrics
from gateway.relay import StreamScanner, token_events, usage_of
from gateway.responder import Headers, Responder
from gateway.upstream import UpstreamClient, UpstreamResponse
from gateway.upstream_errors import UpstreamError
from gateway.workers import Fleet, WorkerState
from policies.actions import PROCEED, Action, Fail, Refuse, Send, SendPair, Wait
from policies.core import Core
from policies.events import (
    ANSWERED,
    DEADLINE,
    FIRST_TOKEN,
    WHOLE_ANSWER,
    ContextRefused,
    Streamed,
    UpstreamFailed,
)
from policies.quantile.predictor import Predictor

_PATHS = {CHAT: b"/v1/chat/completions", "completions": b"/v1/completions"}
# an engine's 400 for a request too long for its context (docs/WIRE_SPEC.md §2: vLLM's
# wordings across versions, SGLang's)
_CONTEXT_ERROR = re.compile(
    rb"maximum context length|is too large|maximum model length|longer than the model's context length",
    re.IGNORECASE,
)
_JSON = b"application/json"
_SSE = b"text/event-stream; charset=utf-8"


class ClientSide(Protocol):
    """The request's side of the exchange (gateway/edge.py's RequestBody)."""

    slow: bool  # the client was cut for not reading its stream

    def client_blocked(self) -> bool: ...

    def cut(self) -> None: ...


class Forwarder:
    def __init__(
        self,
        core: Core,
        config: GatewayConfig,
        fleet: Fleet,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        predictor: Predictor | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.core = core
        self.config = config
        self.fleet = fleet
        self.client = client
        self.metrics = metrics
        self.predictor = predictor
        self.loop = loop
        self.expose_worker = config.expose.worker_header
        self.expose_detail = config.expose.upstream_detail
        self.write_timeout = config.limits.client_write_timeout_s
        self.on_first_token = _nothing  # the pipeline's (QUARTZ's calibration log)
        # `kind: pd` pools: a request on a pair of workers (gateway/pd_forward.py)
        pd = any(p.kind == "pd" for p in config.pools.values())
        self.pairs = PairForwarder(self, PdMetrics(metrics.registry, fleet)) if pd else None

    async def run(
        self,
        action: Action,
        parsed: ParsedRequest,
        raw: bytes,
        responder: Responder,
        att: Attempt,
        rid: str,
        source: ClientSide,
    ) -> None:
        """Carry out `action` and what follows from it until the client has its answer."""
        ticket = att.ticket
        assert ticket is not None
        estimated = ticket.placed.estimated_prompt_tokens
        extra = [(b"x-fleetgate-tokens-estimated", b"%d" % estimated), *att.tenancy_headers]
        c = ticket.placed.compressed
        if c is not None:
            extra.append((b"x-fleetgate-compressed", b"%d->%d" % c))
        att.extra_headers = extra
        rewritten = rewritten_body(parsed, ticket)
        if rewritten is None and not parsed.stream:  # byte for byte (`_upstream_body`'s first case)
            body, strip_usage = raw, False
        else:
            body, strip_usage = self._upstream_body(parsed, raw, rewritten)
        path = _PATHS[parsed.endpoint]
        # the engine's id is the gateway's, never the client's (gateway/request_ids.py)
        headers = b"content-type: application/json\r\nx-request-id: %s\r\n" % (
            ticket.placed.info.id.encode("latin-1")
        )
        core = self.core
        last_error: UpstreamError | None = None
        while True:
            if isinstance(action, Wait):
                action = await self._wait(action, att)
                if not isinstance(action, Send | SendPair):
                    continue  # waits again, or is refused
            elif isinstance(action, Send):
                self.sent(action, att)
            elif not isinstance(action, SendPair):
                raise self._refused(action, last_error, att)
            if isinstance(action, SendPair):  # a `pd` pool: two calls (gateway/pd_forward.py)
                assert self.pairs is not None
                att.dispatched = self.loop.time()
                await self.pairs.run(
                    action, parsed, body, strip_usage, path, headers, responder, att, rid, source
                )
                return
            worker: WorkerState = action.load  # type: ignore[assignment]
            sent_headers, sent_body = headers + worker.extra_headers, body
            if action.rank is not None and worker.rank_selector:
                sent_headers, sent_body = with_rank(sent_headers, sent_body, worker, action.rank)
            if tracing.ON:  # the attempt's span; the engine continues the trace
                sent_headers += tracing.upstream(ticket.info.id, worker.id, worker.pool)
            try:
                up = await self.client.request(
                    worker.endpoint, b"POST", path, sent_headers, sent_body
                )
            except UpstreamError as exc:
                last_error = exc
                action = self._failed(worker, att, exc, before_response=True)
                if isinstance(action, Send):
                    self.metrics.retries.labels(att.pool).inc()
                continue
            try:
                if parsed.stream and up.status == 200:
                    await self._relay_stream(up, responder, att, worker, rid, strip_usage, source)
                    return
                answer = await self._read_whole(up, att, worker)
                action = PROCEED
                if up.status == 400 and _CONTEXT_ERROR.search(answer):
                    action = core.on(ticket, ContextRefused(worker.max_model_len), self.loop.time())
                if action is PROCEED:
                    await self._send_whole(up, answer, responder, att, worker, rid)
                    return
            finally:
                up.release()
            # the safety net: sent again, uncompressed, to a pool with a longer context
            self.metrics.context_retries.labels(worker.pool).inc()
            att.extra_headers = [
                *(h for h in att.extra_headers if h[0] != b"x-fleetgate-compressed"),
                (b"x-fleetgate-retried", b"context_length"),
            ]
            body, strip_usage = self._upstream_body(parsed, raw, None)

    def sent(self, send: Send, att: Attempt) -> None:
        """The core sent this attempt to `send.worker` (its slot is taken): note it."""
        now = self.loop.time()
        att.pool, att.worker = send.pool, send.worker
        if send.spilled:
            self.metrics.spills.labels(send.pool).inc()
        if send.rank is not None:
            self.metrics.dp_pool_wait.labels(send.pool).observe(now - send.ticket.info.arrival)
        self.metrics.pool(send.pool).overhead.observe(now - att.t0)
        if self.predictor is not None:
            att.prediction = self.predictor.pending(send.ticket.info.id)
            att.dispatched = now

    async def _wait(self, wait: Wait, att: Attempt) -> Action:
        """Wait until the core's wake gives the request its next action (through the
        driver's `on_action`, which resolves `att.woken`), or its deadline passes."""
        loop = self.loop
        now = loop.time()
        woken = att.pending
        if woken is not None:  # woken before it came here
            att.pending = None
            return woken
        future: asyncio.Future[Action] = loop.create_future()
        att.woken = future
        self.metrics.queue_waits.inc()
        try:
            await asyncio.wait_for(asyncio.shield(future), wait.deadline - now)
        except TimeoutError:
            if not future.done():
                action = self.core.on(wait.ticket, DEADLINE, loop.time())
                if isinstance(action, Refuse):
                    att.error = "queue_timeout"
                return action
        finally:
            att.woken = None
            self.metrics.queue_wait_seconds.observe(loop.time() - now)
        return future.result()

    def _refused(
        self, action: Action, last_error: UpstreamError | None, att: Attempt
    ) -> GatewayError:
        """The exception that answers the client for a `Refuse` or `Fail`."""
        if isinstance(action, Fail):
            assert last_error is not None
            return self._map(last_error)
        assert isinstance(action, Refuse), action
        return refusal(action, self.fleet, self.config, self.loop.time(), self.metrics)

    def _upstream_body(
        self, parsed: ParsedRequest, raw: bytes, rewritten: dict[str, Any] | None
    ) -> tuple[bytes, bool]:
        """The bytes to send, and whether to strip the usage event we asked for.

        Most requests are forwarded byte for byte; a compressed request, and a stream whose
        client did not ask for usage (we ask for it), are re-encoded."""
        if not parsed.stream or parsed.wants_usage:
            return (raw if rewritten is None else orjson.dumps(rewritten)), False
        body = dict(rewritten if rewritten is not None else parsed.body)
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        opts["continuous_usage_stats"] = False
        body["stream_options"] = opts
        return orjson.dumps(body), True

    def _map(self, exc: UpstreamError) -> GatewayError:
        detail = f": {exc}" if self.expose_detail else ""
        if exc.is_timeout:
            return UpstreamTimeout(f"upstream {exc.kind.replace('_', ' ')}{detail}")
        return BadGateway(f"upstream failed ({exc.kind}){detail}")

    def _failed(
        self,
        worker: WorkerState,
        att: Attempt,
        exc: UpstreamError | int,
        before_response: bool = False,
    ) -> Action:
        """Count a failed attempt (an engine 5xx is an int) and tell the core: its breaker
        counts what is the worker's fault; before a response, it may retry elsewhere."""
        assert att.ticket is not None
        if isinstance(exc, int):
            kind = f"http_{exc}"
            event = UpstreamFailed(kind, False, True, False)
        else:
            kind = exc.kind
            event = UpstreamFailed(kind, exc.retryable, exc.blames_worker, before_response)
        att.error = kind
        self.metrics.upstream_errors.labels(worker.pool, worker.id, kind).inc()
        opened = worker.open_until
        action = self.core.on(att.ticket, event, self.loop.time())
        if worker.open_until != opened:
            self.metrics.circuit_opens.labels(worker.id).inc()
        return action

    def _answer_headers(
        self, up: UpstreamResponse, rid: str, worker: WorkerState, default: bytes, att: Attempt
    ) -> Headers:
        headers = [
            (b"content-type", up.header(b"content-type") or default),
            (b"x-request-id", rid.encode()),
            (b"x-fleetgate-pool", worker.pool_header),
            *att.extra_headers,
        ]
        if self.expose_worker:
            headers.append((b"x-fleetgate-worker", worker.id_header))
        return headers

    async def _read_whole(self, up: UpstreamResponse, att: Attempt, worker: WorkerState) -> bytes:
        try:
            return await up.read()
        except UpstreamError as exc:
            self._failed(worker, att, exc)
            raise self._map(exc) from None

    async def _send_whole(
        self,
        up: UpstreamResponse,
        body: bytes,
        responder: Responder,
        att: Attempt,
        worker: WorkerState,
        rid: str,
    ) -> None:
        if up.status >= 500:
            self._failed(worker, att, up.status)
        else:
            ticket = att.ticket
            assert ticket is not None
            self.core.on(ticket, ANSWERED, 0.0)  # (`_answered`, inline: a success takes no time)
            if up.status == 200:
                usage = usage_of(body)
                att.count_usage(usage)
                if ticket.rank is not None:  # a dp_group rank's exact count
                    self._reconcile(att, usage)
                # a whole answer: its prompt leaves the backlog, but no first token was
                # seen (its time is the whole answer's: QUARTZ must not learn it as a prefill)
                self.core.on(ticket, WHOLE_ANSWER, self.loop.time())
        att.status = up.status
        await responder.send(up.status, self._answer_headers(up, rid, worker, _JSON, att), body)

    async def _relay_stream(
        self,
        up: UpstreamResponse,
        responder: Responder,
        att: Attempt,
        worker: WorkerState,
        rid: str,
        strip_usage: bool,
        source: ClientSide,
    ) -> None:
        await responder.start_stream(
            200,
            [*self._answer_headers(up, rid, worker, _SSE, att), (b"cache-control", b"no-cache")],
        )
        att.status = 200
        scanner = att.stream = StreamScanner(strip_usage)
        ranked = att.ticket is not None and att.ticket.rank is not None
        events = 0
        try:
            while (chunk := await up.next_chunk()) is not None:
                if att.ttft is None:
                    att.ttft = self.loop.time() - att.t0
                    self._first_token(att)
                out = scanner.feed(chunk)
                if not out:
                    continue
                if ranked:  # a dp_group rank's load follows its streamed tokens
                    more = token_events(out, events > 0)
                    if more:
                        events += more
                        self.core.on(att.ticket, Streamed(events), 0.0)  # type: ignore[arg-type]
                if source.client_blocked():
                    # waiting on our client, not on the engine: the engine's idle timer
                    # pauses, and a client that reads nothing for the write timeout is cut
                    up.suspend_for_client(self.write_timeout, source.cut)
                    await responder.write(out)
                    up.resume_from_client()
                else:
                    await responder.write(out)
            tail = scanner.flush()
            if tail:
                await responder.write(tail)
            self._answered(att)
        except UpstreamError as exc:
            self._failed(worker, att, exc)
            err = self._map(exc)
            att.status = err.status
            await responder.write(sse_error_frame(err))
        att.count_usage(scanner.usage)
        if ranked:
            self._reconcile(att, scanner.usage)
        await responder.end_stream()

    def _reconcile(self, att: Attempt, usage: dict[str, Any] | None) -> None:
        """A dp_group request's end: the engine's usage replaces the streamed (or, for a
        whole answer, estimated) count of its rank's load, and teaches the group its
        decode rate (policies/dp_group.py)."""
        ticket = att.ticket
        if ticket is None or ticket.rank is None or not usage:
            return
        try:
            completion = int(usage.get("completion_tokens") or 0)
            prompt = int(usage.get("prompt_tokens") or 0) or None
        except (TypeError, ValueError):
            return  # a malformed usage object is not a count
        self.core.on(ticket, Streamed(completion, prompt, exact=True), self.loop.time())

    def _answered(self, att: Attempt) -> None:
        assert att.ticket is not None
        self.core.on(att.ticket, ANSWERED, 0.0)  # a success takes no time: none read

    def _first_token(self, att: Attempt) -> None:
        assert att.ticket is not None
        now = self.loop.time()
        if att.dispatched is not None:
            att.prefill_s = now - att.dispatched
            if att.prediction is not None:
                self.metrics.quartz_observed(att.prefill_s, att.prediction.q)
        self.core.on(att.ticket, FIRST_TOKEN, now)
        if self.predictor is not None:
            self.on_first_token()


def _nothing() -> None:
    pass


def with_rank(headers: bytes, body: bytes, worker: WorkerState, rank: int) -> tuple[bytes, bytes]:
    """A dp_group request for the one endpoint of its group, pinned to `rank` (WIRE_SPEC
    §10): vLLM reads the `X-data-parallel-rank` header; SGLang reads the same header in
    its newer releases and the body field `data_parallel_rank` in the older ones, so an
    SGLang body gets the field too — last in the object, so it wins over any the client
    sent (JSON parsers keep the last duplicate)."""
    headers += b"x-data-parallel-rank: %d\r\n" % rank
    if worker.engine == "sglang":
        end = body.rstrip()
        if end.endswith(b"}"):
            sep = b"" if end[:-1].rstrip().endswith(b"{") else b","
            body = end[:-1] + sep + b'"data_parallel_rank":%d}' % rank
    return headers, body


def refusal(
    action: Refuse, fleet: Fleet, config: GatewayConfig, now: float, metrics: GatewayMetrics
) -> GatewayError:
    """The OpenAI-shaped error for the core's refusal of a placed request."""
    code = action.code
    if code in ("queue_full", "queue_timeout"):
        metrics.dispatch_refused.labels(code).inc()  # the request queue's refusals apart
    if action.status == 403:
        return PermissionDenied(action.reason, code=code)
    if code == "queue_full":
        return RateLimited(
            "every worker is at capacity and the wait queue is full; retry shortly",
            code="queue_full",
            retry_after=action.retry_after or 1,
        )
    if action.status == 429:
        return RateLimited(action.reason, code=code, retry_after=action.retry_after or 1)
    pools = action.ticket.pools if action.ticket is not None else ()
    if code == "queue_timeout":
        timeout = config.dispatch.timeout_s
        return ServiceUnavailable(
            f"no worker of pool(s) {', '.join(pools)} had room within "
            f"{timeout:g} s (dispatch.timeout_s)",
            code="queue_timeout",
            retry_after=timeout,
        )
    # no healthy worker: back when the first open circuit of its pools closes
    waits = [
        w.open_until - now for p in pools for w in fleet.pools.get(p, ()) if w.open_until > now
    ]
    return ServiceUnavailable(
        f"no healthy worker in pool(s) {', '.join(pools)}; try again shortly",
        code="no_healthy_worker",
        retry_after=min(waits) if waits else config.health.interval_s,
    )
