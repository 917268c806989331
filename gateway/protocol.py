"""uvicorn's httptools protocol with the two limits it lacks: head size and head deadline.

uvicorn parses with the same llhttp as everyone, but it buffers a request head of any
size (a client sending one endless header grows the process without bound) and, once a
head has begun, waits for the rest of it forever (slowloris). `fleetgate serve` runs
uvicorn with this subclass:

- a request head larger than `limits.max_header_bytes` is answered 431 and the
  connection closed, before llhttp buffers more of it;
- a request head must be complete within `limits.head_timeout_s` of its first byte,
  else 408 and close (the keep-alive timer covers the time before the first byte);
- a client that half-closes after sending its request still gets its answer;
- uvicorn's own refusals (a malformed request: 400; `--limit-concurrency` exceeded: 503)
  are OpenAI-shaped JSON like every other refusal, not plain text.

Everything else is uvicorn's. Limits are per process, set by `create_app` (uvicorn builds
protocols after loading the app, also in each `--workers` child).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import error_body


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a refused request."""


class HeadLimits:
    max_bytes = 64 * 1024
    timeout_s = 10.0


def _refusal(status: int, reason: bytes, message: str) -> bytes:
    body = error_body(message, "invalid_request_error", "invalid_request")
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, reason)
    return head + b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)


class ClientLink:
    """The connection a proxied request came on, as the fast path sees it
    (`scope["extensions"]["fleetgate.link"]`, only under `fleetgate serve`).

    Plain ASGI tells an app that its client left only through `receive()`, which costs a
    watcher task per request; here the protocol cancels the request's task itself when
    the connection is lost, and `cut` closes a connection whose client stopped reading.
    """

    __slots__ = ("_protocol", "gone", "task")

    def __init__(self, protocol: GatewayHttpProtocol) -> None:
        self._protocol = protocol
        self.task: asyncio.Task[Any] | None = None
        self.gone = False

    @property
    def write_paused(self) -> bool:
        """The client's socket buffer is full: the next write will wait for it."""
        return self._protocol.flow.write_paused

    def watch(self, task: asyncio.Task[Any]) -> None:
        """Cancel `task` if the connection is lost before `release`."""
        self.task = task
        self._protocol.watched.add(self)

    def release(self) -> None:
        self.task = None
        self._protocol.watched.discard(self)

    def lost(self) -> None:
        task = self.task
        if task is not None and not task.done():
            self.gone = True
            task.cancel()

    def cut(self) -> None:
        """Close the connection (the request's task is cancelled as it is lost)."""
        transport = self._protocol.transport
        if transport is not None and not transport.is_closing():
            transport.close()


class GatewayHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watched: set[ClientLink] = set()
        self._reading_head = True  # between a message's end and the next head's end
        self._raw_head_bytes = 0  # bytes read since the last head ended (a bound, cheap)
        self._head_bytes = 0  # the current head's URL and header bytes (exact)
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        # uvicorn's, with the head's bytes counted before llhttp buffers them
        self._unset_keepalive_if_required()
        if self._reading_head:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(HeadLimits.timeout_s, self._head_timed_out)
            self._raw_head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if not self._refused:
                self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        # still inside the head after a whole read: that read was head bytes
        if self._reading_head and self._raw_head_bytes > HeadLimits.max_bytes:
            self._too_large()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True
        self._head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > HeadLimits.max_bytes:
            self._too_large()
            raise _Refused  # stops the parser; data_received sees _refused

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._raw_head_bytes = 0
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()
        # the request's task has not run yet: its scope can still gain the link
        self.scope["extensions"] = {"fleetgate.link": ClientLink(self)}  # type: ignore[dict-item]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True

    def eof_received(self) -> bool | None:  # type: ignore[override]
        # A client may half-close (shut down its sending side) once its request is sent and
        # still read the answer: keep the connection open for that answer. A client that
        # really left is noticed when a write to it fails (a stream's next chunk) or when
        # its answer is written; TCP cannot tell the two apart at the FIN.
        if self.cycle is not None and not self.cycle.response_complete:
            return True
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)
        for link in list(self.watched):
            link.lost()
        self.watched.clear()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._reading_head and self._raw_head_bytes:
            self._refuse(408, b"Request Timeout", "request head not received in time")

    def _too_large(self) -> None:
        self._refuse(431, b"Request Header Fields Too Large", "request headers too large")

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, b"Bad Request", f"malformed HTTP request: {msg}")

    def _refuse(self, status: int, reason: bytes, message: str) -> None:
        self._refused = True
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            # no response in progress: the refusal cannot interleave with another answer
            self.transport.write(_refusal(status, reason, message))
        self.transport.close()


_OVERLOADED = error_body(
    "the gateway is at its connection limit (listen.limit_concurrency); retry shortly",
    "service_unavailable",
    "overloaded",
)


async def _service_unavailable(scope: Any, receive: Any, send: Any) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(_OVERLOADED)),
        (b"connection", b"close"),
        (b"retry-after", b"1"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": _OVERLOADED})


# uvicorn answers --limit-concurrency overflow with this module-level app; ours says the
# same in the OpenAI shape (it only ever runs in place of the gateway's own app)
setattr(httptools_impl, "service_unavailable", _service_unavailable)  # noqa: B010
