"""uvicorn's httptools protocol with the two limits it lacks: head size and head deadline.

uvicorn parses with the same llhttp as everyone, but it buffers a request head of any
size (a client sending one endless header grows the process without bound) and, once a
head has begun, waits for the rest of it forever (slowloris). `fleetgate serve` runs
uvicorn with this subclass:

- a request head larger than `limits.max_header_bytes` is answered 431 and the
  connection closed, before llhttp buffers more of it;
- a request head must be complete within `limits.head_timeout_s` of its first byte,
  else 408 and close; an idle connection is closed after the keep-alive time (one
  sweeper task per server checks both, no timer per request);
- a client that half-closes after sending its request still gets its answer;
- uvicorn's own refusals (a malformed request: 400; `--limit-concurrency` exceeded: 503)
  are OpenAI-shaped JSON like every other refusal, not plain text;
- a malformed request body (a bad chunk size, a chunk without its CRLF, a chunk-size line
  or extension over `MAX_CHUNK_LINE` bytes) is answered 400 and the connection closed, as
  is a body whose client closed its side before the body's end (uvicorn closed without a
  word once the app had the head; llhttp accepts a size line of any length, so an endless
  one held the request until the client gave up).

Everything else is uvicorn's. Limits are per process, set by `create_app` (uvicorn builds
protocols after loading the app, also in each `--workers` child).
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.errors import error_body
from gateway.link import ClientLink


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a refused request."""


class HeadLimits:
    max_bytes = 64 * 1024
    timeout_s = 10.0


# a chunk-size line (size, extensions) still unfinished after this many bytes is refused
# (Node caps chunk extensions at 16 KiB too). Checked when a read ends, so a line that
# ends within the same socket read may be up to one read (256 KiB) longer: a bound, not
# an exact limit, at no cost per body byte.
MAX_CHUNK_LINE = 16 * 1024


def _refusal(status: int, reason: bytes, message: str) -> bytes:
    body = error_body(message, "invalid_request_error", "invalid_request")
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, reason)
    return head + b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)


class GatewayHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.watched: set[ClientLink] = set()
        self._reading_head = True  # between a message's end and the next head's end
        self._raw_head_bytes = 0  # bytes read since the last head ended (a bound, cheap)
        self._refused = False
        self._unframed = 0  # body bytes read since the last chunk header or body byte
        self._head_in_unframed = False  # the count still holds its read's head bytes
        # when this connection's head (or keep-alive) time runs out; 0: a request is served
        self.deadline = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.deadline = self.loop.time() + self.timeout_keep_alive
        _Sweeper.watch(self.loop, self.connections)

    def data_received(self, data: bytes) -> None:
        # uvicorn's, with the head's bytes counted before llhttp buffers them (and no
        # keep-alive timer to cancel: the sweeper keeps every connection's deadline)
        if self._reading_head:
            if not self._raw_head_bytes:  # a head begins: its deadline replaces keep-alive
                self.deadline = self.loop.time() + HeadLimits.timeout_s
            self._raw_head_bytes += len(data)
        else:
            self._unframed += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self._refused:
                if self._in_body():
                    self._refuse_body(f"malformed request body: {exc}")
                else:
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
        elif (
            self._unframed > MAX_CHUNK_LINE
            and not self._refused
            and self._in_body()
            and self._unframed_body() > MAX_CHUNK_LINE
        ):
            # bytes and bytes with neither a chunk header nor a body byte in them: one
            # endless chunk-size line (leading zeros, an extension), which llhttp accepts
            self._refuse_body(
                f"malformed request body: chunk-size line over {MAX_CHUNK_LINE} bytes"
            )

    def on_chunk_header(self) -> None:
        self._unframed = 0
        self._head_in_unframed = False

    def on_body(self, body: bytes) -> None:
        self._unframed = 0
        self._head_in_unframed = False
        super().on_body(body)

    def _unframed_body(self) -> int:
        """The unframed count without the head bytes it was started with (the head is
        measured only here, when the count could be too large: not per request)."""
        if self._head_in_unframed:
            self._head_in_unframed = False
            self._unframed = max(0, self._unframed - _head_size(self))
        return self._unframed

    def _in_body(self) -> bool:
        """This connection's current request is still sending its body and has no answer
        yet (none queued before it): a refusal now is this request's answer."""
        cycle = self.cycle
        return (
            not self._reading_head
            and cycle is not None
            and cycle.more_body
            and not cycle.response_started
            and not self.pipeline
        )

    def _refuse_body(self, message: str) -> None:
        """Answer 400 for the request whose body broke, and close. The app, waiting for
        that body, hears a disconnect and answers nothing more."""
        cycle = self.cycle
        assert cycle is not None
        self._refused = True
        if not self.transport.is_closing():
            self.transport.write(_refusal(400, b"Bad Request", message))
            self.transport.close()
        cycle.disconnected = True
        cycle.message_event.set()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True

    def on_headers_complete(self) -> None:
        # the head is within the bytes read since the last message ended: only when those
        # exceed the limit is the head itself measured
        if self._raw_head_bytes > HeadLimits.max_bytes and _head_size(self) > HeadLimits.max_bytes:
            self._too_large()
            raise _Refused  # stops the parser; data_received sees _refused
        self._reading_head = False
        # the bytes of this read after the head (about: the request line's overhead is
        # taken as 32), the start of the body's framing count; the head's own bytes are
        # taken out only if the count grows past the limit (`_unframed_body`)
        self._unframed = self._raw_head_bytes - 32
        self._head_in_unframed = True
        self._raw_head_bytes = 0
        self.deadline = 0.0
        link = ClientLink(self)
        self.scope["extensions"] = {"fleetgate.link": link}  # type: ignore[dict-item]
        super().on_headers_complete()
        link._cycle = self.cycle

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # uvicorn's, keeping the task on the request's link (so `lost` can cancel it
        # without the app asking asyncio for its current task)
        if self.config.reset_contextvars:
            task = self.loop.create_task(cycle.run_asgi(app), context=contextvars.Context())
        else:
            task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        extensions = cycle.scope.get("extensions")
        if extensions:
            link = extensions.get("fleetgate.link")
            if isinstance(link, ClientLink):
                link.task = task

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_head = True
        self._unframed = 0
        self._head_in_unframed = False

    def eof_received(self) -> bool | None:  # type: ignore[override]
        # A client may half-close (shut down its sending side) once its request is sent and
        # still read the answer: keep the connection open for that answer. A client that
        # really left is noticed when a write to it fails (a stream's next chunk) or when
        # its answer is written; TCP cannot tell the two apart at the FIN.
        if self._in_body() and not self._refused:
            # but a body cut short can never end: answer that now rather than at its
            # deadline (or never, before its first byte)
            self._refuse_body("request body truncated: the client closed before its end")
            return None
        if self.cycle is not None and not self.cycle.response_complete:
            return True
        return None

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive deadline kept for the sweeper instead of a timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif not self._raw_head_bytes:  # (a pipelined head already begun keeps its own)
            self.deadline = self.loop.time() + self.timeout_keep_alive

    def expire(self) -> None:
        """The sweeper found the deadline passed: a head too slow, or idle too long."""
        self.deadline = 0.0
        if self._reading_head and self._raw_head_bytes:
            self._refuse(408, b"Request Timeout", "request head not received in time")
        elif (
            (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self.transport.is_closing()
        ):
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.deadline = 0.0
        super().connection_lost(exc)
        for link in list(self.watched):
            link.lost()
        self.watched.clear()

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


def _head_size(protocol: HttpToolsProtocol) -> int:
    return len(protocol.url) + sum(len(k) + len(v) + 4 for k, v in protocol.headers)


class _Sweeper:
    """One task per event loop and server that expires connections' deadlines, instead
    of a timer armed and cancelled per request (uvicorn arms one for keep-alive)."""

    running: ClassVar[dict[int, asyncio.Task[None]]] = {}

    @classmethod
    def watch(cls, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        key = id(connections)
        task = cls.running.get(key)
        if task is None or task.done():
            cls.running[key] = loop.create_task(cls._sweep(loop, connections))

    @staticmethod
    async def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        while True:
            await asyncio.sleep(min(1.0, HeadLimits.timeout_s / 4))
            now = loop.time()
            for conn in list(connections):
                deadline = getattr(conn, "deadline", 0.0)
                if deadline and now > deadline:
                    conn.expire()


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
