"""Every route outside the two proxy routes, checked before any work is done for it.

The proxy routes' fast path (gateway/edge.py) authenticates from the request head and then
reads the body within `limits.max_body_bytes` (413) and `limits.body_timeout_s` (408).
Every other request gets the same here, before FastAPI sees it — FastAPI would read and
parse a whole body of any size, however slow, before a dependency checks the key:

1. the key the path needs, from the head: `/admin/entitlements…` the entitlements admin
   key, the rest of `/admin…` the admin key (403, also while those routes are disabled),
   `/v1/…` an API key whenever the proxy routes need one (401); the rest is open;
2. the body, read whole within the two limits; FastAPI is then handed it from memory.

A refusal made before the body is read closes the connection (`connection: close`):
the rest of the body is never read. The FastAPI routes keep the same checks as
dependencies (the same functions), for an app mounted without this front.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from gateway.errors import (
    AuthenticationFailed,
    GatewayError,
    PayloadTooLarge,
    PermissionDenied,
    RequestTimeout,
)

if TYPE_CHECKING:
    from gateway.runtime import Gateway

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def bearer(authorization: str) -> str:
    """The key of an `Authorization: Bearer <key>` header value ("" when there is none)."""
    return authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""


def admin_refusal(key: str | None, given: str) -> GatewayError | None:
    """The admin routes' check (`auth.admin_key`); closed while no key is configured."""
    if not key:
        return PermissionDenied(
            "admin routes are disabled: set auth.admin_key", code="admin_disabled"
        )
    if not hmac.compare_digest(given.encode(), key.encode()):
        return PermissionDenied("admin routes need the admin key", code="admin_key_required")
    return None


def entitlements_admin_refusal(key: str | None, given: str) -> GatewayError | None:
    """/admin/entitlements' own check (`auth.entitlements_admin_key`), closed likewise."""
    if not key:
        return PermissionDenied(
            "entitlement admin routes are disabled: set auth.entitlements_admin_key",
            code="admin_disabled",
        )
    if not hmac.compare_digest(given.encode(), key.encode()):
        return PermissionDenied(
            "entitlement admin routes need auth.entitlements_admin_key",
            code="admin_key_required",
        )
    return None


def api_key_refusal(gateway: Gateway, given: str) -> GatewayError | None:
    """The proxy routes' rule: a known key whenever any key is configured (`auth.api_keys`,
    `auth.keys` or an entitlement's own `keys`)."""
    if not gateway.config.auth_required or (given and gateway.key_ok(given)):
        return None
    return AuthenticationFailed(
        "unknown API key" if given else "missing API key: send 'Authorization: Bearer <key>'"
    )


def refusal(gateway: Gateway, path: str, given: str) -> GatewayError | None:
    """What a request for `path` carrying the key `given` is refused with, None if nothing."""
    auth = gateway.config.auth
    if path == "/admin/entitlements" or path.startswith("/admin/entitlements/"):
        return entitlements_admin_refusal(auth.entitlements_admin_key, given)
    if path == "/admin" or path.startswith("/admin/"):
        return admin_refusal(auth.admin_key, given)
    if path.startswith("/v1/"):
        return api_key_refusal(gateway, given)
    return None


async def serve(api: ASGIApp, gateway: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    """Check an HTTP request for a route outside the proxy routes, read its body within the
    limits, then let `api` (FastAPI) answer it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    authorization = length = b""
    chunked = False
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value
        elif name == b"content-length":
            length = value
        elif name == b"transfer-encoding":
            chunked = True
    err = refusal(gateway, path, bearer(authorization.decode("latin-1")))
    limits = gateway.config.limits
    if err is None and length.isdigit() and int(length) > limits.max_body_bytes:
        err = _too_large(limits.max_body_bytes)
    if err is not None:
        # a body not read: close rather than read it (a request without one keeps its
        # connection)
        await _refuse(send, err, close=chunked or length.strip(b"0") != b"")
        return
    try:
        body = await _read(receive, limits.max_body_bytes, limits.body_timeout_s)
    except GatewayError as exc:
        await _refuse(send, exc, close=True)
        return
    if body is None:
        return  # the client left before its body was in: nobody to answer
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()  # from here on: the client leaving
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    await api(scope, replay, send)


def _too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body larger than {max_bytes} bytes (limits.max_body_bytes)")


async def _read(receive: Receive, max_bytes: int, timeout_s: float) -> bytes | None:
    """The whole body within `max_bytes` and `timeout_s` (None: the client left)."""
    parts: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk: bytes = message.get("body", b"")
                total += len(chunk)
                if total > max_bytes:
                    raise _too_large(max_bytes)
                parts.append(chunk)
                if not message.get("more_body", False):
                    return parts[0] if len(parts) == 1 else b"".join(parts)
    except TimeoutError:
        raise RequestTimeout(
            f"request body not received within {timeout_s:g} s (limits.body_timeout_s)"
        ) from None


async def _refuse(send: Send, err: GatewayError, *, close: bool) -> None:
    body = err.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        *err.headers(),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
