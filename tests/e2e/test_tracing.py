"""OpenTelemetry tracing (gateway/tracing.py): the spans of one compressed, queued, streamed
request, read from the SDK's in-memory exporter, with the `traceparent` the engine was sent;
and, with tracing off, that nothing of it runs on the request path.

The gateway runs in this process (its spans are read here), served through httpx's ASGI
transport, in front of an emulator process on loopback; the last test runs it as a process
exporting to a stand-in OTLP collector. What the engine was sent is
read by a spy on the gateway's own upstream client: the real request still goes out."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway import tracing
from gateway.app import create_app
from gateway.config import Tracing, load_config
from gateway.placing import start_request
from policies.core import Core
from tests.e2e.fleet import MODEL, emulator, gateway_config, wait_until
from tests.e2e.test_two_drivers import _chat
from tests.procs import Procs, free_port

pytestmark = pytest.mark.e2e

SHORT = 4096  # the short pool's context: the chat below (~5,500 tokens) is in its C&R band
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"  # a client's trace, span


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    ps = Procs()
    try:
        yield emulator(ps, "trace-short", SHORT).wait_ready().url
    finally:
        ps.close()


@pytest.fixture
def no_tracing() -> Iterator[None]:
    yield
    tracing.shutdown()


def _config(engine: str) -> Any:
    """One pool of one slot; band requests compressed onto it (no longer pool to spill to,
    so a request that finds the slot taken waits for it)."""
    cfg = gateway_config([engine], [])
    cfg["pools"]["short"].update(max_model_len=SHORT, max_num_seqs=1)  # type: ignore[index]
    cfg["placement"] = {"policy": "compress_and_route", "short_pool": "short",
                        "compress_single_pool": True}  # fmt: skip
    cfg["dispatch"] = {"timeout_s": 60}
    return load_config(data=cfg, environ={})


async def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached"
        await asyncio.sleep(0.002)


async def test_the_spans_of_a_compressed_queued_streamed_request(
    engine: str, no_tracing: None
) -> None:
    exporter = InMemorySpanExporter()
    tracing.configure(Tracing(enabled=True), exporter=exporter)
    app = create_app(_config(engine))
    await app.gateway.start()
    heads: list[bytes] = []
    try:
        client = app.gateway.client
        real = client.request

        async def spy(endpoint: Any, method: bytes, path: bytes, head: bytes, body: bytes) -> Any:
            heads.append(head)
            return await real(endpoint, method, path, head, body)

        client.request = spy  # type: ignore[method-assign]
        workers = app.gateway.fleet.workers
        short = next(w for w in workers.values() if w.pool == "short")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as c:
            # a long answer holds the short pool's one slot, so the chat waits for it
            hi = [{"role": "user", "content": "Hi"}]
            long_answer = {"model": MODEL, "messages": hi, "max_tokens": 4000, "ignore_eos": True}
            hold = asyncio.create_task(c.post("/v1/chat/completions", json=long_answer))
            await _until(lambda: short.in_flight == 1)
            chat = {"model": MODEL, "messages": _chat(), "max_tokens": 16, "stream": True}
            client_trace = {"x-request-id": "k", "traceparent": f"00-{CLIENT_TRACE}-01"}
            r = await c.post("/v1/chat/completions", json=chat, headers=client_trace)
            assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
            assert r.headers["x-fleetgate-pool"] == "short"
            assert "x-fleetgate-compressed" in r.headers
            assert (await hold).status_code == 200
    finally:
        await app.gateway.stop()

    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.attributes.get("fleetgate.request_id") == "k")
    trace_id = root.context.trace_id
    # the client's trace continues: its span is the request span's parent
    assert f"{trace_id:032x}-{root.parent.span_id:016x}" == CLIENT_TRACE
    mine = sorted(
        (s for s in spans if s.context.trace_id == trace_id and s is not root),
        key=lambda s: (s.start_time, s.end_time),
    )
    assert all(s.parent.span_id == root.context.span_id for s in mine)
    names = [s.name for s in mine]
    # placed, counted and compressed, admitted, routed (no room), queued, routed on the
    # wake, sent; in that order
    assert names == [
        "estimate",
        "count_compress",
        "admission",
        "route",
        "queue_wait",
        "route",
        "upstream",
    ], names
    by = {s.name: s for s in mine}
    first_route, wake_route = (s for s in mine if s.name == "route")
    assert first_route.attributes["fleetgate.route"] == "no_room"
    assert wake_route.attributes["fleetgate.worker"] == short.id
    for earlier, later in itertools.pairwise(mine):
        if {earlier.name, later.name} != {"route", "queue_wait"}:
            assert earlier.end_time <= later.start_time, (earlier.name, later.name)
    assert by["queue_wait"].end_time == wake_route.end_time  # the wake's routing ends the wait
    assert root.start_time <= mine[0].start_time and mine[-1].end_time <= root.end_time
    compressed = root.attributes["fleetgate.compressed"]
    assert by["count_compress"].attributes["fleetgate.compressed"] == compressed
    before, after = map(int, str(compressed).split("->"))
    assert after <= SHORT - 16 < before
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["fleetgate.pool"] == "short"
    assert root.attributes["gen_ai.usage.output_tokens"] == 16
    upstream = by["upstream"]
    assert [e.name for e in upstream.events] == ["first_token"]
    ttft = upstream.events[0].attributes["fleetgate.ttft_s"]
    assert ttft == root.attributes["fleetgate.ttft_s"]
    # the engine was sent the upstream span's context (W3C trace context)
    c = upstream.context
    assert c.trace_flags & 1  # sampled
    traceparent = b"traceparent: 00-%032x-%016x-%02x\r\n" % (trace_id, c.span_id, c.trace_flags)
    assert sum(traceparent in h for h in heads) == 1, heads


async def test_off_nothing_of_it_runs(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracing off (the default): the request path does not call into gateway/tracing.py,
    its tracer is never touched and no step is wrapped."""
    assert not tracing.ON

    class Untouchable:
        def __getattribute__(self, name: str) -> Any:
            raise AssertionError(f"the tracer was touched: {name}")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("tracing ran with tracing off")

    monkeypatch.setattr(tracing, "_tracer", Untouchable())
    for name in ("incoming", "begin", "upstream", "end", "_admission"):
        monkeypatch.setattr(tracing, name, refuse)
    app = create_app(_config(engine))
    await app.gateway.start()
    try:
        pipeline = app.gateway.driver
        assert pipeline is not None
        core = pipeline.core
        assert type(core) is Core  # not tracing's subclass
        assert tracing._parent.get() is None
        assert pipeline.start_request is start_request
        assert "fit" not in vars(pipeline.fitter)
        assert "_first_token" not in vars(pipeline.forwarder)
        assert type(core.admitter).__name__ != "_TracedAdmitter"
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as c:
            chat = {"model": MODEL, "messages": _chat(), "max_tokens": 16, "stream": True}
            traceparent = {"traceparent": f"00-{CLIENT_TRACE}-01"}
            r = await c.post("/v1/chat/completions", json=chat, headers=traceparent)
            assert r.status_code == 200 and "x-fleetgate-compressed" in r.headers
    finally:
        await app.gateway.stop()
    assert tracing._live == {}


