"""Helpers for the emulator wire tests: SSE framing, compact JSON, metric lookups."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

DONE = b"data: [DONE]\n\n"

# One pooled client: a fresh httpx client costs ~20 ms (TLS context), which would swamp
# the emulator's time-scaled latencies.
CLIENT = httpx.Client(timeout=30.0)


def compact(obj: Any) -> bytes:
    """How Starlette / pydantic serialise: no spaces, UTF-8 kept."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    """Parse a complete SSE body, asserting the framing both servers use."""
    assert raw.endswith(DONE), raw[-200:]
    frames = raw[: -len(DONE)].split(b"\n\n")
    assert frames[-1] == b"", "every event ends with a blank line"
    events = []
    for frame in frames[:-1]:
        assert frame.startswith(b"data: "), frame
        payload = frame[len(b"data: ") :]
        assert b"\n" not in payload
        obj = json.loads(payload)
        assert compact(obj) == payload, f"not compact JSON: {payload!r}"
        events.append(obj)
    return events


def post(url: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    return CLIENT.post(url + path, json=body, **kw)


def stream_raw(url: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, bytes]:
    with CLIENT.stream("POST", url + path, json=body) as r:
        return r, r.read()


def metrics(url: str, accept: str | None = None) -> dict[str, Any]:
    """name → family, from the emulator's /metrics."""
    headers = {"Accept": accept} if accept else {}
    text = CLIENT.get(url + "/metrics", headers=headers).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    for fam in families.values():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise KeyError(f"{name}{labels} not exposed")


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> Any:
    """Poll until `predicate()` is truthy; return its last value (falsy on deadline)."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = predicate()
    return value
