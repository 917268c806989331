"""OpenTelemetry traces of requests (`tracing.enabled`; off by default, the `otel` extra).

A request is one span, `fleetgate.request` (kind SERVER, from its arrival to its settle),
with a child span for each step the gateway took for it:

    estimate         the byte estimate and placement (the core's intake)
    count_compress   the exact count and compression on the thread pool (Compress-and-Route)
    admission        the admitter's decision (with a shared store, its Redis round trip)
    queue_wait       waiting for a worker with room, until the wake that sent it (or refused)
    route            each routing decision: the pool's router over its workers
    upstream         each attempt at the engine (kind CLIENT), from the request sent to the
                     end of the answer; event `first_token` at the first token (TTFT); the
                     engine gets the span's W3C `traceparent` (vLLM continues the trace)

Spans are exported over OTLP/HTTP in batches, from the SDK's own thread.

A client's W3C trace context (`traceparent`, `tracestate`) is continued: the request's span
is its child (`tracing.client_context`; its sampled flag then decides, as the SDK's
parent-based sampler does).

Zero cost when off: `ON` is False, nothing of this module runs and nothing is allocated per
request; the request path has one branch on `ON` where its head is read (gateway/edge.py),
where it starts and ends (gateway/proxy.py) and where its upstream request's head is made
(gateway/forward.py). When
on, the steps inside the core, the shaper and the forwarder are timed by wrapping those
objects' methods once at start (`install`), so neither the core nor the simulator changes.
The spans of a request are found by its engine id (the core's `RequestInfo.id`) in `_live`.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Any

from gateway.config import Tracing
from policies.actions import Action, Send, SendPair, Wait
from policies.admission import AdmissionRefused
from policies.core import Core
from policies.events import Request
from policies.intake import Placed
from policies.ticket import Ticket

ON = False  # set by `configure`; the request path's one test
_tracer: Any = None  # the SDK's Tracer when on
_provider: Any = None
_live: dict[str, _Trace] = {}  # engine request id → its spans, while the request runs
_propagator: Any = None  # W3C trace context, when clients' contexts are continued
_api: Any = None  # opentelemetry.trace, imported by `configure`
# the client's trace context, from the request's head to its span (the same task)
_parent: ContextVar[Any] = ContextVar("fleetgate_trace_parent", default=None)

_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


class _Trace:
    __slots__ = ("ctx", "fitting", "queue", "root", "step", "upstream")

    def __init__(self, root: Any, ctx: Any) -> None:
        self.root = root
        self.ctx = ctx  # the context whose current span is the root: the children's parent
        # the open step (estimate, count_compress): it ends where the next step starts (the
        # core goes on to admit and route inside the same call)
        self.step: Any = None
        self.fitting: Any = None  # count_compress's placement, to say what it compressed
        self.queue: Any = None
        self.upstream: Any = None

    def child(self, name: str, start: int, kind: Any = None) -> Any:
        if kind is None:
            return _tracer.start_span(name, context=self.ctx, start_time=start)
        return _tracer.start_span(name, context=self.ctx, kind=kind, start_time=start)

    def end_step(self, at: int | None = None) -> None:
        step = self.step
        if step is None:
            return
        self.step = None
        placed, self.fitting = self.fitting, None
        if placed is not None and placed.compressed is not None:
            step.set_attribute("fleetgate.compressed", "{}->{}".format(*placed.compressed))
        step.end(at)


def configure(settings: Tracing, exporter: Any = None) -> None:
    """Turn tracing on with `settings` (a no-op when not enabled). `exporter`: a span exporter
    of the caller's, exported to synchronously (tests: the SDK's in-memory exporter); else
    OTLP/HTTP in batches."""
    global ON, _tracer, _provider, _propagator, _api
    if not settings.enabled:
        return
    from opentelemetry import trace as api
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    # a provider of our own, not the process's global one: the gateway's spans and settings
    # do not depend on what else in the process set up OpenTelemetry
    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.service_name}),
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
    )
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(settings.endpoint)))
    if settings.client_context:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _propagator = TraceContextTextMapPropagator()
    _api = api
    _provider = provider
    _tracer = provider.get_tracer("fleetgate")
    ON = True


def shutdown() -> None:
    """Export what is left and turn tracing off (the gateway's stop)."""
    global ON, _tracer, _provider, _propagator
    provider = _provider
    ON, _tracer, _provider, _propagator = False, None, None, None
    _live.clear()
    if provider is not None:
        provider.shutdown()


# --- the request path's calls (each behind `if tracing.ON`) ----------------------------
def incoming(headers: Any) -> None:
    """The request's head (ASGI `headers`): its W3C trace context, for `begin`."""
    carrier = {}
    if _propagator is not None:
        for name, value in headers:
            if name == b"traceparent" or name == b"tracestate":
                carrier[name.decode()] = value.decode("latin-1")
    _parent.set(_propagator.extract(carrier) if carrier else None)


def begin(engine_id: str, endpoint: str, request_id: str) -> None:
    """A request arrived: its span starts (in the client's trace when it sent one)."""
    parent = _parent.get()
    if parent is not None:
        _parent.set(None)
    path = _PATHS.get(endpoint, endpoint)
    root = _tracer.start_span(
        f"POST {path}",
        context=parent,
        kind=_api.SpanKind.SERVER,
        attributes={
            "http.request.method": "POST",
            "url.path": path,
            "fleetgate.request_id": request_id,
            "fleetgate.engine_request_id": engine_id,
        },
    )
    _live[engine_id] = _Trace(root, _api.set_span_in_context(root))


def upstream(engine_id: str, worker: str, pool: str) -> bytes:
    """An attempt at `worker` starts: its span (the previous attempt's ends: a retry), and
    the `traceparent` header line that tells the engine."""
    trace = _live.get(engine_id)
    if trace is None:
        return b""
    now = time.time_ns()
    if trace.upstream is not None:
        trace.upstream.set_attribute("fleetgate.retried", True)
        trace.upstream.end(now)
    span = trace.upstream = trace.child("upstream", now, _api.SpanKind.CLIENT)
    span.set_attribute("fleetgate.pool", pool)
    span.set_attribute("fleetgate.worker", worker)
    c = span.get_span_context()
    return b"traceparent: 00-%032x-%016x-%02x\r\n" % (c.trace_id, c.span_id, c.trace_flags)


def end(engine_id: str, att: Any) -> None:
    """The request is settled (`att`: its gateway/attempt.py Attempt): every span ends."""
    trace = _live.pop(engine_id, None)
    if trace is None:
        return
    now = time.time_ns()
    trace.end_step(now)
    for span in (trace.queue, trace.upstream):
        if span is not None:
            span.end(now)
    root = trace.root
    attrs: dict[str, Any] = {
        "http.response.status_code": att.status,
        "fleetgate.pool": att.pool,
        "fleetgate.worker": att.worker,
    }
    ticket = att.ticket
    if ticket is not None:
        attrs["fleetgate.model"] = ticket.info.model
        attrs["fleetgate.tokens_estimated"] = ticket.placed.estimated_prompt_tokens
        if ticket.placed.compressed is not None:
            attrs["fleetgate.compressed"] = "{}->{}".format(*ticket.placed.compressed)
    if att.prompt_tokens or att.completion_tokens:
        attrs["gen_ai.usage.input_tokens"] = att.prompt_tokens
        attrs["gen_ai.usage.output_tokens"] = att.completion_tokens
    if att.ttft is not None:
        attrs["fleetgate.ttft_s"] = att.ttft
    if att.admission is not None:
        attrs["fleetgate.admission"] = att.admission
    if att.error is not None:
        attrs["error.type"] = att.error
    root.set_attributes(attrs)
    if att.status >= 500 or att.status == 0:
        root.set_status(_api.Status(_api.StatusCode.ERROR, att.error or ""))
    root.end(now)


# --- the steps, timed by wrapping (installed only when on) --------------------------------
def install(pipeline: Any) -> None:
    """Time the steps of `pipeline` (gateway/proxy.py's GatewayDriver) for the request spans."""
    if not ON:
        return
    core, fitter, forwarder = pipeline.core, pipeline.fitter, pipeline.forwarder
    start, fit, first_token = pipeline.start_request, fitter.fit, forwarder._first_token

    def traced_start(
        core: Any, traffic: Any, parsed: Any, request: Any, now: float, known: Any
    ) -> Any:
        trace = _live.get(request.id)
        if trace is not None:
            trace.step = trace.child("estimate", time.time_ns())
        try:
            return start(core, traffic, parsed, request, now, known)
        finally:
            if trace is not None:  # refused at placement (else ended already)
                trace.end_step()

    async def traced_fit(parsed: Any, action: Any) -> Any:
        trace = _live.get(action.ticket.info.id)
        if trace is None:
            return await fit(parsed, action)
        trace.step = trace.child("count_compress", time.time_ns())
        trace.step.set_attribute("fleetgate.target_tokens", action.target)
        trace.fitting = action.ticket.placed
        try:
            return await fit(parsed, action)
        finally:
            trace.end_step()  # refused (else ended where admission started)

    def traced_first_token(att: Any) -> None:
        first_token(att)
        trace = _live.get(att.ticket.info.id)
        if trace is not None and trace.upstream is not None:
            trace.upstream.add_event("first_token", {"fleetgate.ttft_s": att.ttft})

    pipeline.start_request, fitter.fit = traced_start, traced_fit
    forwarder._first_token = traced_first_token
    core.__class__ = _TracedCore  # the same object and fields (slots), its steps timed
    core.admitter = _TracedAdmitter(core.admitter)


class _TracedCore(Core):
    """The core with placement, routing and waiting timed (`install` makes the running
    core one: a subclass without fields of its own, so only its class changes)."""

    __slots__ = ()

    def _placed(self, placed: Placed, request: Request, now: float) -> Ticket:
        trace = _live.get(request.id)
        if trace is not None and trace.step is not None:
            trace.step.set_attribute("fleetgate.pools", list(placed.pools))
            trace.step.set_attribute("fleetgate.tokens_estimated", placed.estimated_prompt_tokens)
            trace.end_step()
        return Core._placed(self, placed, request, now)

    def _send(self, ticket: Ticket, now: float) -> Send | SendPair | None:
        t0 = time.time_ns()
        result = Core._send(self, ticket, now)
        trace = _live.get(ticket.info.id)
        if trace is not None:
            trace.end_step(t0)
            t1 = time.time_ns()
            span = trace.child("route", t0)
            if result is None:
                span.set_attribute("fleetgate.route", "no_room")
            else:
                span.set_attribute("fleetgate.pool", result.pool)
                if isinstance(result, SendPair):  # a `pd` pool's pair
                    span.set_attribute("fleetgate.worker", result.prefill)
                    span.set_attribute("fleetgate.decode_worker", result.decode)
                else:
                    span.set_attribute("fleetgate.worker", result.worker)
            span.end(t1)
            if result is not None and trace.queue is not None:
                trace.queue.end(t1)
                trace.queue = None
        return result

    def _wait(self, ticket: Ticket, now: float) -> Action:
        action = Core._wait(self, ticket, now)
        trace = _live.get(ticket.info.id)
        if trace is not None and isinstance(action, Wait) and trace.queue is None:
            trace.queue = trace.child("queue_wait", time.time_ns())
        return action


class _TracedAdmitter:
    """The core's admitter with its decisions timed as `admission` spans; everything else
    is the admitter's own (a store-backed admitter keeps `admit_async`, others lack it)."""

    def __init__(self, inner: Any) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name != "admit_async":
            return value

        async def admit_async(info: Any, now: float) -> Any:
            t0 = time.time_ns()
            verdict = await value(info, now)
            _admission(info.id, t0, verdict)
            return verdict

        return admit_async

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def admit(self, info: Any, now: float) -> Any:
        t0 = time.time_ns()
        verdict = self._inner.admit(info, now)
        _admission(info.id, t0, verdict)
        return verdict


def _admission(engine_id: str, t0: int, verdict: Any) -> None:
    trace = _live.get(engine_id)
    if trace is None:
        return
    trace.end_step(t0)
    span = trace.child("admission", t0)
    outcome = verdict.code if isinstance(verdict, AdmissionRefused) else "admitted"
    span.set_attribute("fleetgate.admission", outcome)
    span.end()
