"""A small HTTP/1.1 server on asyncio + httptools, made for proxying.

Why not an ASGI stack: on this machine FastAPI/uvicorn costs 0.4–0.8 ms of CPU per proxied
request before any gateway logic (../shared/docs/PERFORMANCE.md), more than the gateway's
whole budget. This server does only what a JSON/SSE API gateway needs: keep-alive,
content-length and chunked request bodies, `Expect: 100-continue`, pipelined requests
(served in order), content-length and chunked responses with write backpressure, a
request-size limit, and idle-connection reaping.

A handler is `async def handler(request, responder)`. It runs in its own task; when the
client goes away the task is cancelled, so an `await` on the upstream raises
CancelledError and the handler's `finally` blocks release what they hold. That is how a
client disconnect aborts the upstream request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus

import httptools

from gateway.errors import error_body

log = logging.getLogger("fleetgate.http")

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_MAX_HEADER_BYTES = 64 * 1024


class HttpRequest:
    __slots__ = ("body", "headers", "http_version", "method", "path", "query")

    def __init__(
        self, method: str, path: str, query: str, headers: dict[str, str], body: bytes, version: str
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # lower-case names; repeated headers joined with ", "
        self.body = body
        self.http_version = version


Handler = Callable[[HttpRequest, "Responder"], Awaitable[None]]


class ClientGone(ConnectionError):
    """The client closed the connection while we were writing to it."""


class Responder:
    """Writes the one response to one request."""

    __slots__ = ("_conn", "_keep_alive", "finished", "started", "status")

    def __init__(self, conn: _Connection, keep_alive: bool) -> None:
        self._conn = conn
        self._keep_alive = keep_alive
        self.started = False
        self.finished = False
        self.status = 0

    @property
    def disconnected(self) -> bool:
        return self._conn.closed

    def _head(self, status: int, headers: list[tuple[str, str]], framing: bytes) -> bytes:
        self.started = True
        self.status = status
        parts = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
        parts.extend(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in headers)
        parts.append(framing)
        if not self._keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)

    def send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """A whole response with a content-length (synchronous: the transport buffers it)."""
        if self.started:
            raise RuntimeError("response already started")
        head = self._head(status, headers, b"content-length: %d\r\n" % len(body))
        self.finished = True
        self._conn.write(head + body)
        self._conn.response_done(self._keep_alive)

    def start_stream(self, status: int, headers: list[tuple[str, str]]) -> None:
        if self.started:
            raise RuntimeError("response already started")
        if self._conn.http10:
            # HTTP/1.0 has no chunked encoding: the body ends when the connection closes
            self._keep_alive = False
            self._conn.write(self._head(status, headers, b""))
            return
        self._conn.write(self._head(status, headers, b"transfer-encoding: chunked\r\n"))

    async def write(self, chunk: bytes) -> None:
        """One chunk of a streamed body; waits while the client is not reading."""
        if not chunk:
            return
        conn = self._conn
        if conn.closed:
            raise ClientGone("client disconnected")
        conn.write(chunk if conn.http10 else b"%x\r\n%s\r\n" % (len(chunk), chunk))
        if conn.write_paused:
            await conn.drain()

    def end_stream(self) -> None:
        if self.finished:
            return
        self.finished = True
        if not self._conn.closed and not self._conn.http10:
            self._conn.write(b"0\r\n\r\n")
        self._conn.response_done(self._keep_alive)


class _Connection(asyncio.Protocol):
    __slots__ = (
        "_body",
        "_drain_waiter",
        "_expect_continue",
        "_header_bytes",
        "_headers",
        "_parser",
        "_pending",
        "_task",
        "_url",
        "closed",
        "http10",
        "last_active",
        "loop",
        "server",
        "transport",
        "write_paused",
    )

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._expect_continue = False
        self._pending: deque[tuple[HttpRequest, bool]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self.write_paused = False
        self.closed = False
        self.http10 = False
        self.last_active = self.loop.time()

    # --- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop transports are not subclasses
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._pending.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(ClientGone("client disconnected"))

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._reject(400, f"malformed HTTP request: {exc}")
        except _Reject as exc:
            self._reject(exc.status, exc.message)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # --- httptools callbacks ----------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._header_bytes = 0
        self._body = []
        self._expect_continue = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > _MAX_HEADER_BYTES:
            raise _Reject(431, "request headers too large")
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = val if old is None else f"{old}, {val}"

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body_bytes:
            raise _Reject(413, f"request body larger than {self.server.max_body_bytes} bytes")
        if self._headers.get("expect", "").lower() == "100-continue" and self.transport:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        if len(self._body) > 1 and sum(map(len, self._body)) > self.server.max_body_bytes:
            raise _Reject(413, f"request body larger than {self.server.max_body_bytes} bytes")

    def on_message_complete(self) -> None:
        parser = self._parser
        url = httptools.parse_url(self._url)
        request = HttpRequest(
            parser.get_method().decode("ascii", "replace"),
            url.path.decode("utf-8", "replace"),
            (url.query or b"").decode("utf-8", "replace"),
            self._headers,
            b"".join(self._body),
            parser.get_http_version(),
        )
        keep_alive = parser.should_keep_alive() and not self.server.closing
        if self._task is None:
            self._start(request, keep_alive)
        else:  # pipelined behind a request still being served
            self._pending.append((request, keep_alive))
            if len(self._pending) > 16 and self.transport:
                self.transport.pause_reading()

    # --- serving ----------------------------------------------------------------------
    def _start(self, request: HttpRequest, keep_alive: bool) -> None:
        self.http10 = request.http_version == "1.0"
        responder = Responder(self, keep_alive)
        self._task = self.loop.create_task(self._serve(request, responder))

    async def _serve(self, request: HttpRequest, responder: Responder) -> None:
        try:
            await self.server.handler(request, responder)
        except (asyncio.CancelledError, ClientGone):
            if not responder.finished:
                self._close()
            return
        except Exception:
            log.exception("unhandled error serving %s %s", request.method, request.path)
            if not responder.started:
                body = error_body("internal gateway error", "internal_error", "internal_error")
                responder.send(500, [("content-type", "application/json")], body)
            else:
                self._close()
            return
        if not responder.finished:
            # a handler that forgot to finish: never leave the client hanging
            if responder.started:
                responder.end_stream()
            else:
                responder.send(204, [], b"")

    def response_done(self, keep_alive: bool) -> None:
        self._task = None
        self.last_active = self.loop.time()
        if not keep_alive:
            self._close()
            return
        if self._pending:
            request, ka = self._pending.popleft()
            if self.transport and len(self._pending) <= 16:
                self.transport.resume_reading()
            self._start(request, ka)

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        if self.closed:
            raise ClientGone("client disconnected")
        if self._drain_waiter is None or self._drain_waiter.done():
            self._drain_waiter = self.loop.create_future()
        await self._drain_waiter

    def _reject(self, status: int, message: str) -> None:
        body = error_body(message, "invalid_request_error", "invalid_request")
        if self.transport is not None and not self.closed and self._task is None:
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s"
                % (status, _REASONS.get(status, b"Error"), len(body), body)
            )
        self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True

    @property
    def idle(self) -> bool:
        return self._task is None and not self._pending


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HttpServer:
    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int = 32 * 1024 * 1024,
        keepalive_timeout: float = 75.0,
    ) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.keepalive_timeout = keepalive_timeout
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self.closing = False
        self._server: asyncio.AbstractServer | None = None
        self._reaper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await self.loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, backlog=2048
        )
        self._reaper = self.loop.create_task(self._reap_idle())
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def _reap_idle(self) -> None:
        # one timer for all connections instead of one per request
        while True:
            await asyncio.sleep(min(5.0, self.keepalive_timeout / 2))
            cutoff = self.loop.time() - self.keepalive_timeout
            for conn in list(self.connections):
                if conn.idle and conn.last_active < cutoff:
                    conn._close()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish for up to `grace` s, then close."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.idle:
                conn._close()
        deadline = self.loop.time() + grace
        while any(not c.idle for c in self.connections) and self.loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn._close()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
