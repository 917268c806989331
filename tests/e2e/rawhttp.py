"""Raw-socket HTTP/1.1 for the edge tests: write exactly the bytes a test means, read the
answers with the standard library's response parser (it skips 1xx, handles chunked,
close-delimited and HEAD answers), several from one connection when pipelined."""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    version: int


class _Shared:
    """The connection's buffered reader, which a finished HTTPResponse must not close."""

    def __init__(self, f):
        self._f = f

    def __getattr__(self, name: str):
        return getattr(self._f, name)

    def close(self) -> None:
        pass


class _FileSocket:
    """What http.client.HTTPResponse needs: one shared buffered file per connection."""

    def __init__(self, f):
        self._f = _Shared(f)

    def makefile(self, mode: str):
        return self._f


class Conn:
    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, method: str = "GET") -> Answer:
        r = http.client.HTTPResponse(_FileSocket(self.file), method=method)  # type: ignore[arg-type]
        r.begin()
        body = r.read()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, body, r.version)

    def closed_by_peer(self) -> bool:
        """True once the server has closed the connection (reads give EOF)."""
        try:
            return self.file.read(1) == b""
        except (ConnectionResetError, TimeoutError):
            return True

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request(
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    length: bool = True,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1"]
    for k, v in (headers or {}).items():
        lines.append(f"{k}: {v}")
    if body and length:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n\r\n"
