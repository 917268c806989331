"""An aiohttp-client adapter with the interface of gateway/upstream.py's UpstreamClient, for
one benchmark question only: what would the gateway cost with aiohttp's client instead of
its own? (The HTTP-edge issue keeps the own client only if it is cheaper and passes the
upstream conformance suite.) Not used by the gateway.

    python -c "import bench.aiohttp_upstream as a; a.install(); \\
        from fleetgate.cli import main; main(['serve', '--upstream', URL, '--model', 'mock'])"

`install()` swaps the class the gateway builds at start; everything else is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

from gateway.upstream import Endpoint, Timeouts
from gateway.upstream_errors import ConnectFailed, ConnectionReset, IdleTimeout


class _Response:
    __slots__ = ("_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = [(k.lower(), v) for k, v in resp.raw_headers]

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    async def read(self, max_bytes: int | None = None) -> bytes:
        try:
            return await self._resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ConnectionReset(str(exc), before_response=False) from None

    async def next_chunk(self) -> bytes | None:
        try:
            data, _ = await self._resp.content.readchunk()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise IdleTimeout(str(exc), before_response=False) from None
        return data or None

    def suspend_for_client(self, write_timeout_s: float, on_expire: Callable[[], object]) -> None:
        pass

    def resume_from_client(self) -> None:
        pass

    def release(self) -> None:
        self._resp.release()


class AiohttpUpstreamClient:
    def __init__(
        self,
        timeouts: Timeouts | None = None,
        *,
        max_connections_per_worker: int = 512,
        max_response_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        t = timeouts or Timeouts()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=max_connections_per_worker),
            timeout=aiohttp.ClientTimeout(sock_connect=t.connect, sock_read=t.idle),
            auto_decompress=False,
        )
        self._urls: dict[Endpoint, str] = {}

    async def request(
        self, endpoint: Endpoint, method: bytes, path: bytes, headers: bytes, body: bytes
    ) -> _Response:
        base = self._urls.get(endpoint)
        if base is None:
            scheme = "https" if endpoint.tls else "http"
            base = self._urls[endpoint] = f"{scheme}://{endpoint.host}:{endpoint.port}"
        hdrs = {}
        for line in headers.split(b"\r\n"):
            if line:
                k, _, v = line.partition(b":")
                hdrs[k.decode()] = v.strip().decode()
        try:
            resp = await self._session.request(
                method.decode(), base + endpoint.base_path + path.decode(), data=body, headers=hdrs
            )
        except aiohttp.ClientConnectorError as exc:
            raise ConnectFailed(str(exc), before_response=True) from None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ConnectionReset(str(exc), before_response=True) from None
        return _Response(resp)

    async def close(self) -> None:
        await self._session.close()


def install() -> None:
    import gateway.runtime

    gateway.runtime.UpstreamClient = AiohttpUpstreamClient  # type: ignore[misc,assignment]
