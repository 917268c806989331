"""The pure-ASGI fast path in front of FastAPI: the two proxy routes, and nothing else.

`POST /v1/chat/completions` and `POST /v1/completions` carry all the traffic, so they
skip Starlette's routing, Request and Response objects: this module reads the few
headers the driver (gateway/proxy.py) needs in one pass, streams the body in with its size limit and
deadline enforced while reading, and hands the driver a `Responder` that writes raw
ASGI messages. Every other path and method goes to the FastAPI app, which also documents
these two routes in /openapi.json (gateway/schemas.py), once gateway/guard.py has checked
its key from the head and read its body within the same limits.

A client that leaves must abort the engine request at once, also while the gateway is
still waiting for the engine's first byte. Under `fleetgate serve` the HTTP protocol
(gateway/protocol.py) cancels the request's task when the connection is lost; under any
other ASGI server, which says so only through `receive()` returning `http.disconnect`, a
watcher task waits on it once the body is read. Either way the driver's `finally`
blocks then release what they hold, and closing the upstream connection makes the
engine abort.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from gateway import guard, tracing
from gateway.errors import (
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
    UnsupportedMediaType,
)
from gateway.guard import ASGIApp, Message, Receive, Scope, Send
from gateway.openai_request import CHAT, COMPLETIONS
from gateway.responder import ClientGone, Responder

if TYPE_CHECKING:
    from gateway.link import ClientLink
    from gateway.runtime import Gateway

PROXY_PATHS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}
_IDENTITY = (b"", b"identity")


class RequestBody:
    """Reads one request body on demand, within `max_bytes` and `timeout_s`, then watches
    for the client leaving."""

    __slots__ = (
        "_encoding",
        "_length",
        "_link",
        "_receive",
        "_responder",
        "_task",
        "_watcher",
        "client_gone",
        "max_bytes",
        "slow",
        "timeout_s",
    )

    def __init__(
        self,
        receive: Receive,
        responder: Responder,
        length: bytes | None,
        encoding: bytes | None,
        max_bytes: int,
        timeout_s: float,
        link: ClientLink | None,
    ) -> None:
        self._receive = receive
        self._link = link
        self._responder = responder
        self._length = length
        self._encoding = encoding
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._watcher: asyncio.Task[None] | None = None
        self._task: asyncio.Task[Any] | None = None
        self.client_gone = False
        self.slow = False

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"request body larger than {self.max_bytes} bytes (limits.max_body_bytes)"
        )

    async def read(self) -> bytes:
        if self._encoding is not None and self._encoding.strip().lower() not in _IDENTITY:
            raise UnsupportedMediaType(
                f"Content-Encoding {self._encoding.decode('latin-1')!r} is not supported: "
                "send the JSON body uncompressed"
            )
        length = self._length
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            raise self._too_large()
        if self._link is not None and self._link.body_received:
            # all in already (the common case): no timer, and no coroutine of its own
            message = await self._receive()
            body = self._first_body(message)
            if message.get("more_body", False):
                body = await self._read_rest(body)
            elif len(body) > self.max_bytes:
                raise self._too_large()
        else:
            try:
                # the deadline covers the first message too: a head with no body byte
                # after it waited for ever
                async with asyncio.timeout(self.timeout_s):
                    body = await self._read_body()
            except TimeoutError:
                raise RequestTimeout(
                    f"request body not received within {self.timeout_s:g} s (limits.body_timeout_s)"
                ) from None
        if self._link is not None:
            self._link.watch()
        else:
            self._task = asyncio.current_task()
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return body

    async def _read_body(self) -> bytes:
        message = await self._receive()
        body = self._first_body(message)
        if message.get("more_body", False):
            return await self._read_rest(body)
        if len(body) > self.max_bytes:
            raise self._too_large()
        return body

    def _first_body(self, message: Message) -> bytes:
        """The body bytes of the first message (the whole body unless `more_body`)."""
        if message["type"] == "http.disconnect":
            self.client_gone = True
            raise ClientGone("client disconnected before sending its body")
        body: bytes = message.get("body", b"")
        return body

    async def _read_rest(self, first: bytes) -> bytes:
        parts = [first]
        total = len(first)
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.client_gone = True
                raise ClientGone("client disconnected while sending its body")
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                raise self._too_large()
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        # uvicorn also says "disconnect" once the response is complete: not a departure
        if not self._responder.finished and self._task is not None:
            self.client_gone = True
            self._task.cancel()

    @property
    def gone(self) -> bool:
        """The client left (or was cut): a cancellation of the request came from that."""
        return self.client_gone or (self._link is not None and self._link.gone)

    def client_blocked(self) -> bool:
        # uvicorn's own ASGI send waits while the client's buffer is full; only under
        # `fleetgate serve` can the fast path see that beforehand
        return self._link is None or self._link.write_paused

    def cut(self) -> None:
        """The client stopped reading for too long: end the request as if it had left."""
        if self._responder.finished:
            return
        self.slow = True
        if self._link is not None:
            self._link.cut()
        elif self._task is not None:
            self.client_gone = True
            self._task.cancel()

    def close(self) -> None:
        if self._link is not None:
            self._link.release()
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None


class ProxyRoutes:
    """The ASGI app `create_app` returns: the fast path for the proxy routes, FastAPI for
    the rest (and for every non-HTTP scope, lifespan included)."""

    def __init__(self, api: ASGIApp, gateway: Gateway) -> None:
        self.api = api
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            root: str = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root) :]
            endpoint = PROXY_PATHS.get(path)
            if endpoint is not None:
                await self._proxy(scope, receive, send, endpoint)
                return
        if scope["type"] == "http":
            await guard.serve(self.api, self.gateway, scope, receive, send)
            return
        await self.api(scope, receive, send)

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> None:
        gateway = self.gateway
        driver = gateway.driver
        if driver is None or gateway.draining:
            await _refuse(send, gateway.draining)
            return
        auth = rid = length = encoding = None
        session = temperature = overlap = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value
            elif name == b"x-request-id":
                rid = value
            elif name == b"content-length":
                length = value
            elif name == b"content-encoding":
                encoding = value
            elif name[:12] == b"x-fleetgate-":  # cache-aware routing (gateway/cache_routing.py)
                if name == b"x-fleetgate-session":
                    session = value
                elif name == b"x-fleetgate-router-temperature":
                    temperature = value
                elif name == b"x-fleetgate-overlap-weight":
                    overlap = value
        extensions = scope.get("extensions")
        link = extensions.get("fleetgate.link") if extensions else None
        responder = Responder(send, link)
        limits = self.gateway.config.limits
        body = RequestBody(
            receive, responder, length, encoding, limits.max_body_bytes, limits.body_timeout_s, link
        )
        if tracing.ON:  # the client's trace context, which the request's span continues
            tracing.incoming(scope["headers"])
        try:
            await driver.handle(
                body, auth, rid, responder, endpoint, (session, temperature, overlap)
            )
        except (asyncio.CancelledError, ClientGone):
            if not body.gone:
                raise
            # the client left (or stopped reading): nobody to answer; uvicorn closes
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                task.uncancel()
        finally:
            body.close()


async def _refuse(send: Send, draining: bool) -> None:
    if draining:
        err = ServiceUnavailable(
            "the gateway is shutting down; retry on another replica", code="shutting_down"
        )
    else:
        err = ServiceUnavailable(
            "the gateway is not started: serve it with an ASGI server that runs its lifespan",
            code="not_started",
        )
    err.retry_after = 1
    body = err.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        *err.headers(),
    ]
    if draining:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
