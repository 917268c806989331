"""The one response to one proxied request.

The fast path builds no Starlette Request or Response. Under any ASGI server a whole
answer is two `send` calls with a content-length, and a stream is a start, one body
message per relayed read and an empty last message; uvicorn applies write backpressure
inside `send` (it waits while the client's socket buffer is full). Under `fleetgate
serve` the request's `ClientLink` (gateway/link.py) writes the same bytes with one
transport write per answer or chunk instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.link import ClientLink

Headers = list[tuple[bytes, bytes]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Responder:
    __slots__ = ("_link", "_send", "finished", "started", "status")

    def __init__(self, send: Send, link: ClientLink | None = None) -> None:
        self._send = send
        self._link = link if link is not None and link.direct(send) else None
        self.started = False
        self.finished = False
        self.status = 0

    async def send(self, status: int, headers: Headers, body: bytes) -> None:
        """A whole answer."""
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.finished = True
        self.status = status
        if self._link is not None:
            self._link.respond(status, headers, body)
            return
        headers.append((b"content-length", b"%d" % len(body)))
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    async def start_stream(self, status: int, headers: Headers) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        if self._link is not None:
            self._link.start_stream(status, headers)
            return
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, chunk: bytes) -> None:
        """One piece of a streamed body; waits while the client is not reading."""
        if not chunk:
            return
        if self._link is not None:
            await self._link.write_chunk(chunk)
            return
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end_stream(self) -> None:
        if not self.finished:
            self.finished = True
            if self._link is not None:
                self._link.end_stream()
                return
            await self._send({"type": "http.response.body", "body": b""})


class ClientGone(ConnectionError):
    """The client went away (or was cut for not reading); nobody is left to answer."""
