"""The one seam through which the gateway talks to engines: keep-alive HTTP/1.1 pools.

Why a small client of our own: the hot path pays for every layer between the socket and
the relay. On this machine httpx's default pool costs ~2.5 ms CPU per request and collapses
past 16 connections; aiohttp's client is ten times cheaper but still a large share of a
0.3 ms budget, and its per-request timeout object cannot express "first byte" and "idle
between chunks" separately. This client writes the request bytes, parses the answer with
httptools (content-length, chunked, and close-delimited bodies), and hands body chunks over
as they arrive.

Timeouts (all per request):
- connect: opening a new connection;
- first byte: from sending the request to the first byte of the response *body* (the
  engine may send streaming headers at once and the first token only after prefill);
- idle: between two body chunks after that;
- pool wait: waiting for a connection when the worker already has
  `max_connections_per_worker` open (waiters are served first come, first served).
One sweeper task checks the deadlines of every open connection and waiter a few times per
timeout, so no timer is armed per request.

A caller relaying a stream to a slow client stops reading the engine while it is blocked
writing; it says so with `UpstreamResponse.suspend_for_client(write_timeout_s, on_expire)`
and `resume_from_client()`. Meanwhile the engine's idle timer is paused (a slow client is
not the engine's fault and never an `UpstreamError`); if the caller is still blocked after
`write_timeout_s`, the sweeper calls `on_expire()` once.

Limits (a misbehaving engine must not make the gateway buffer without bound): a response
head is at most `MAX_HEAD_BYTES` (interim 1xx heads included) and `MAX_HEADER_LINES`
header lines, else `ProtocolViolation`; a body read whole with `read()` is at most
`max_response_bytes`, else `ResponseTooLarge`. Interim 1xx responses (100
Continue, 103 Early Hints) are skipped. Bytes an engine sends when no request is
outstanding (on an idle pooled connection, or after a complete response) close that
connection: they are never taken for the next request's answer.

Failure posture: an error before any response byte is `UpstreamError(before_response=True)`
(the caller may retry on another worker); a connection reused from the pool that dies
before answering is retried once here on a fresh connection, since the engine never saw
the request (the keep-alive race). Cancellation (the client left) closes the connection,
which is how the engine learns to abort the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl as _ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

from gateway.upstream_errors import (
    ConnectFailed,
    ConnectionReset,
    ConnectTimeout,
    FirstByteTimeout,
    IdleTimeout,
    PoolTimeout,
    ProtocolViolation,
    ResponseTooLarge,
    UpstreamError,
)

log = logging.getLogger("fleetgate.upstream")

_READ_HIGH_WATER = 256 * 1024  # bytes buffered from an engine before we stop reading it
_POOL_IDLE_S = 4.0  # vLLM's uvicorn closes idle keep-alive connections after 5 s
MAX_HEAD_BYTES = 64 * 1024  # status line + header lines of one answer (1xx heads included)
MAX_HEADER_LINES = 100  # header lines in one response head
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a body read whole with `read()`
DEFAULT_MAX_CONNECTIONS_PER_WORKER = 512


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 5.0
    first_byte: float = 600.0
    idle: float = 60.0
    pool_wait: float = 30.0  # waiting for a free connection at max_connections_per_worker


class PoolStatus(NamedTuple):
    """One worker's connections: `open` counts idle, in-use and being-opened ones."""

    open: int
    idle: int
    in_use: int
    waiting: int


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a worker listens, parsed once at start."""

    host: str
    port: int
    tls: bool
    authority: bytes  # the Host header
    base_path: str = ""

    @classmethod
    def from_url(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname, port, tls, parts.netloc.encode("idna"), parts.path.rstrip("/"))


class _Stop(Exception):
    """Raised from a parser callback to stop parsing (httptools wraps it)."""


class _Conn(asyncio.Protocol):
    __slots__ = (
        "_chunks",
        "_fresh",
        "_paused",
        "_stop",
        "_waiter",
        "buffered",
        "complete",
        "counted",
        "deadline",
        "error",
        "got_body",
        "got_head",
        "head_bytes",
        "headers",
        "in_idle",
        "keep_alive",
        "loop",
        "on_expire",
        "parser",
        "pool",
        "reused",
        "status",
        "transport",
        "until_eof",
        "write_deadline",
    )

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.reused = False
        self.counted = False  # holds one of the pool's `size` slots
        self.in_idle = False  # sits in the pool's idle deque
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.got_head = False
        self.got_body = False
        self.complete = False
        self.keep_alive = False
        self.until_eof = False  # close-delimited body: it ends when the engine closes
        self.error: UpstreamError | None = None
        self.deadline = 0.0  # 0: no request outstanding (bytes arriving now are unsolicited)
        self.write_deadline = 0.0  # nonzero: the caller is blocked writing to its client
        self.on_expire: Callable[[], object] | None = None
        self.head_bytes = 0
        self.buffered = 0
        self._fresh = False  # body bytes arrived in the read being parsed
        self._stop: UpstreamError | None = None
        self._chunks.clear()
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop transports are not subclasses

    def eof_received(self) -> bool | None:
        if self.until_eof and not self.complete and self.error is None:
            self.keep_alive = False
            self.on_message_complete()  # a close-delimited body ends here
        return None  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.complete and self.error is None and self.deadline:
            self.error = ConnectionReset(
                "the worker closed the connection"
                + (" before answering" if not self.got_head else " mid-response"),
                before_response=not self.got_head,
            )
        self.pool.forget(self)
        self._wake()

    def data_received(self, data: bytes) -> None:
        if not self.deadline:
            # no request outstanding: whatever this is, it must not become the next answer
            self.keep_alive = False
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.complete:  # bytes after a complete answer: unsolicited, never pooled
                self.keep_alive = False
                self.close()
                self._wake()
                return
            self.fail(
                self._stop
                or ProtocolViolation(
                    f"malformed response: {exc}", before_response=not self.got_head
                )
            )
            return
        if self._fresh:
            # body bytes came in this read (an SSE stream: many events in one read): its
            # idle deadline, read-side back-pressure and the reader's wake once per read,
            # not once per event
            self._fresh = False
            if not self.complete:
                self.deadline = self.loop.time() + self.pool.timeouts.idle
            if self.buffered > _READ_HIGH_WATER and self.transport is not None and not self._paused:
                self._paused = True
                self.transport.pause_reading()
            self._wake()
        if not self.got_head:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES and self.transport is not None:
                self.fail(
                    ProtocolViolation(
                        f"response head larger than {MAX_HEAD_BYTES} bytes",
                        before_response=True,
                    )
                )

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self.complete:
            raise _Stop  # a second answer to one request

    def on_header(self, name: bytes, value: bytes) -> None:
        headers = self.headers
        headers.append((name.lower(), value))
        if len(headers) > MAX_HEADER_LINES:
            self._stop = ProtocolViolation(
                f"response head has more than {MAX_HEADER_LINES} header lines",
                before_response=True,
            )
            raise _Stop

    def on_headers_complete(self) -> None:
        parser = self.parser
        status = parser.get_status_code()
        if status < 200:
            if status == 101:
                self._stop = ProtocolViolation(
                    "unexpected 101 Switching Protocols", before_response=True
                )
                raise _Stop
            self.headers = []  # interim (100 Continue, 103 Early Hints): the answer follows
            return
        self.status = status
        self.keep_alive = keep_alive = parser.should_keep_alive()
        if not keep_alive and status != 204 and status != 304:
            self.until_eof = not any(
                k == b"content-length" or k == b"transfer-encoding" for k, _ in self.headers
            )
        self.got_head = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self.buffered += len(body)
        self.got_body = True
        self._fresh = True  # `data_received` finishes the read's bookkeeping

    def on_message_complete(self) -> None:
        if not self.got_head:
            return  # the end of an interim 1xx response
        self.complete = True
        self.deadline = 0.0
        self._wake()

    # used by the client
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def fail(self, error: UpstreamError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self.close()
        self._wake()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        self.pool.forget(self)

    def send(self, data: bytes) -> None:
        self._reset()
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionReset(
                "the worker closed the connection before the request", before_response=True
            )
        self.deadline = self.loop.time() + self.pool.timeouts.first_byte
        transport.write(data)

    async def head(self) -> None:
        while not self.got_head:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def next_chunk(self) -> bytes | None:
        while True:
            if self._chunks:
                # everything that arrived since the last read goes out as one piece: one
                # client write per TCP read instead of one per SSE event (measured: 30–55%
                # less CPU per stream at 16+ connections)
                chunks = self._chunks
                chunk = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self.buffered = 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                return chunk
            if self.complete:
                return None
            if self.error is not None:
                raise self.error
            await self._wait()


class _Pool:
    """Keep-alive connections to one worker, at most `max_connections` of them."""

    def __init__(self, endpoint: Endpoint, client: UpstreamClient) -> None:
        self.endpoint = endpoint
        self.loop = client.loop
        self.timeouts = client.timeouts
        self.client = client
        self.max_connections = client.max_connections_per_worker
        self.size = 0  # connections open or being opened: idle + in use + connecting
        self.idle: deque[tuple[_Conn, float]] = deque()
        self.active: set[_Conn] = set()
        self.suspended: set[_Conn] = set()  # callers blocked writing to their client
        # first come, first served; a waiter gets a connection (released by another
        # request) or None (a slot freed: open a connection yourself)
        self.waiters: deque[tuple[asyncio.Future[_Conn | None], float]] = deque()

    def status(self) -> PoolStatus:
        return PoolStatus(self.size, len(self.idle), len(self.active), len(self.waiters))

    def forget(self, conn: _Conn) -> None:
        """The connection is closed (by us or by the engine): drop it everywhere."""
        self.active.discard(conn)
        if conn.in_idle:
            conn.in_idle = False
            for i, (c, _) in enumerate(self.idle):
                if c is conn:
                    del self.idle[i]
                    break
        if conn.counted:
            conn.counted = False
            self.size -= 1
            self._hand_out_slots()

    def _hand_out_slots(self) -> None:
        while self.waiters and self.size < self.max_connections:
            fut, _ = self.waiters.popleft()
            if not fut.done():
                self.size += 1
                fut.set_result(None)

    async def acquire(self) -> _Conn:
        while self.idle:
            conn, _ = self.idle.pop()  # most recently used: least likely to be closed by the peer
            conn.in_idle = False
            if conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                self.active.add(conn)
                return conn
            conn.close()
        if self.size < self.max_connections and not self.waiters:
            self.size += 1
            return await self._connect()
        fut: asyncio.Future[_Conn | None] = self.loop.create_future()
        entry = (fut, self.loop.time() + self.timeouts.pool_wait)
        self.waiters.append(entry)
        try:
            got = await fut
        except asyncio.CancelledError:
            if not fut.cancelled() and fut.done() and fut.exception() is None:
                handed = fut.result()  # handed over just before the cancellation arrived
                if handed is None:
                    self.size -= 1
                    self._hand_out_slots()
                else:
                    self.release(handed)
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(entry)
            raise
        if got is None:
            return await self._connect()  # the slot was counted for us
        return got

    async def _connect(self) -> _Conn:
        """Open a connection in a slot already counted in `size`."""
        ep = self.endpoint
        conn = _Conn(self)
        conn.counted = True
        ssl_ctx = self.client.ssl_context() if ep.tls else None
        try:
            await asyncio.wait_for(
                self.loop.create_connection(lambda: conn, ep.host, ep.port, ssl=ssl_ctx),
                self.timeouts.connect,
            )
        except TimeoutError:
            conn.close()
            raise ConnectTimeout(
                f"connecting to {ep.host}:{ep.port} timed out",
                before_response=True,
            ) from None
        except OSError as exc:
            conn.close()
            raise ConnectFailed(
                f"cannot connect to {ep.host}:{ep.port}: {exc.strerror or exc}",
                before_response=True,
            ) from None
        except BaseException:
            conn.close()
            raise
        conn.reused = False
        if conn.counted:  # else the engine closed it already; `send` will say so
            self.active.add(conn)
        return conn

    def release(self, conn: _Conn) -> None:
        self.active.discard(conn)
        if (
            conn.complete
            and conn.keep_alive
            and conn.transport is not None
            and not self.client.closed
        ):
            conn.deadline = 0.0
            while self.waiters:
                fut, _ = self.waiters.popleft()
                if not fut.done():
                    conn.reused = True
                    self.active.add(conn)
                    fut.set_result(conn)
                    return
            conn.in_idle = True
            self.idle.append((conn, self.loop.time()))
        else:
            conn.close()

    def suspend(self, conn: _Conn, until: float, on_expire: Callable[[], object]) -> None:
        conn.write_deadline = until
        conn.on_expire = on_expire
        self.suspended.add(conn)

    def resume(self, conn: _Conn) -> None:
        conn.write_deadline = 0.0
        conn.on_expire = None
        self.suspended.discard(conn)

    def sweep(self, now: float) -> None:
        if self.suspended:
            for conn in list(self.suspended):
                if now > conn.write_deadline:
                    self.suspended.discard(conn)  # stays suspended (write_deadline), fires once
                    conn.write_deadline = math.inf
                    on_expire, conn.on_expire = conn.on_expire, None
                    if on_expire is not None:
                        try:
                            on_expire()
                        except Exception:
                            log.exception("write-deadline callback failed")
        for conn in list(self.active):
            if conn.write_deadline:
                continue  # the caller is blocked writing to its client: not the engine's fault
            if conn.deadline and now > conn.deadline:
                if conn.got_body:
                    conn.fail(IdleTimeout("the worker stopped sending", before_response=False))
                else:
                    conn.fail(
                        FirstByteTimeout(
                            "the worker did not answer in time",
                            before_response=not conn.got_head,
                        )
                    )
        while self.idle and now - self.idle[0][1] > _POOL_IDLE_S:
            conn, _ = self.idle.popleft()
            conn.in_idle = False
            conn.close()
        waiters = self.waiters
        while waiters and now > waiters[0][1]:  # one wait bound for all: oldest first
            fut, _ = waiters.popleft()
            if not fut.done():
                ep = self.endpoint
                fut.set_exception(
                    PoolTimeout(
                        f"no free connection to {ep.host}:{ep.port} within "
                        f"{self.timeouts.pool_wait:g} s ({self.max_connections} in use)",
                        before_response=True,
                    )
                )

    def close(self) -> None:
        while self.waiters:
            fut, _ = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(
                    ConnectFailed("the upstream client is closed", before_response=True)
                )
        while self.idle:
            conn, _ = self.idle.popleft()
            conn.in_idle = False
            conn.close()
        for conn in list(self.active):
            conn.close()
        self.suspended.clear()


class UpstreamResponse:
    """An engine's answer. Read it whole (`read`) or chunk by chunk (`next_chunk`), then
    `release()` (also on error paths: it closes a half-read connection)."""

    __slots__ = ("_conn", "_pool", "_released", "headers", "status")

    def __init__(self, conn: _Conn, pool: _Pool) -> None:
        self._conn = conn
        self._pool = pool
        self._released = False
        self.status = conn.status
        self.headers = conn.headers

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    async def next_chunk(self) -> bytes | None:
        return await self._conn.next_chunk()

    async def read(self, max_bytes: int | None = None) -> bytes:
        """The whole body; more than `max_bytes` (default: the client's
        `max_response_bytes`) is `ResponseTooLarge`."""
        limit = self._pool.client.max_response_bytes if max_bytes is None else max_bytes
        declared = self.header(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            self._too_large(limit)
        parts = []
        size = 0
        while (chunk := await self._conn.next_chunk()) is not None:
            size += len(chunk)
            if size > limit:
                self._too_large(limit)
            parts.append(chunk)
        return b"".join(parts)

    def _too_large(self, limit: int) -> None:
        self._conn.close()  # stop reading it
        raise ResponseTooLarge(
            f"the worker's response body is larger than max_response_bytes ({limit} bytes)",
            before_response=False,
        )

    def suspend_for_client(self, write_timeout_s: float, on_expire: Callable[[], object]) -> None:
        """The caller stops reading: it is blocked writing to its own (slow) client.

        Until `resume_from_client()`, the engine's first-byte/idle timer is paused. If the
        caller is still suspended `write_timeout_s` from now, the sweeper calls
        `on_expire()` once (e.g. to cancel the request task); the engine is not failed.
        """
        pool = self._pool
        pool.suspend(self._conn, pool.loop.time() + write_timeout_s, on_expire)

    def resume_from_client(self) -> None:
        """The write finished: the engine's timer restarts from now."""
        conn = self._conn
        self._pool.resume(conn)
        if conn.deadline:  # the answer is not complete
            t = self._pool.timeouts
            conn.deadline = self._pool.loop.time() + (t.idle if conn.got_body else t.first_byte)

    def release(self) -> None:
        if not self._released:
            self._released = True
            conn = self._conn
            if conn.write_deadline:
                self._pool.resume(conn)
            self._pool.release(conn)


