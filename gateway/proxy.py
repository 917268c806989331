"""The gateway's driver of the request pipeline core, for /v1/chat/completions and
/v1/completions.

parse (400) → authenticate (401) → the core's `start`: estimate the budget, place
(404/413) → `Fit`: count exactly and compress on a thread → admit (403/429) → `Send` or
`Wait` (429/503) → forward and relay (gateway/forward.py: a retry on another worker, the
context-length safety net, a wait for room — each the core's answer to what it is told)
→ `Finished`: the core settles; then metrics and the request log (gateway/settle.py).
Every decision is the core's (policies/core.py), the same state machine the simulator
drives (simulator/driver.py); this module and the two beside it move bytes and keep time.

What a request holds is a lease in its `Ticket`, released on every path: an answer, an
error, a client that went away (the handler task is cancelled, the upstream connection is
closed and the engine aborts the request).

Eviction (token pools): the core names the admitted preemptible requests to evict (a
grant here, or another replica's through the store's notices, `evict`). Its handler task
is cancelled like a departed client's (the upstream connection closes, the engine aborts,
every lease is released once), but the client is told: a stream that has started ends
with an error frame, code `preempted`, then `data: [DONE]`; a request not yet answered
gets a 429 `preempted` with `Retry-After` (the pool's typical request length) — 429 as
every token-pool decision is: the tenant's class yielded capacity to a protected one, and
a retry after Retry-After is the cure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from concurrent.futures import Executor
from typing import Any, Protocol

from compressor.compress import CompressorConfig
from compressor.script import script_of_prompt
from compressor.served import AUTO, ENGINE, load_served
from gateway import logs, quartz, request_ids, tracing
from gateway.attempt import Attempt
from gateway.cache_wiring import CacheRouting, gateway_core_spec
from gateway.config import GatewayConfig
from gateway.errors import AuthenticationFailed, GatewayError
from gateway.fitting import PromptFitter
from gateway.forward import Forwarder, refusal
from gateway.metrics import GatewayMetrics
from gateway.openai_request import ParsedRequest, parse
from gateway.placing import classify_prompt, core_request, start_request
from gateway.requestlog import RequestLog
from gateway.responder import ClientGone, Headers, Responder
from gateway.settle import Settler
from gateway.tenancy import Tenancy, charge_of, header_value
from gateway.tokenize import EngineTokenizer
from gateway.traffic import TrafficHistogram
from gateway.upstream import UpstreamClient
from gateway.workers import Fleet, WorkerState
from policies.actions import Action, Admit, Evict, Fit, Refuse, Send
from policies.build import build_core, router_hooks
from policies.events import Admitted
from policies.hooks import Hook
from policies.leases import Load
from policies.ticket import Ticket
from policies.types import WorkerView
from policies.uncertainty import ByteBounds

_log = logging.getLogger("fleetgate.quartz")
_JSON = b"application/json"


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


class KeyCheck(Protocol):
    def key_ok(self, key: str) -> bool: ...

    def entitlement_of(self, key: str) -> str | None:
        """The entitlement an API key names (gateway/apikeys.py); None: not one of those."""
        ...


class GatewayDriver:
    """The gateway's driver of the core (the simulator's is simulator/driver.py's `Driver`)."""

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
        self.fleet = fleet
        self.metrics = metrics
        self.loop = loop = asyncio.get_running_loop()
        spec = gateway_core_spec(config)
        core, predictor = build_core(
            spec,
            _LoopClock(loop),
            classify=classify_prompt,
            # QUARTZ's predictor: None unless configured (then no predictor work per request)
            predictor_for=lambda core: quartz.predictor_for(config),
            # count exactly where the byte estimate cannot place a request (issue 24)
            bounds=ByteBounds(),
            scripter=script_of_prompt,
        )
        self.core, self.predictor = core, predictor
        # cache-aware routing (gateway/cache_wiring.py): what the routers read of a
        # request, their gauges, the PoA diagnostics, engines' KV events; by default
        # nothing is read and nothing runs
        self.cache = cache = CacheRouting(core, config, fleet, metrics, spec, compress_executor)
        self.route_fields = cache.route_fields
        self.estimator = core.intake.estimator
        metrics.watch_budget(self.estimator)
        self._fallback_changes = 0  # the calibration's fallback flips already logged
        workers = fleet.workers
        stale_after = config.telemetry.stale_after_s
        core.views = lambda pool: fleet.views(pool, loop.time())
        core.load_of = workers.__getitem__
        core.on_released = self._released
        core.on_action = self._on_action
        if predictor is not None:

            def view_of(worker_id: str) -> WorkerView | None:
                w = workers.get(worker_id)
                return None if w is None else w.view(loop.time(), stale_after)

            predictor.view_of = view_of
            metrics.watch_quartz(predictor, core.dispatcher)
        p = config.placement
        short = config.pools.get(p.short_pool)
        served = load_served(short.tokenizer) if short is not None else None
        compressor = CompressorConfig(protect_last_user=p.protect_last_user)
        engine = None
        if short is not None and short.tokenizer in (ENGINE, AUTO):
            engine = EngineTokenizer(
                client, fleet, p.short_pool, short.tokenize_timeout_s, metrics, loop.time
            )
        self.traffic = traffic
        # placement's entry, an attribute so that tracing (gateway/tracing.py) can time it
        self.start_request = start_request
        self.fitter = PromptFitter(
            core, metrics, traffic, compress_executor, served, compressor, engine
        )
        self.forwarder = Forwarder(core, config, fleet, client, metrics, predictor, loop)
        self.forwarder.on_first_token = self._calibration_changed
        self.settler = Settler(core, metrics, request_log, predictor, loop)
        self.auth_required = config.auth_required
        # without a key secret no key can name an entitlement (the admin API refuses keys
        # then too; `auth` changes need a restart): an open gateway reads no header
        self.keys_name_entitlements = bool(config.auth.key_secret)

    @property
    def tenancy(self) -> Tenancy | None:
        """Token pools: set by the Gateway at start."""
        return self.settler.tenancy

    @tenancy.setter
    def tenancy(self, tenancy: Tenancy | None) -> None:
        self.settler.tenancy = tenancy

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """What policies see of requests (policies/hooks.py), called by the core."""
        return self.core.hooks

    @hooks.setter
    def hooks(self, hooks: tuple[Hook, ...]) -> None:
        # QUARTZ's predictor, when configured, always hears the requests first
        # and the routers' own hooks (the cache-aware routers' index) stay attached
        own = () if self.predictor is None else (self.predictor,)
        kept = tuple(h for r in self.core.routers.values() for h in router_hooks(r))
        kept = (*kept, *self.cache.hooks())
        given = tuple(h for h in hooks if h is not self.predictor and not _among(h, kept))
        self.core.hooks = (*own, *kept, *given)

    # --- the pipeline -------------------------------------------------------------------
    async def handle(
        self,
        source: BodySource,
        authorization: bytes | None,
        request_id: bytes | None,
        responder: Responder,
        endpoint: str,
        routing: tuple[bytes | None, bytes | None, bytes | None] = (None, None, None),
    ) -> None:
        """`routing`: the session and (τ, ω) override headers (gateway/cache_routing.py)."""
        loop = self.loop
        arrival = time.time()
        own = request_ids.new()  # the engine's id (gateway/request_ids.py)
        # the client's id names it in logs and the answer (without one: no call)
        rid = own if request_id is None else (request_ids.client_id(request_id) or own)
        logs.request_id.set(rid)  # this task's log lines name the request
        if tracing.ON:
            tracing.begin(own, endpoint, rid)
        att = Attempt(loop.time())
        parsed: ParsedRequest | None = None
        ticket: Ticket | None = None
        try:
            att.entitlement = self._authenticate(authorization)
            raw = await source.read()
            parsed = parse(raw, endpoint)
            body = parsed.body
            if "rid" in body or "request_id" in body:  # request_ids.scrub's test, inline
                raw = request_ids.scrub(parsed, raw)
            request = core_request(parsed, own, self.fleet, att.t0)
            if self.route_fields:
                await self.cache.describe(request, parsed, raw, routing, loop)
            tenancy = self.settler.tenancy  # (`self.tenancy`, read once)
            if att.entitlement or tenancy is not None or self.predictor is not None:
                self._describe(request, parsed, att)
            action = self.start_request(
                self.core, self.traffic, parsed, request, att.t0, self.fleet.models
            )
            ticket = att.ticket = action.ticket  # type: ignore[union-attr]
            assert ticket is not None
            ticket.token = att
            if isinstance(action, Fit):
                action = await self.fitter.fit(parsed, action)
            if isinstance(action, Admit):  # state shared through a store: one round trip
                verdict = await self.core.admitter.admit_async(ticket.info, loop.time())  # type: ignore[attr-defined]
                action = self.core.on(ticket, Admitted(verdict), loop.time())
            if tenancy is not None or ticket.admission not in (None, "admitted"):
                self._admission(ticket, action, att)
            await self.forwarder.run(action, parsed, raw, responder, att, rid, source)
        except GatewayError as exc:
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
                await self.settler.answer_evicted(ticket, att, responder, rid)
                return
            self._gone(att, source)
            raise
        except ClientGone:
            self._gone(att, source)
            raise
        finally:
            self.settler.settle(att, parsed, ticket, arrival, rid)
            if ticket is not None:
                # the ticket and its attempt point at each other: unlinked, the request's
                # objects are freed now, not left to the cyclic collector (which then ran
                # every few hundred requests, for a ~5 % cost in CPU per request)
                ticket.token = None
            if tracing.ON:
                tracing.end(own, att)

    def _describe(self, request: object, parsed: ParsedRequest, att: Attempt) -> None:
        """What hooks read of the caller, set before the core starts the request as the
        simulator sets it: the key's entitlement, its service class (the entitlement's,
        with token pools; else RequestInfo's default, "standard"), QUARTZ's features."""
        r: Any = request
        if att.entitlement is not None:
            r.entitlement = att.entitlement
        tenancy = self.tenancy
        if tenancy is not None:
            labels = tenancy.labels(att.entitlement or "default")
            if labels is not None:
                r.slo_class = labels[1]
        if self.predictor is not None:
            quartz.describe(r, parsed)

    def _admission(self, ticket: Ticket, action: Action, att: Attempt) -> None:
        """Admitted or refused: token pools count and say it; an evictable request's
        handler can be cancelled; a refusal is answered."""
        if self.tenancy is not None:
            self.tenancy_admission(ticket, att)
        if ticket.hold is not None:
            att.task = asyncio.current_task()
        if isinstance(action, Refuse) and ticket.admission != "admitted":
            raise refusal(action, self.fleet, self.config, self.loop.time(), self.metrics)

    def _gone(self, att: Attempt, source: BodySource) -> None:
        """The client left, or was cut for not reading."""
        if att.stream is not None and att.stream.done:
            # the client had the whole answer ([DONE] included) and hung up before the
            # engine's last empty chunk: a success, not a disconnect
            att.count_usage(att.stream.usage)
        else:
            att.status = 499  # nginx's "client closed request": only logged and counted
            att.error = "client_write_timeout" if source.slow else "client_disconnect"
            self.metrics.disconnects.labels(att.pool).inc()

    # --- the core's actions for other requests ------------------------------------------
    def _on_action(self, action: Action) -> None:
        """An action the core took for a request other than the one it was told about:
        a wake (its slot taken already: Send; or Wait again, or a refusal) resumes that
        request's handler; an eviction cancels it."""
        att = action.ticket.token  # type: ignore[union-attr]
        if not isinstance(att, Attempt):
            return
        if isinstance(action, Evict):
            att.evicted = True
            if att.task is not None:
                att.task.cancel()
            return
        if isinstance(action, Send):
            self.forwarder.sent(action, att)
        woken = att.woken
        if woken is None:
            att.pending = action  # its handler has not started waiting yet
        elif not woken.done():
            woken.set_result(action)

    def evict(self, holds: Collection[str]) -> None:
        """Cancel this replica's requests holding `holds` (named for eviction by a grant
        on another replica, through the store's notices)."""
        self.core.evict(holds)

    def _released(self, worker: Load) -> None:
        """A request left a worker: a draining worker whose last request this was leaves
        the fleet (the core then wakes the first request waiting for its pool)."""
        if isinstance(worker, WorkerState) and worker.draining:
            self.fleet.released(worker)

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

    def tenancy_admission(self, ticket: Ticket, att: Attempt) -> None:
        """Token pools: count the decision, and say it in the answer's headers and the log."""
        assert self.tenancy is not None
        info = ticket.info
        labels = self.tenancy.labels(info.entitlement)
        att.admission = ticket.admission
        # the entitlement it was claimed against, which for an unknown name may be the
        # configuration's default_entitlement
        name = header_value(info.entitlement if labels is None else labels[0])
        headers: Headers = [] if name is None else [(b"x-fleetgate-entitlement", name)]
        if labels is not None:
            if ticket.admission == "admitted":
                self.metrics.count_admitted(labels)
            else:
                self.metrics.count_refused(labels, ticket.admission or "")
        charge = charge_of(ticket.reservation)
        if charge is not None:
            headers.append((b"x-fleetgate-priority", b"%.6g" % charge.priority))
        att.tenancy_headers = headers

    def _calibration_changed(self) -> None:
        """QUARTZ: log when the calibration falls back to least-loaded routing or recovers."""
        predictor = self.predictor
        if predictor is None or predictor.calibration.changes == self._fallback_changes:
            return
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


def _among(hook: Hook, hooks: tuple[Hook, ...]) -> bool:
    return any(hook is h for h in hooks)


class _LoopClock:
    """The event loop's monotonic time as policies' `Clock` (the times the core is given)."""

    __slots__ = ("loop",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def now(self) -> float:
        return self.loop.time()
