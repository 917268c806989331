"""uvicorn's httptools protocol with the two limits it lacks: head size and head deadline.

uvicorn parses with the same llhttp as everyone, but it buffers a request head of any
size (a client sending one endless header grows the process without bound) and, once a
head has begun, waits for the rest of it forever (slowloris). `fleetgate serve` runs
uvicorn with this subclass:

- a request head larger than `limits.max_header_bytes` is answered 431 and the
  connection closed, before llhttp buffers more of it;
- a request head must be complete within `limits.head_timeout_s` of its first byte,
  else 408 and close (the keep-alive timer covers the time before the first byte).

Everything else is uvicorn's. Limits are per process, set by `create_app` (uvicorn builds
protocols after loading the app, also in each `--workers` child).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import error_body


class HeadLimits:
    max_bytes = 64 * 1024
    timeout_s = 10.0


def _refusal(status: int, reason: bytes, message: str) -> bytes:
    body = error_body(message, "invalid_request_error", "invalid_request")
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
        % (
            status,
            reason,
            len(body),
            body,
        )
    )


class GatewayHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_head = True  # between a message's end and the next head's end
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(HeadLimits.timeout_s, self._head_timed_out)
            self._head_bytes += len(data)
        super().data_received(data)
        # still inside the head after feeding it: this read was all head bytes
        if self._reading_head and self._head_bytes > HeadLimits.max_bytes:
            self._refuse(431, b"Request Header Fields Too Large", "request headers too large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_bytes = 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._reading_head and self._head_bytes:
            self._refuse(408, b"Request Timeout", "request head not received in time")

    def _refuse(self, status: int, reason: bytes, message: str) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            # no response in progress: the refusal cannot interleave with another answer
            self.transport.write(_refusal(status, reason, message))
        self.transport.close()
