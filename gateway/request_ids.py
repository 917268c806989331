"""Request ids: the one engines are sent, which the gateway makes, and the client's own.

A client's `X-Request-Id` names its request in the gateway's logs and comes back in the
answer's `x-request-id` header; it never reaches an engine. Engines key their requests by
id (vLLM refuses a duplicate, and has crashed on one), so an id a client chose — or could
guess — would let one tenant collide with another's request. Every request is therefore
sent with an id the gateway made (`new`), the same id the pipeline core, QUARTZ's
predictor and token-pool holds know it by; a request id in the JSON body (SGLang's `rid`,
vLLM's `request_id`) is removed before forwarding (`scrub`).

`new` hands out 128 random bits as hex, cut from one `os.urandom` batch per 256 ids (the
kernel's CSPRNG, one system call per batch, under 1 µs an id): unguessable, and distinct
across requests, replicas and restarts with overwhelming probability (2^-64 for 2^32
ids). A forked child drops the batch it inherited. Called from the event loop's thread
only (the proxy's handler), so the batch needs no lock.
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from gateway.openai_request import ParsedRequest

MAX_CLIENT_ID = 128  # bytes of a client's X-Request-Id kept; a longer one is replaced
BODY_ID_FIELDS = ("rid", "request_id")  # SGLang's; vLLM's (the header wins there)

_BATCH = 256  # ids per os.urandom call
_ID_HEX = 32  # 128 bits
_batch = ""
_at = 0


def _drop_batch() -> None:
    global _batch, _at
    _batch, _at = "", 0


os.register_at_fork(after_in_child=_drop_batch)  # a forked worker must not repeat the parent's


def new() -> str:
    """A fresh id for the engine: 32 hex characters."""
    global _batch, _at
    at = _at
    if at >= len(_batch):
        _batch, at = os.urandom(_BATCH * _ID_HEX // 2).hex(), 0
    _at = at + _ID_HEX
    return _batch[at : at + _ID_HEX]


def client_id(value: bytes | None) -> str | None:
    """The client's X-Request-Id when it is printable ASCII of at most 128 bytes (safe in
    a header and a log line), else None."""
    if value and len(value) <= MAX_CLIENT_ID and value.isascii():
        text = value.decode("ascii")
        if text.isprintable():
            return text
    return None


def scrub(parsed: ParsedRequest, raw: bytes) -> bytes:
    """The body to forward: `raw`, or, when the client put a request id in it, the body
    re-encoded without one (the engine then uses the gateway's header, or its own)."""
    body: dict[str, Any] = parsed.body
    if "rid" not in body and "request_id" not in body:  # BODY_ID_FIELDS, unrolled: per request
        return raw
    for f in BODY_ID_FIELDS:
        body.pop(f, None)
    return orjson.dumps(body)
