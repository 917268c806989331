"""The connection a proxied request came on, as the fast path sees it under
`fleetgate serve` (`scope["extensions"]["fleetgate.link"]`; gateway/protocol.py makes one
per request). Under any other ASGI server there is no link and the fast path speaks
plain ASGI; with one it gets three things plain ASGI cannot give cheaply:

- **departure**: the protocol cancels the request's task when the connection is lost
  (plain ASGI says so only through `receive()`, which costs a watcher task per request);
- **backpressure seen beforehand**: `write_paused` says the next write will wait for the
  client, so the relay pauses the engine's idle timer only then;
- **one write per answer** (when no middleware wraps the app's `send`): `respond` writes
  the status line, headers and body in one transport write, and a stream's chunks are
  framed here, where uvicorn's ASGI `send` writes head and body separately and
  re-validates every header with two regexes. The
  fast path's headers need no validation: fixed names, values it made itself (request
  ids are printable ASCII, pool and worker names are checked at start) or that llhttp
  parsed from the engine (no CR or LF can be in them).

The cycle bookkeeping (`response_started`, `response_complete`, keep-alive, the next
pipelined request) is uvicorn's, done as its `send` does it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

Headers = list[tuple[bytes, bytes]]


class Connection(Protocol):
    """What a link uses of its connection's protocol (gateway/protocol.py's
    `GatewayHttpProtocol`, which makes the links: described here, so that this module
    does not import the one that imports it)."""

    @property
    def watched(self) -> set[ClientLink]: ...

    @property
    def transport(self) -> asyncio.Transport: ...

    @property
    def flow(self) -> FlowControl: ...


class ClientLink:
    __slots__ = ("_cycle", "_protocol", "gone", "task")

    def __init__(self, protocol: Connection) -> None:
        self._protocol = protocol
        self._cycle: RequestResponseCycle | None = None  # set when the request's cycle exists
        self.task: asyncio.Task[Any] | None = None  # the request's task, once started
        self.gone = False

    # --- departure ----------------------------------------------------------------------
    def watch(self) -> None:
        """Cancel the request's task if the connection is lost before `release`."""
        self._protocol.watched.add(self)

    def release(self) -> None:
        """The request is done with its link. Also breaks the link ↔ cycle reference loop
        (the link sits in the cycle's scope), so both are freed at once rather than by the
        cyclic collector (measured: 650 requests' worth lingering until a full collection)."""
        self._protocol.watched.discard(self)
        self._cycle = None
        self.task = None

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

    @property
    def body_received(self) -> bool:
        """The whole request body has arrived: reading it cannot wait (no deadline needed)."""
        cycle = self._cycle
        return cycle is not None and not cycle.more_body

    @property
    def write_paused(self) -> bool:
        """The client's socket buffer is full: the next write will wait for it."""
        return self._protocol.flow.write_paused

    # --- writing ------------------------------------------------------------------------
    def direct(self, send: object) -> bool:
        """Whether answers may bypass uvicorn's ASGI send: only when the app was handed that
        send itself — a middleware wrapping the gateway (CORS, the user's own) wraps send
        and must see every message; not with uvicorn's access log on, which that send
        writes; not for HTTP/1.0, whose streams uvicorn frames its own way."""
        cycle = self._cycle
        return (
            cycle is not None
            and send == cycle.send
            and not cycle.access_log
            and cycle.scope["http_version"] == "1.1"
            and not cycle.response_started
        )

    def _head(self, cycle: RequestResponseCycle, status: int, headers: Headers) -> list[bytes]:
        parts = [STATUS_LINE[status]]
        for name, value in cycle.default_headers:
            parts += (name, b": ", value, b"\r\n")
        for name, value in headers:
            if name == b"connection" and value == b"close":
                cycle.keep_alive = False
            parts += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        return parts

    def respond(self, status: int, headers: Headers, body: bytes) -> None:
        """A whole answer in one write (nothing is written if the client left)."""
        cycle = self._cycle
        assert cycle is not None
        parts = self._head(cycle, status, headers)
        parts += (b"content-length: %d\r\n\r\n" % len(body), body)
        if not cycle.disconnected:
            self._protocol.transport.write(b"".join(parts))
        self._complete(cycle)

    def start_stream(self, status: int, headers: Headers) -> None:
        cycle = self._cycle
        assert cycle is not None
        parts = self._head(cycle, status, headers)
        parts.append(b"transfer-encoding: chunked\r\n\r\n")
        if not cycle.disconnected:
            self._protocol.transport.write(b"".join(parts))

    async def write_chunk(self, chunk: bytes) -> None:
        protocol = self._protocol
        if protocol.flow.write_paused and not self._cycle.disconnected:  # type: ignore[union-attr]
            await protocol.flow.drain()
        if not self._cycle.disconnected:  # type: ignore[union-attr]
            protocol.transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))

    def end_stream(self) -> None:
        cycle = self._cycle
        assert cycle is not None
        if not cycle.disconnected:
            self._protocol.transport.write(b"0\r\n\r\n")
        self._complete(cycle)

    def _complete(self, cycle: RequestResponseCycle) -> None:
        # what uvicorn's send does once the last body message is written
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self._protocol.transport.close()
        cycle.on_response()
