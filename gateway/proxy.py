"""The gateway's driver of the request pipeline core, for /v1/chat/completions and
/v1/completions.

parse (400) → authenticate (401) → [core] estimate the budget → place (404/413) →
admit (429) → wait for room (429/503) → route (503) → forward, with one retry on another
worker for a connect failure (502/504) → relay → [core] settle; then metrics and the
request log. Every decision is the pure core's (policies/core.py), the same object the
simulator drives (simulator/driver.py); this module moves bytes and keeps time.

What a request holds is a lease in its `Ticket`, released on every path: an answer, an
error, a client that went away (the handler task is cancelled, the upstream connection is
closed and the engine aborts the request).

Eviction (token pools): an admitted request of a preemptible entitlement is indexed by its
hold. When a grant — this replica's, or another's through the store's notices — names
that hold, its handler task is cancelled like a departed client's (the upstream
connection closes, the engine aborts, every lease is released once), but the client is
told: a stream that has started ends with an error frame, code `preempted`, then
`data: [DONE]`; a request not yet answered gets a 429 `preempted` with `Retry-After` (the
pool's typical request length) — 429 as every token-pool decision is: the tenant's class
yielded capacity to a protected one, and a retry after Retry-After is the cure.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import time
from concurrent.futures import Executor
from typing import Any, Protocol

import orjson

from compressor.compress import CompressorConfig
from compressor.script import script_of_prompt
from compressor.served import AUTO, ENGINE, load_served
from gateway import logs, quartz
from gateway.config import GatewayConfig
from gateway.errors import (
    AuthenticationFailed,
    BadGateway,
    GatewayError,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
    UpstreamTimeout,
    sse_error_frame,
)
from gateway.metrics import GatewayMetrics
from gateway.openai_request import CHAT, ParsedRequest, parse
from gateway.relay import StreamScanner, usage_of
from gateway.requestlog import RequestLog
from gateway.responder import ClientGone, Headers, Responder
from gateway.shaping import Shaper, classify_prompt, compressed_header, rewritten_body
from gateway.tenancy import Tenancy, charge_of, header_value
from gateway.tokenize import EngineTokenizer
from gateway.traffic import TrafficHistogram
from gateway.upstream import UpstreamClient, UpstreamResponse
from gateway.upstream_errors import UpstreamError
from gateway.workers import Fleet, WorkerState
from policies.admission import AdmissionRefused, make_admitter
from policies.budget import BudgetConfig, TokenBudget
from policies.core import Core, Ticket
from policies.dispatch import attach_clock, make_dispatcher
from policies.hooks import Hook
from policies.intake import Intake
from policies.leases import Load, WorkerSlot
from policies.pools import make_placement
from policies.quantile.predictor import Prediction, attach
from policies.routing import Router, make_router
from policies.types import Outcome, Status, WorkerView
from policies.uncertainty import ByteBounds

_log = logging.getLogger("fleetgate.quartz")
_PATHS = {CHAT: b"/v1/chat/completions", "completions": b"/v1/completions"}
# an engine's 400 for a request too long for its context (docs/WIRE_SPEC.md §2: vLLM's
# wordings across versions, SGLang's)
_CONTEXT_ERROR = re.compile(
    rb"maximum context length|is too large|maximum model length|longer than the model's context length",
    re.IGNORECASE,
)
# refusals a retry cannot cure: the entitlement is not bound, or there is none → 403
_INACTIVE = {
    "entitlement_state": "entitlement_inactive",
    "unknown_entitlement": "unknown_entitlement",
}
_JSON = b"application/json"
_SSE = b"text/event-stream; charset=utf-8"


_ID_PREFIX = os.urandom(4).hex()  # per process: ids from several replicas do not collide
_ids = itertools.count(1)


def _safe_request_id(value: bytes | None) -> str:
    """The client's x-request-id when it is printable ASCII of at most 128 bytes, else a
    new one (a counter: no system call per request)."""
    if value and len(value) <= 128 and value.isascii():
        text = value.decode("ascii")
        if text.isprintable():
            return text
    return f"{_ID_PREFIX}{next(_ids):08x}"


class BodySource(Protocol):
    """The request's side of the exchange (gateway/edge.py's RequestBody)."""

    slow: bool  # the client was cut for not reading its stream

    async def read(self) -> bytes: ...

    def client_blocked(self) -> bool:
        """A write to the client may wait (its socket buffer is full)."""
        ...

    def cut(self) -> None:
        """End the exchange: the client has not read for too long."""
        ...


class _Attempt:
    """What the settle step needs to know about the request, filled in along the way."""

    __slots__ = (
        "admission",
        "completion_tokens",
        "context_retried",
        "dispatched",
        "entitlement",
        "error",
        "evicted",
        "extra_headers",
        "pool",
        "prediction",
        "prefill_s",
        "prompt_tokens",
        "retries",
        "status",
        "stream",
        "tenancy_headers",
        "ticket",
        "ttft",
        "worker",
    )

    def __init__(self) -> None:
        self.pool = "-"
        self.worker = "-"
        self.status = 0
        self.retries = 0
        self.context_retried = False  # sent on to a longer context after an engine's 400
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


class KeyCheck(Protocol):
    def key_ok(self, key: str) -> bool: ...

    def entitlement_of(self, key: str) -> str | None:
        """The entitlement an API key names (gateway/apikeys.py); None: not one of those."""
        ...


class Pipeline:
    def __init__(
        self,
        config: GatewayConfig,
        fleet: Fleet,
        client: UpstreamClient,
        metrics: GatewayMetrics,
        request_log: RequestLog,
        traffic: TrafficHistogram,
        keys: KeyCheck,
        compress_executor: Executor | None = None,
    ) -> None:
        self.config = config
        self.keys = keys
        self.expose_worker = config.expose.worker_header
        self.expose_detail = config.expose.upstream_detail
        self.write_timeout = config.limits.client_write_timeout_s
        self.fleet = fleet
        self.client = client
        self.metrics = metrics
        self.request_log = request_log
        self.traffic = traffic
        self.loop = asyncio.get_running_loop()
        p = config.placement
        placer = make_placement(
            p.policy, p.short_pool, config.b_short, p.gamma, p.verify_margin,
            p.compress_single_pool,
        )  # fmt: skip
        self.budget = TokenBudget(
            BudgetConfig(
                bytes_per_token=config.budget.bytes_per_token,
                default_max_tokens=config.budget.default_max_tokens,
            )
        )
        metrics.watch_budget(self.budget)
        routing, admission, d = config.routing, config.admission, config.dispatch
        # QUARTZ's predictor: None unless configured (then no predictor work per request)
        predictor = self.predictor = quartz.predictor_for(config)
        self._fallback_changes = 0  # the calibration's fallback flips already logged

        def router_for(pool: str) -> Router:
            router = make_router(routing.policy, routing.params)
            if predictor is not None:
                attach(router, predictor)
            return router

        self.core = Core(
            Intake(
                placer, self.budget, classify_prompt, bounds=ByteBounds(), scripter=script_of_prompt
            ),
            router_for,
            make_admitter(admission.policy, admission.policy_params()),
            make_dispatcher(
                d.policy, {"max_waiting": d.max_waiting, "timeout_s": d.timeout_s, **d.params}
            ),
            on_released=self._released,
            on_woken=self._woken,
            track_prefill=predictor is not None or d.prefill_room is not None,
            prefill_room=d.prefill_room is not None,
        )
        # QUARTZ's wait bound reads the time when a slot frees (a wake carries none)
        attach_clock(self.core.dispatcher, _LoopClock(self.loop))
        if predictor is not None:
            attach(self.core.dispatcher, predictor)
            self.core.hooks = (predictor,)
            stale_after = config.telemetry.stale_after_s
            workers = fleet.workers
            loop = self.loop

            def view_of(worker_id: str) -> WorkerView | None:
                w = workers.get(worker_id)
                return None if w is None else w.view(loop.time(), stale_after)

            predictor.view_of = view_of
            metrics.watch_quartz(predictor, self.core.dispatcher)
        short = config.pools.get(p.short_pool)
        served = load_served(short.tokenizer) if short is not None else None
        compressor = CompressorConfig(protect_last_user=p.protect_last_user)
        engine = None
        if short is not None and short.tokenizer in (ENGINE, AUTO):
            engine = EngineTokenizer(
                client, fleet, p.short_pool, short.tokenize_timeout_s, metrics, self.loop.time
            )
        self.shaper = Shaper(
            self.core, metrics, traffic, compress_executor, served, compressor, engine
        )
        self.auth_required = config.auth_required
        # without a key secret no key can name an entitlement (the admin API refuses keys
        # then too; `auth` changes need a restart): an open gateway reads no header
        self.keys_name_entitlements = bool(config.auth.key_secret)
        self.tenancy: Tenancy | None = None  # token pools: set by the Gateway at start
        # admitted preemptible requests, by hold id: their handler task, to cancel on eviction
        self._evictable: dict[str, tuple[asyncio.Task[Any], _Attempt]] = {}

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """What policies see of requests (policies/hooks.py), called by the core."""
        return self.core.hooks

    @hooks.setter
    def hooks(self, hooks: tuple[Hook, ...]) -> None:
        # QUARTZ's predictor, when configured, always hears the requests first
        own = () if self.predictor is None else (self.predictor,)
        self.core.hooks = (*own, *(h for h in hooks if h is not self.predictor))

    # --- the pipeline -------------------------------------------------------------------
    async def handle(
        self,
        source: BodySource,
        authorization: bytes | None,
        request_id: bytes | None,
        responder: Responder,
        endpoint: str,
    ) -> None:
        t0 = self.loop.time()
        arrival = time.time()
        rid = _safe_request_id(request_id)
        logs.request_id.set(rid)  # this task's log lines name the request
        att = _Attempt()
        parsed: ParsedRequest | None = None
        ticket: Ticket | None = None
        try:
            att.entitlement = self._authenticate(authorization)
            raw = await source.read()
            parsed = parse(raw, endpoint)
            ticket = self.shaper.shape(
                parsed, rid, t0, self.fleet.specs, self.fleet.live_pools(t0), self.fleet.models
            )
            if att.entitlement is not None:
                ticket.info.entitlement = att.entitlement
            if self.predictor is not None:
                quartz.describe(ticket.info, parsed)
            await self.shaper.fit(parsed, ticket)
            core = self.core
            if core.admission_awaits:  # state shared through a store: one round trip
                refused = await core.admit_async(ticket, self.loop.time())
            else:
                refused = core.admit(ticket, self.loop.time())
            if self.tenancy is not None:
                self.tenancy_admission(ticket, refused, att)
            if refused is not None:
                if refused.code in _INACTIVE:
                    raise PermissionDenied(refused.reason, code=_INACTIVE[refused.code])
                raise RateLimited(
                    refused.reason, code=refused.code, retry_after=refused.retry_after
                )
            charge = charge_of(ticket.reservation)
            if charge is not None:
                if charge.evict:
                    self.evict(charge.evict)
                if charge.evictable:
                    task = asyncio.current_task()
                    if task is not None:
                        self._evictable[charge.hold] = (task, att)
            await self._serve(parsed, raw, ticket, responder, att, rid, t0, source)
        except GatewayError as exc:
            self._unwatch(ticket)
            att.status = exc.status
            att.error = att.error or exc.code
            if not responder.started:
                headers = [
                    (b"content-type", _JSON),
                    (b"x-request-id", rid.encode()),
                    *exc.headers(),
                    *att.tenancy_headers,
                ]
                if exc.status in (408, 413, 415):
                    # the rest of the body was not read: do not keep reading it as a request
                    headers.append((b"connection", b"close"))
                await responder.send(exc.status, headers, exc.body())
        except asyncio.CancelledError:
            if att.evicted and not source.slow:
                await self._answer_evicted(ticket, att, responder, rid)
                return
            self._gone(att, source)
            raise
        except ClientGone:
            self._gone(att, source)
            raise
        finally:
            self._unwatch(ticket)
            self._settle(att, parsed, ticket, t0, arrival, rid)

    def _gone(self, att: _Attempt, source: BodySource) -> None:
        """The client left, or was cut for not reading."""
        if att.stream is not None and att.stream.done:
            # the client had the whole answer ([DONE] included) and hung up before the
            # engine's last empty chunk: a success, not a disconnect
            self._count_usage(att.stream.usage, att)
        else:
            att.status = 499  # nginx's "client closed request": only logged and counted
            att.error = "client_write_timeout" if source.slow else "client_disconnect"
            self.metrics.disconnects.labels(att.pool).inc()

    # --- eviction (token pools) ---------------------------------------------------------
    def evict(self, holds: tuple[str, ...]) -> None:
        """Cancel this replica's requests holding `holds` (named for eviction by a grant
        here or, through the store's notices, on another replica); a hold whose request
        has ended is skipped."""
        for hold in holds:
            entry = self._evictable.pop(hold, None)
            if entry is None:
                continue
            task, att = entry
            att.evicted = True
            task.cancel()

    def _unwatch(self, ticket: Ticket | None) -> None:
        charge = charge_of(ticket.reservation) if ticket is not None else None
        if charge is not None and charge.evictable:
            self._evictable.pop(charge.hold, None)

    async def _answer_evicted(
        self, ticket: Ticket | None, att: _Attempt, responder: Responder, rid: str
    ) -> None:
        """The request was cancelled for a protected class: tell the client so."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        if att.stream is not None:
            self._count_usage(att.stream.usage, att)
            if att.stream.done:  # it had its whole answer: a success after all
                await responder.end_stream()
                return
        info = ticket.info if ticket is not None else None
        if info is not None and self.tenancy is not None:
            labels = self.tenancy.labels(info.entitlement)
            if labels is not None:
                self.metrics.evictions.labels(*labels).inc()
        charge = charge_of(ticket.reservation) if ticket is not None else None
        token_pool = charge.pool if charge is not None else ""
        retry = self.tenancy.typical_s(token_pool) if self.tenancy is not None else 1.0
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

    def _authenticate(self, authorization: bytes | None) -> str | None:
        """Step 2: the entitlement the request's API key names (None: a key of
        `auth.api_keys`, or no key). Without authentication configured a key is optional,
        but one created through /admin/entitlements still names its entitlement."""
        if not self.auth_required and (self.tenancy is None or not self.keys_name_entitlements):
            return None  # the common open gateway: nothing to read
        auth = (authorization or b"").decode("latin-1")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not self.auth_required:
            return self.keys.entitlement_of(key) if key and self.tenancy is not None else None
        entitlement = self.keys.entitlement_of(key) if key else None
        if entitlement is None and (not key or not self.keys.key_ok(key)):
            raise AuthenticationFailed(
                "missing API key: send 'Authorization: Bearer <key>'"
                if not key
                else "unknown API key"
            )
        return entitlement

    def tenancy_admission(
        self, ticket: Ticket, refused: AdmissionRefused | None, att: _Attempt
    ) -> None:
        """Token pools: count the decision, and say it in the answer's headers and the log."""
        assert self.tenancy is not None
        info = ticket.info
        labels = self.tenancy.labels(info.entitlement)
        att.admission = "admitted" if refused is None else refused.code
        # the entitlement it was claimed against, which for an unknown name may be the
        # configuration's default_entitlement
        name = header_value(info.entitlement if labels is None else labels[0])
        headers: Headers = [] if name is None else [(b"x-fleetgate-entitlement", name)]
        if labels is not None:
            if refused is None:
                self.metrics.count_admitted(labels)
            else:
                self.metrics.count_refused(labels, refused.code)
        charge = charge_of(ticket.reservation)
        if charge is not None:
            headers.append((b"x-fleetgate-priority", b"%.6g" % charge.priority))
        att.tenancy_headers = headers

    async def _serve(
        self,
        parsed: ParsedRequest,
        raw: bytes,
        ticket: Ticket,
        responder: Responder,
        att: _Attempt,
        rid: str,
        t0: float,
        source: BodySource,
    ) -> None:
        att.ticket = ticket
        estimated = ticket.taken.estimated_prompt_tokens
        extra = [(b"x-fleetgate-tokens-estimated", b"%d" % estimated), *att.tenancy_headers]
        compressed = compressed_header(ticket)
        if compressed is not None:
            extra.append((b"x-fleetgate-compressed", compressed.encode()))
        att.extra_headers = extra
        body, strip_usage = self._upstream_body(parsed, raw, rewritten_body(parsed, ticket))
        path = _PATHS[parsed.endpoint]
        headers = b"content-type: application/json\r\nx-request-id: %s\r\n" % rid.encode("latin-1")
        tried: set[str] = set()
        last_error: UpstreamError | None = None
        core = self.core
        # a request woken from the queue comes back already bound to a worker (its slot
        # taken when the room freed): `bound`, used by the next pass of the loop
        bound: _Bound | None = None
        if core.queued_behind(ticket):
            bound = await self._wait_for_room(ticket, att, tried, t0)  # first come, first served
        while True:
            if bound is not None:
                worker, slot = bound
                bound = None
            else:
                routed = self._route(ticket, tried, att)
                if routed is None:
                    if last_error is not None:
                        raise self._map(last_error)
                    if not self._any_routable(ticket.pools, tried):
                        raise self._no_worker(ticket.pools)
                    # every such worker is full
                    bound = await self._wait_for_room(ticket, att, tried, t0)
                    continue
                worker, slot = routed, self._bind(ticket, routed, att, t0)
            # the worker's slot is held for this attempt only: a retry releases it first
            with slot:
                try:
                    up = await self.client.request(
                        worker.endpoint, b"POST", path, headers + worker.extra_headers, body
                    )
                except UpstreamError as exc:
                    self._failed(worker, att, exc)
                    if exc.retryable and att.retries == 0:
                        att.retries = 1
                        tried.add(worker.id)
                        last_error = exc
                        self.metrics.retries.labels(att.pool).inc()
                        continue
                    raise self._map(exc) from None
                try:
                    if parsed.stream and up.status == 200:
                        await self._relay_stream(
                            up, responder, att, worker, rid, strip_usage, t0, source
                        )
                        return
                    answer = await self._read_whole(up, att, worker)
                    retry = up.status == 400 and self._context_retry(ticket, worker, answer, att)
                    if not retry:
                        await self._send_whole(up, answer, responder, att, worker, rid)
                        return
                finally:
                    up.release()
                # the safety net: sent again, uncompressed, to a pool with a longer context
                # (this attempt's slot is given back as the block ends)
                body, strip_usage = self._upstream_body(parsed, raw, None)

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

    def _route(self, ticket: Ticket, tried: set[str], att: _Attempt) -> WorkerState | None:
        now = self.loop.time()
        exclude = frozenset(tried)
        fleet = self.fleet
        route = self.core.route(ticket, lambda pool: fleet.views(pool, now, exclude))
        if route is None:
            return None
        if route.spilled:
            self.metrics.spills.labels(route.pool).inc()
        att.pool = route.pool
        return fleet.workers[route.worker.id]

    def _any_routable(self, pools: tuple[str, ...], tried: set[str]) -> bool:
        now = self.loop.time()
        return any(
            w.routable(now) and w.id not in tried for p in pools for w in self.fleet.pools[p]
        )

    def _bind(self, ticket: Ticket, worker: WorkerState, att: _Attempt, t0: float) -> WorkerSlot:
        """Dispatch this attempt to `worker`: its slot (and prefill share) taken now."""
        att.worker = worker.id
        now = self.loop.time()
        self.metrics.pool(att.pool).overhead.observe(now - t0)
        slot = self.core.dispatch(ticket, worker.id, worker, now, ticket.info.total_tokens)
        if self.predictor is not None:
            att.prediction = self.predictor.pending(ticket.info.id)
            att.dispatched = now
        return slot

    async def _wait_for_room(
        self, ticket: Ticket, att: _Attempt, tried: set[str], t0: float
    ) -> _Bound | None:
        """Step 6: wait (in the dispatcher's order) until room frees in one of its pools,
        or refuse. The wake binds it (`_woken`): the worker and slot it was given; None
        when the room had gone by then (routing again, it waits again)."""
        now = self.loop.time()
        pools = ticket.pools
        waiter = self.core.wait(ticket, now)
        if waiter is None:
            raise RateLimited(
                "every worker is at capacity and the wait queue is full; retry shortly",
                code="queue_full",
                retry_after=1,
            )
        woken: asyncio.Future[_Bound | None] = self.loop.create_future()
        ticket.token = _Waiting(woken, att, tried, t0)
        self.metrics.queue_waits.inc()
        try:
            await asyncio.wait_for(asyncio.shield(woken), waiter.deadline - now)
        except TimeoutError:
            if not (woken.done() and not woken.cancelled()):
                self.core.dispatcher.cancel(waiter)
                att.error = "queue_timeout"
                raise ServiceUnavailable(
                    f"no worker of pool(s) {', '.join(pools)} had room within "
                    f"{self.config.dispatch.timeout_s:g} s (dispatch.timeout_s)",
                    code="queue_timeout",
                    retry_after=self.config.dispatch.timeout_s,
                ) from None
        finally:
            self.core.dispatcher.cancel(waiter)  # a no-op once woken or expired
            self.metrics.queue_wait_seconds.observe(self.loop.time() - now)
        return woken.result()

    def _woken(self, ticket: Ticket) -> None:
        """The core gave room freed in one of its pools to this waiting request: route it
        and take its slot now, inside the release that freed the room, then resume its
        handler. Binding later, when the handler runs, left the gateway's counts showing
        the room as free in between: a first token on that worker woke a second waiter
        for the same slot, which found none and went to the back of the queue (the
        simulator binds at the instant of the release; so does this)."""
        waiting = ticket.token
        if not isinstance(waiting, _Waiting) or waiting.woken.done():
            return
        try:
            worker = self._route(ticket, waiting.tried, waiting.att)
            bound = None
            if worker is not None:
                bound = (worker, self._bind(ticket, worker, waiting.att, waiting.t0))
        except Exception as exc:  # the waiting request's failure, not the releasing one's
            waiting.woken.set_exception(exc)
            return
        waiting.woken.set_result(bound)

    def _released(self, worker: Load) -> None:
        """A request left a worker: a draining worker whose last request this was leaves
        the fleet (the core then wakes the first request waiting for its pool)."""
        if isinstance(worker, WorkerState) and worker.draining:
            self.fleet.released(worker)

    def _no_worker(self, pools: tuple[str, ...]) -> ServiceUnavailable:
        now = self.loop.time()
        waits = [
            w.open_until - now
            for p in pools
            for w in self.fleet.pools.get(p, ())
            if w.open_until > now
        ]
        retry = min(waits) if waits else self.config.health.interval_s
        return ServiceUnavailable(
            f"no healthy worker in pool(s) {', '.join(pools)}; try again shortly",
            code="no_healthy_worker",
            retry_after=retry,
        )

    def _map(self, exc: UpstreamError) -> GatewayError:
        detail = f": {exc}" if self.expose_detail else ""
        if exc.is_timeout:
            return UpstreamTimeout(f"upstream {exc.kind.replace('_', ' ')}{detail}")
        return BadGateway(f"upstream failed ({exc.kind}){detail}")

    def _failed(self, worker: WorkerState, att: _Attempt, exc: UpstreamError | int) -> None:
        """Count a failed attempt; an engine 5xx (an int) or an error that is the worker's
        fault counts against its circuit breaker."""
        kind = f"http_{exc}" if isinstance(exc, int) else exc.kind
        att.error = kind
        self.metrics.upstream_errors.labels(worker.pool, worker.id, kind).inc()
        if isinstance(exc, UpstreamError) and not exc.blames_worker:
            return
        b = self.config.breaker
        if worker.request_failed(self.loop.time(), b.failures, b.open_s):
            self.metrics.circuit_opens.labels(worker.id).inc()

    def _answer_headers(
        self, up: UpstreamResponse, rid: str, worker: WorkerState, default: bytes, att: _Attempt
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

    async def _read_whole(self, up: UpstreamResponse, att: _Attempt, worker: WorkerState) -> bytes:
        try:
            return await up.read()
        except UpstreamError as exc:
            self._failed(worker, att, exc)
            raise self._map(exc) from None

    def _context_retry(
        self, ticket: Ticket, worker: WorkerState, answer: bytes, att: _Attempt
    ) -> bool:
        """An engine refused the request for its context length though placement had it
        fit (a compressed or short-pool request whose count was off for this engine): the
        first time, send it on — the original text, to the pools serving its model with a
        longer context — instead of passing the 400 to the client. Says so in
        `x-fleetgate-retried: context_length`, the request log and
        `fleetgate_context_retries_total`."""
        if att.context_retried or not _CONTEXT_ERROR.search(answer):
            return False
        model = ticket.info.model
        longer = sorted(
            (p for p in self.fleet.specs if p.max_model_len > worker.max_model_len
             and (not p.models or model in p.models)),
            key=lambda p: p.max_model_len,
        )  # fmt: skip
        if not longer:
            return False
        att.context_retried = True
        self.metrics.context_retries.labels(worker.pool).inc()
        taken = ticket.taken
        if taken.compression is not None:
            ticket.info.prompt_tokens = taken.compression.tokens_before
        taken.pools = tuple(p.name for p in longer)
        taken.classified = False  # its size and the engine's count no longer match: learn nothing
        att.extra_headers = [
            *(h for h in att.extra_headers if h[0] != b"x-fleetgate-compressed"),
            (b"x-fleetgate-retried", b"context_length"),
        ]
        return True

    async def _send_whole(
        self,
        up: UpstreamResponse,
        body: bytes,
        responder: Responder,
        att: _Attempt,
        worker: WorkerState,
        rid: str,
    ) -> None:
        if up.status >= 500:
            self._failed(worker, att, up.status)
        else:
            worker.request_succeeded()
            if up.status == 200:
                self._count_usage(usage_of(body), att)
                if att.ticket is not None:  # a whole answer: its first token comes with it
                    self._first_token(att)
        att.status = up.status
        await responder.send(up.status, self._answer_headers(up, rid, worker, _JSON, att), body)

    async def _relay_stream(
        self,
        up: UpstreamResponse,
        responder: Responder,
        att: _Attempt,
        worker: WorkerState,
        rid: str,
        strip_usage: bool,
        t0: float,
        source: BodySource,
    ) -> None:
        await responder.start_stream(
            200,
            [*self._answer_headers(up, rid, worker, _SSE, att), (b"cache-control", b"no-cache")],
        )
        att.status = 200
        scanner = att.stream = StreamScanner(strip_usage)
        try:
            while (chunk := await up.next_chunk()) is not None:
                if att.ttft is None:
                    att.ttft = self.loop.time() - t0
                    if att.ticket is not None:
                        self._first_token(att)
                out = scanner.feed(chunk)
                if not out:
                    continue
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
            worker.request_succeeded()
        except UpstreamError as exc:
            self._failed(worker, att, exc)
            err = self._map(exc)
            att.status = err.status
            await responder.write(sse_error_frame(err))
        self._count_usage(scanner.usage, att)
        await responder.end_stream()

    def _first_token(self, att: _Attempt) -> None:
        assert att.ticket is not None
        now = self.loop.time()
        if att.dispatched is not None:
            att.prefill_s = now - att.dispatched
            if att.prediction is not None:
                self.metrics.quartz_observed(att.prefill_s, att.prediction.q)
        self.core.first_token(att.ticket, now)
        predictor = self.predictor
        if predictor is not None and predictor.calibration.changes != self._fallback_changes:
            self._fallback_changes = predictor.calibration.changes
            cal = predictor.calibration
            _log.warning(
                "quartz: %s (coverage %.3f of the last first tokens, alpha %.2f, delta %.2f)",
                "coverage degraded: falling back to least-loaded routing and a FIFO queue"
                if cal.degraded
                else "coverage recovered: quantile-aware routing and queueing again",
                cal.coverage() or 0.0,
                cal.alpha,
                cal.delta,
            )

    def _count_usage(self, usage: dict[str, Any] | None, att: _Attempt) -> None:
        if usage:
            att.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            att.completion_tokens = int(usage.get("completion_tokens") or 0)

    # --- settle -------------------------------------------------------------------------
    def _settle(
        self,
        att: _Attempt,
        parsed: ParsedRequest | None,
        ticket: Ticket | None,
        t0: float,
        arrival: float,
        rid: str,
    ) -> None:
        now = self.loop.time()
        latency = now - t0
        shaped = info = None
        if ticket is not None:
            shaped, info = ticket.taken, ticket.info
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
            self.core.complete(ticket, outcome, now)
            used = att.prompt_tokens + att.completion_tokens
            if used and self.tenancy is not None and att.admission == "admitted":
                labels = self.tenancy.labels(info.entitlement)
                if labels is not None:
                    self.metrics.count_entitlement_tokens(labels, used)
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
            entry = {
                "ts": round(arrival, 6),
                "request_id": rid,
                "endpoint": parsed.endpoint if parsed else None,
                "model": parsed.model if parsed else None,
                "stream": parsed.stream if parsed else None,
                "pool": pool,
                "worker": att.worker,
                "status": att.status,
                "est_prompt_tokens": shaped.estimated_prompt_tokens if shaped else None,
                "max_tokens": info.max_tokens if info else None,
                "category": shaped.info.category.value if shaped and shaped.classified else None,
                "placement": shaped.placement.reason if shaped else None,
                "compressed": compressed_header(ticket) if ticket else None,
                "prompt_tokens": att.prompt_tokens,
                "completion_tokens": att.completion_tokens,
                "ttft_s": None if att.ttft is None else round(att.ttft, 6),
                "latency_s": round(latency, 6),
                "retries": att.retries,
                "retried": "context_length" if att.context_retried else None,
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


class _LoopClock:
    """The event loop's monotonic time as policies' `Clock` (the times the core is given)."""

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def now(self) -> float:
        return self.loop.time()


_Bound = tuple[WorkerState, WorkerSlot]  # a woken request's worker and the slot it took


class _Waiting:
    """A request in the queue: its handler's future (resolved by the wake with the worker
    it was bound to) and what binding it needs."""

    __slots__ = ("att", "t0", "tried", "woken")

    def __init__(
        self, woken: asyncio.Future[_Bound | None], att: _Attempt, tried: set[str], t0: float
    ) -> None:
        self.woken = woken
        self.att = att
        self.tried = tried
        self.t0 = t0
