"""bench/mock_worker.py speaks enough OpenAI for the official SDK and the gateway's scraper.

The benchmark's numbers mean something only if the mock's answers are valid: the SDK
parses them, streams end as engines end them, and the usage event the gateway asks for
(`stream_options.include_usage`) is there. No timings here (bench/ prints those).
"""

from __future__ import annotations

import socket
import sys

import httpx
import openai
import pytest

from gateway.telemetry import parse_metrics
from tests.procs import ROOT, Proc, free_port, procs

HELLO = [{"role": "user", "content": "Say hello."}]
CHUNKS = 20


@pytest.fixture(scope="module")
def mock():
    with procs() as ps:
        port = free_port()
        argv = [sys.executable, str(ROOT / "bench" / "mock_worker.py"), "--port", str(port)]
        p = Proc("mock-worker", argv, port, ps.dir / "mock-worker.log")
        ps.procs.append(p)
        yield p.start().wait_ready("/health")


@pytest.fixture
def client(mock):
    with openai.OpenAI(base_url=mock.url + "/v1", api_key="unused", max_retries=0, timeout=10) as c:
        yield c


def test_chat_non_streaming_parses(client):
    r = client.chat.completions.create(model="mock", messages=HELLO, max_tokens=20)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage is not None
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_without_usage(client):
    chunks = list(client.chat.completions.create(model="mock", messages=HELLO, stream=True))
    assert len(chunks) == CHUNKS
    assert all(c.object == "chat.completion.chunk" and len(c.choices) == 1 for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip()
    assert all(c.usage is None for c in chunks)


def test_chat_stream_include_usage_appends_a_usage_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model="mock", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
    )
    assert len(chunks) == CHUNKS + 1
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens > 0
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_completions_stream_include_usage(client):
    plain = client.completions.create(model="mock", prompt="Paris is", max_tokens=5)
    assert plain.object == "text_completion"
    assert plain.choices[0].text
    chunks = list(
        client.completions.create(
            model="mock", prompt="Paris is", stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_models_health_and_metrics_for_the_gateway(client, mock):
    assert [m.id for m in client.models.list()] == ["mock"]
    health = httpx.get(mock.url + "/health")
    assert health.status_code == 200 and health.content == b""
    metrics = httpx.get(mock.url + "/metrics")
    assert metrics.status_code == 200
    fields = parse_metrics(metrics.text)  # what the gateway's scraper reads
    assert fields == {"running": 0.0, "waiting": 0.0, "kv": 0.0}
    missing = httpx.post(mock.url + "/v1/embeddings", json={"input": "x"})
    assert missing.status_code == 404


def test_malformed_request_gets_400_and_close(mock):
    with socket.create_connection(("127.0.0.1", mock.port), timeout=5) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400")