class UpstreamClient:
    def __init__(
        self,
        timeouts: Timeouts | None = None,
        *,
        max_connections_per_worker: int = DEFAULT_MAX_CONNECTIONS_PER_WORKER,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if max_connections_per_worker < 1:
            raise ValueError("max_connections_per_worker must be at least 1")
        self.loop = asyncio.get_running_loop()
        self.timeouts = t = timeouts or Timeouts()
        self.max_connections_per_worker = max_connections_per_worker
        self.max_response_bytes = max_response_bytes
        self.closed = False
        self._pools: dict[Endpoint, _Pool] = {}
        self._ssl: _ssl.SSLContext | None = None
        tick = min(t.connect, t.first_byte, t.idle, t.pool_wait) / 4
        self._tick = max(0.02, min(1.0, tick))
        self._sweeper = self.loop.create_task(self._sweep())

    def ssl_context(self) -> _ssl.SSLContext:
        if self._ssl is None:
            self._ssl = _ssl.create_default_context()
        return self._ssl

    def _pool(self, endpoint: Endpoint) -> _Pool:
        pool = self._pools.get(endpoint)
        if pool is None:
            pool = self._pools[endpoint] = _Pool(endpoint, self)
        return pool

    def forget(self, endpoint: Endpoint) -> bool:
        """Close and drop an endpoint's pool when nothing uses it (its worker left the
        fleet): its idle keep-alive connections close now, not after the idle timeout."""
        pool = self._pools.get(endpoint)
        if pool is None or pool.active or pool.waiters:
            return False
        del self._pools[endpoint]
        pool.close()
        return True

    def pool_status(self, endpoint: Endpoint) -> PoolStatus:
        pool = self._pools.get(endpoint)
        return pool.status() if pool is not None else PoolStatus(0, 0, 0, 0)

    async def request(
        self, endpoint: Endpoint, method: bytes, path: bytes, headers: bytes, body: bytes
    ) -> UpstreamResponse:
        """Send one request and wait for the response head.

        `headers` are pre-encoded `name: value\\r\\n` lines (without Host/Content-Length).
        """
        pool = self._pool(endpoint)
        data = b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
            method,
            endpoint.base_path.encode() + path,
            endpoint.authority,
            len(body),
            headers,
            body,
        )
        for attempt in (0, 1):
            conn = await pool.acquire()
            try:
                conn.send(data)
                await conn.head()
            except UpstreamError as exc:
                conn.close()
                if (
                    attempt == 0
                    and conn.reused
                    and isinstance(exc, ConnectionReset)
                    and exc.before_response
                ):
                    continue  # the keep-alive race: the engine closed it before reading ours
                raise
            except BaseException:
                conn.close()
                raise
            return UpstreamResponse(conn, pool)
        raise AssertionError("unreachable")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            now = self.loop.time()
            for pool in self._pools.values():
                pool.sweep(now)

    async def close(self) -> None:
        self.closed = True
        self._sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._sweeper
        for pool in self._pools.values():
            pool.close()
