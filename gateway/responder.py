"""The one response to one proxied request, written as raw ASGI messages.

The fast path builds no Starlette Request or Response: a whole answer is two `send`
calls with a content-length; a stream is a start, one body message per relayed read,
and an empty last message. uvicorn applies write backpressure inside `send` (it waits
while the client's socket buffer is full), so `write` waits for a slow reader.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Headers = list[tuple[bytes, bytes]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Responder:
    __slots__ = ("_send", "finished", "started", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
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
        headers.append((b"content-length", b"%d" % len(body)))
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})

    async def start_stream(self, status: int, headers: Headers) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, chunk: bytes) -> None:
        """One piece of a streamed body; waits while the client is not reading."""
        if chunk:
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end_stream(self) -> None:
        if not self.finished:
            self.finished = True
            await self._send({"type": "http.response.body", "body": b""})


class ClientGone(ConnectionError):
    """The client went away (or was cut for not reading); nobody is left to answer."""