def test_a_gateway_process_exports_over_otlp(
    engine: str, fresh_procs: Procs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleetgate serve` with tracing.enabled sends its spans over OTLP/HTTP: to a stand-in
    collector on loopback that decodes them with the OTLP protobuf definitions."""
    received: list[ExportTraceServiceRequest] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            received.append(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    collector = ThreadingHTTPServer(("127.0.0.1", free_port()), Collector)
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("FLEETGATE_TRACING__ENABLED", "true")
        monkeypatch.setenv(
            "FLEETGATE_TRACING__ENDPOINT",
            f"http://127.0.0.1:{collector.server_address[1]}/v1/traces",
        )
        monkeypatch.setenv("FLEETGATE_TRACING__SERVICE_NAME", "gw-under-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the batch's delay, ms
        gw = fresh_procs.fleetgate(
            "gateway", "serve", "--upstream", engine, "--model", MODEL,
            "--max-model-len", str(SHORT), "--port", "{port}",
        )  # fmt: skip
        gw.wait_ready("/readyz", timeout=60)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 8, "stream": True}  # fmt: skip
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200

        def spans() -> dict[str, Any]:
            return {
                s.name: (rs.resource, s)
                for req in received
                for rs in req.resource_spans
                for ss in rs.scope_spans
                for s in ss.spans
            }

        assert wait_until(lambda: "upstream" in spans(), timeout=20), spans()
        got = spans()
        assert {"POST /v1/chat/completions", "estimate", "admission", "route"} <= set(got)
        resource, upstream = got["upstream"]
        names = {a.key: a.value.string_value for a in resource.attributes}
        assert names["service.name"] == "gw-under-test"
        assert [e.name for e in upstream.events] == ["first_token"]
        assert upstream.parent_span_id == got["POST /v1/chat/completions"][1].span_id
    finally:
        collector.shutdown()
