"""gateway/tracing.py without a gateway: sampling, the traceparent it writes, shutting down,
and the configuration's check that the otel extra is installed."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway import tracing
from gateway.config import ConfigError, Tracing, load_config

TRACEPARENT = re.compile(rb"^traceparent: 00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\r\n$")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()
    tracing.shutdown()
    assert not tracing.ON


def _attempt() -> Any:
    return SimpleNamespace(
        status=200, pool="short", worker="w0", ticket=None, prompt_tokens=3,
        completion_tokens=5, ttft=0.25, admission=None, error=None,
    )  # fmt: skip


def test_a_sampled_request_and_its_traceparent(exporter: InMemorySpanExporter) -> None:
    tracing.configure(Tracing(enabled=True), exporter=exporter)
    tracing.begin("e1", "chat", "client-1")
    first = TRACEPARENT.match(tracing.upstream("e1", "w0", "short"))
    second = TRACEPARENT.match(tracing.upstream("e1", "w1", "short"))  # a retry
    assert first and second
    tracing.end("e1", _attempt())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = spans["POST /v1/chat/completions"]
    attempts = [s for s in exporter.get_finished_spans() if s.name == "upstream"]
    assert len(attempts) == 2 and attempts[0].attributes["fleetgate.retried"] is True
    assert int(first[1], 16) == root.context.trace_id
    assert [int(m[2], 16) for m in (first, second)] == [a.context.span_id for a in attempts]
    assert int(first[3], 16) & 1  # sampled
    assert root.attributes["gen_ai.usage.output_tokens"] == 5
    assert tracing._live == {}


def test_unsampled_requests_export_nothing_but_still_propagate(
    exporter: InMemorySpanExporter,
) -> None:
    tracing.configure(Tracing(enabled=True, sample_ratio=0.0), exporter=exporter)
    tracing.begin("e2", "completions", "client-2")
    m = TRACEPARENT.match(tracing.upstream("e2", "w0", "short"))
    assert m and int(m[3], 16) & 1 == 0  # the engine is told: not sampled
    tracing.end("e2", _attempt())
    assert exporter.get_finished_spans() == ()


def test_off_configure_does_nothing() -> None:
    tracing.configure(Tracing())
    assert not tracing.ON and tracing._tracer is None


def test_enabled_without_the_extra_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.import_module

    def without_otel(name: str, package: str | None = None) -> Any:
        if name.startswith("opentelemetry"):
            raise ImportError(f"No module named {name!r}")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", without_otel)
    data = {"pools": {"short": {"max_model_len": 8192, "models": ["m"],
                                "workers": [{"url": "http://127.0.0.1:9"}]}},
            "tracing": {"enabled": True}}  # fmt: skip
    with pytest.raises(ConfigError, match=r"tracing\.enabled: needs the otel extra"):
        load_config(data=data, environ={})


def test_a_clients_trace_context_is_continued_or_not(exporter: InMemorySpanExporter) -> None:
    client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    head = [(b"host", b"gw"), (b"traceparent", client.encode())]
    tracing.configure(Tracing(enabled=True, sample_ratio=0.0), exporter=exporter)
    tracing.incoming(head)
    tracing.begin("e3", "chat", "c3")
    tracing.end("e3", _attempt())
    tracing.incoming([(b"host", b"gw")])  # the next request sent none: a trace of its own
    tracing.begin("e4", "chat", "c4")
    tracing.end("e4", _attempt())
    (root,) = exporter.get_finished_spans()  # the client's sampled flag decides: traced
    assert f"00-{root.context.trace_id:032x}-{root.parent.span_id:016x}-01" == client
    tracing.shutdown()
    fresh = InMemorySpanExporter()
    tracing.configure(Tracing(enabled=True, client_context=False), exporter=fresh)
    tracing.incoming(head)
    tracing.begin("e5", "chat", "c5")
    tracing.end("e5", _attempt())
    (root,) = fresh.get_finished_spans()
    assert root.parent is None
