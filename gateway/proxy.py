"""The request pipeline for /v1/chat/completions and /v1/completions.

parse (400) → authenticate (401) → estimate the budget → place (404/413) → route (503)
→ forward, with one retry on another worker for a connect failure (502/504) → relay →
settle (in-flight counts, breaker, metrics, request log). Every decision is a call into
`policies/`; this module moves bytes and keeps time.

Bookkeeping is released in `finally` on every path: an answer, an error, a client that
went away (the handler task is cancelled, the upstream connection is closed and the
engine aborts the request).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import orjson

from gateway.config import GatewayConfig
from gateway.errors import (
    AuthenticationFailed,
    BadGateway,
    ContextLengthExceeded,
    GatewayError,
    ModelNotFound,
    ServiceUnavailable,
    UpstreamTimeout,
    sse_error_frame,
)
from gateway.httpserver import ClientGone, HttpRequest, Responder
from gateway.metrics import GatewayMetrics
from gateway.openai_request import CHAT, ParsedRequest, parse
from gateway.relay import StreamScanner, usage_of
from gateway.requestlog import RequestLog
from gateway.upstream import UpstreamClient, UpstreamError, UpstreamResponse
from gateway.workers import Fleet, WorkerState
from policies.budget import BudgetConfig, estimate_chat, estimate_tokens
from policies.pools import ShortLongPlacement, Verdict
from policies.routing import make_router
from policies.types import RequestInfo

_PATHS = {CHAT: b"/v1/chat/completions", "completions": b"/v1/completions"}
_JSON = "application/json"
_SSE = "text/event-stream; charset=utf-8"
_RETRYABLE = frozenset({"connect", "connect_timeout"})


def _safe_request_id(value: str | None) -> str:
    if value and len(value) <= 128 and value.isprintable():
        return value
    return os.urandom(8).hex()


class _Attempt:
    """What the settle step needs to know about the request, filled in along the way."""

    __slots__ = (
        "completion_tokens",
        "error",
        "pool",
        "prompt_tokens",
        "retries",
        "status",
        "ttft",
        "worker",
    )

    def __init__(self) -> None:
        self.pool = "-"
        self.worker = "-"
        self.status = 0
        self.retries = 0
        self.ttft: float | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.error: str | None = None


class Pipeline:
    def __init__(
        self,
        config: GatewayConfig,
        fleet: Fleet,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        request_log: RequestLog,
    ) -> None:
        self.config = config
        self.fleet = fleet
        self.client = client
        self.metrics = metrics
        self.request_log = request_log
        self.loop = asyncio.get_running_loop()
        self.placer = ShortLongPlacement(
            short_pool=config.placement.short_pool, b_short=config.b_short
        )
        self.router = make_router(config.routing.policy, config.routing.params)
        self.budget = BudgetConfig(
            bytes_per_token=config.budget.bytes_per_token,
            default_max_tokens=config.budget.default_max_tokens,
        )
        self.api_keys = frozenset(config.auth.api_keys)

    # --- the pipeline -------------------------------------------------------------------
    async def handle(self, request: HttpRequest, responder: Responder, endpoint: str) -> None:
        t0 = self.loop.time()
        arrival = time.time()
        rid = _safe_request_id(request.headers.get("x-request-id"))
        att = _Attempt()
        parsed: ParsedRequest | None = None
        info: RequestInfo | None = None
        try:
            self._authenticate(request)
            parsed = parse(request.body, endpoint)
            info = self._estimate(parsed, rid, t0)
            await self._serve(parsed, request.body, info, responder, att, rid, t0)
        except GatewayError as exc:
            att.status = exc.status
            att.error = att.error or exc.code
            if not responder.started:
                responder.send(
                    exc.status,
                    [("content-type", _JSON), ("x-request-id", rid), *exc.headers()],
                    exc.body(),
                )
        except (asyncio.CancelledError, ClientGone):
            att.status = 499  # nginx's "client closed request": never sent, only logged and counted
            att.error = "client_disconnect"
            self.metrics.disconnects.labels(att.pool).inc()
            raise
        finally:
            self._settle(att, parsed, info, t0, arrival, rid)

    def _authenticate(self, request: HttpRequest) -> None:
        if not self.api_keys:
            return
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if key not in self.api_keys:
            raise AuthenticationFailed(
                "missing API key: send 'Authorization: Bearer <key>'"
                if not key
                else "unknown API key"
            )

    def _estimate(self, parsed: ParsedRequest, rid: str, now: float) -> RequestInfo:
        if parsed.prompt_token_ids:
            prompt = parsed.prompt_token_ids
        elif parsed.endpoint == CHAT:
            prompt = estimate_chat(parsed.prompt_bytes, parsed.n_messages, self.budget)
        else:
            prompt = estimate_tokens(parsed.prompt_bytes, self.budget)
        return RequestInfo(
            id=rid,
            model=parsed.model,
            arrival=now,
            prompt_tokens=prompt,
            max_tokens=parsed.max_tokens or self.budget.default_max_tokens,
            stream=parsed.stream,
        )

    async def _serve(
        self,
        parsed: ParsedRequest,
        raw: bytes,
        info: RequestInfo,
        responder: Responder,
        att: _Attempt,
        rid: str,
        t0: float,
    ) -> None:
        placement = self.placer.place(info, self.fleet.specs)
        if placement.verdict is Verdict.NO_MODEL:
            known = ", ".join(sorted(self.fleet.models))
            raise ModelNotFound(
                f"The model `{parsed.model}` does not exist. Available models: {known}.",
                param="model",
            )
        if placement.verdict is Verdict.TOO_LONG:
            raise ContextLengthExceeded(
                f"This request needs about {info.total_tokens} tokens ({info.prompt_tokens} in the prompt, "
                f"estimated, + {info.max_tokens} for the completion), more than the largest context serving "
                f"`{parsed.model}` ({placement.limit} tokens). Shorten the prompt or lower max_tokens.",
                param="messages" if parsed.endpoint == CHAT else "prompt",
            )
        body, strip_usage = self._upstream_body(parsed, raw)
        path = _PATHS[parsed.endpoint]
        headers = b"content-type: application/json\r\nx-request-id: %s\r\n" % rid.encode("latin-1")
        tried: set[str] = set()
        last_error: UpstreamError | None = None
        while True:
            worker = self._route(info, placement.pools, tried, att)
            if worker is None:
                if last_error is not None:
                    raise self._map(last_error)
                raise self._no_worker(placement.pools)
            att.worker = worker.id
            self.metrics.pool(att.pool).overhead.observe(self.loop.time() - t0)
            worker.in_flight += 1
            worker.outstanding_tokens += info.total_tokens
            try:
                try:
                    up = await self.client.request(
                        worker.endpoint, b"POST", path, headers + worker.extra_headers, body
                    )
                except UpstreamError as exc:
                    self._failed(worker, att, exc.kind)
                    retryable = exc.kind in _RETRYABLE or (
                        exc.kind == "reset" and exc.before_response
                    )
                    if retryable and att.retries == 0:
                        att.retries = 1
                        tried.add(worker.id)
                        last_error = exc
                        self.metrics.retries.labels(att.pool).inc()
                        continue
                    raise self._map(exc) from None
                try:
                    if parsed.stream and up.status == 200:
                        await self._relay_stream(up, responder, att, worker, rid, strip_usage, t0)
                    else:
                        await self._relay_whole(up, responder, att, worker, rid)
                finally:
                    up.release()
                return
            finally:
                worker.in_flight -= 1
                worker.outstanding_tokens -= info.total_tokens

    def _upstream_body(self, parsed: ParsedRequest, raw: bytes) -> tuple[bytes, bool]:
        """The bytes to send, and whether to strip the usage event we asked for.

        Most requests are forwarded byte for byte; only a stream whose client did not ask
        for usage is re-encoded, to ask for it."""
        if not parsed.stream or parsed.wants_usage:
            return raw, False
        body = dict(parsed.body)
        opts = dict(body.get("stream_options") or {})
        opts["include_usage"] = True
        opts["continuous_usage_stats"] = False
        body["stream_options"] = opts
        return orjson.dumps(body), True

    def _route(
        self, info: RequestInfo, pools: tuple[str, ...], tried: set[str], att: _Attempt
    ) -> WorkerState | None:
        now = self.loop.time()
        exclude = frozenset(tried)
        for i, pool in enumerate(pools):
            view = self.router.choose(info, self.fleet.views(pool, now, exclude))
            if view is not None:
                if i > 0:
                    self.metrics.spills.labels(pool).inc()
                att.pool = pool
                return self.fleet.workers[view.id]
        return None

    def _no_worker(self, pools: tuple[str, ...]) -> ServiceUnavailable:
        now = self.loop.time()
        waits = [
            w.open_until - now for p in pools for w in self.fleet.pools[p] if w.open_until > now
        ]
        retry = min(waits) if waits else self.config.health.interval_s
        return ServiceUnavailable(
            f"no healthy worker in pool(s) {', '.join(pools)}; try again shortly",
            code="no_healthy_worker",
            retry_after=retry,
        )

    def _map(self, exc: UpstreamError) -> GatewayError:
        if exc.is_timeout:
            return UpstreamTimeout(f"upstream {exc.kind.replace('_', ' ')}: {exc}")
        return BadGateway(f"upstream failed ({exc.kind}): {exc}")

    def _failed(self, worker: WorkerState, att: _Attempt, kind: str) -> None:
        att.error = kind
        self.metrics.upstream_errors.labels(worker.pool, worker.id, kind).inc()
        b = self.config.breaker
        if worker.request_failed(self.loop.time(), b.failures, b.open_s):
            self.metrics.circuit_opens.labels(worker.id).inc()

    def _answer_headers(
        self, up: UpstreamResponse, rid: str, worker: WorkerState, default: str
    ) -> list[tuple[str, str]]:
        ctype = up.header(b"content-type")
        return [
            ("content-type", ctype.decode("latin-1") if ctype else default),
            ("x-request-id", rid),
            ("x-fleetgate-pool", worker.pool),
            ("x-fleetgate-worker", worker.id),
        ]

    async def _relay_whole(
        self,
        up: UpstreamResponse,
        responder: Responder,
        att: _Attempt,
        worker: WorkerState,
        rid: str,
    ) -> None:
        try:
            body = await up.read()
        except UpstreamError as exc:
            self._failed(worker, att, exc.kind)
            raise self._map(exc) from None
        if up.status >= 500:
            self._failed(worker, att, f"http_{up.status}")
        else:
            worker.request_succeeded()
            if up.status == 200:
                self._count_usage(usage_of(body), att)
        att.status = up.status
        responder.send(up.status, self._answer_headers(up, rid, worker, _JSON), body)

    async def _relay_stream(
        self,
        up: UpstreamResponse,
        responder: Responder,
        att: _Attempt,
        worker: WorkerState,
        rid: str,
        strip_usage: bool,
        t0: float,
    ) -> None:
        responder.start_stream(
            200, [*self._answer_headers(up, rid, worker, _SSE), ("cache-control", "no-cache")]
        )
        att.status = 200
        scanner = StreamScanner(strip_usage)
        try:
            while (chunk := await up.next_chunk()) is not None:
                if att.ttft is None:
                    att.ttft = self.loop.time() - t0
                out = scanner.feed(chunk)
                if out:
                    await responder.write(out)
            tail = scanner.flush()
            if tail:
                await responder.write(tail)
            worker.request_succeeded()
        except UpstreamError as exc:
            self._failed(worker, att, exc.kind)
            err = self._map(exc)
            att.status = err.status
            await responder.write(sse_error_frame(err))
        self._count_usage(scanner.usage, att)
        responder.end_stream()

    def _count_usage(self, usage: dict[str, Any] | None, att: _Attempt) -> None:
        if usage:
            att.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            att.completion_tokens = int(usage.get("completion_tokens") or 0)

    # --- settle -------------------------------------------------------------------------
    def _settle(
        self,
        att: _Attempt,
        parsed: ParsedRequest | None,
        info: RequestInfo | None,
        t0: float,
        arrival: float,
        rid: str,
    ) -> None:
        latency = self.loop.time() - t0
        m = self.metrics
        pool = att.pool
        if att.status != 499:
            m.count_request(pool, att.status)
        if att.status == 200:
            series = m.pool(pool)
            series.latency.observe(latency)
            if att.ttft is not None:
                series.ttft.observe(att.ttft)
            if att.prompt_tokens:
                series.prompt_tokens.inc(att.prompt_tokens)
            if att.completion_tokens:
                series.completion_tokens.inc(att.completion_tokens)
        if self.request_log.enabled:
            self.request_log.write(
                {
                    "ts": round(arrival, 6),
                    "request_id": rid,
                    "endpoint": parsed.endpoint if parsed else None,
                    "model": parsed.model if parsed else None,
                    "stream": parsed.stream if parsed else None,
                    "pool": pool,
                    "worker": att.worker,
                    "status": att.status,
                    "est_prompt_tokens": info.prompt_tokens if info else None,
                    "max_tokens": info.max_tokens if info else None,
                    "prompt_tokens": att.prompt_tokens,
                    "completion_tokens": att.completion_tokens,
                    "ttft_s": None if att.ttft is None else round(att.ttft, 6),
                    "latency_s": round(latency, 6),
                    "retries": att.retries,
                    "error": att.error,
                }
            )
