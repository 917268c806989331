"""An HTTP/1.1 "engine" that misbehaves on request, for the upstream client's conformance
tests. Raw asyncio, loopback only.

In process::

    engine = MisbehavingEngine()
    port = await engine.start()
    ...
    await engine.close()

As a separate process (prints ``listening on PORT`` once ready)::

    python -m tests.misbehaving_engine --port 0 --mode normal

The behaviour is chosen per request: the ``x-misbehave`` header, else a ``misbehave``
query parameter, else the server's default mode. Parameters come the same way
(``x-misbehave-n`` / ``?n=``, ``x-misbehave-delay`` / ``?delay=``, ``x-misbehave-size`` /
``?size=``). A request body that is JSON with ``"stream": true`` gets an SSE answer in
the modes that can answer either way.

POST /tokenize answers 404 (no tokenizer; not counted as a request). GET requests always
answer normally (`/health` 200, `/stats` the connection counts:
open, peak, total, busy and peak_busy = connections answering a POST at once;
`/stats/window` the same, then peak_busy starts again from busy), so a
gateway's health checks and scrapes see a healthy engine; the modes apply to POSTs.

Modes:
- normal: a chat.completion JSON (content-length), or for a stream an SSE answer (chunked)
  of n chunks + a usage chunk + ``data: [DONE]``;
- early-hints: ``103 Early Hints`` (with link headers) and ``100 Continue``, then normal;
- continue: ``100 Continue``, then normal;
- unsolicited: normal, then after ``delay`` s a whole bogus response on the idle
  connection (the connection keeps serving requests afterwards);
- unsolicited-inline: normal with a bogus response in the same write;
- header-flood: a status line, then header lines forever;
- big-header: one header of ``size`` bytes (default 1 MiB), then a normal JSON answer;
- close-json / close-sse: no content-length, no chunked, ``connection: close``: the body
  ends when the server closes (written in pieces ``delay`` s apart);
- sse-crlf / sse-cr / sse-mixed: an SSE answer framed with CRLF CRLF, CR CR, or a mix;
- slow-sse: n SSE chunks ``delay`` s apart;
- long-sse: n SSE chunks of about ``size`` bytes each, as fast as the client reads;
- huge-body: a non-streamed body of ``size`` bytes with content-length;
- huge-chunked: the same, chunked;
- silent: read the request, never answer;
- drop: read the request and close the connection without a byte of answer (an engine
  process dying under it: the gateway may retry on another worker); with `drop` as the
  server's mode, /metrics shows an idle vLLM engine, so scrapes keep it fresh.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

MODES = (
    "normal",
    "early-hints",
    "continue",
    "unsolicited",
    "unsolicited-inline",
    "header-flood",
    "big-header",
    "close-json",
    "close-sse",
    "sse-crlf",
    "sse-cr",
    "sse-mixed",
    "slow-sse",
    "long-sse",
    "huge-body",
    "huge-chunked",
    "silent",
    "drop",
)
FRAMINGS = {"lf": b"\n\n", "crlf": b"\r\n\r\n", "cr": b"\r\r"}
BOGUS = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 5\r\n\r\nWRONG"
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def completion_json(content: str = "hello") -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-mis",
            "object": "chat.completion",
            "created": 0,
            "model": "mis",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": USAGE,
        },
        separators=(",", ":"),
    ).encode()


def sse_events(n: int, framing: str = "lf", pad: int = 0) -> list[bytes]:
    """The events of one streamed answer: n content chunks, a usage chunk, [DONE].

    framing: lf | crlf | cr | mixed (rotating through the three)."""
    seps = list(FRAMINGS.values())
    out = []
    payloads = [
        json.dumps(
            {
                "id": "chatcmpl-mis",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": f"tok{i} " + "x" * pad}}],
            },
            separators=(",", ":"),
        ).encode()
        for i in range(n)
    ]
    payloads.append(
        json.dumps(
            {
                "id": "chatcmpl-mis",
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {**USAGE, "completion_tokens": n},
            },
            separators=(",", ":"),
        ).encode()
    )
    payloads.append(b"[DONE]")
    for i, p in enumerate(payloads):
        sep = seps[i % 3] if framing == "mixed" else FRAMINGS[framing]
        out.append(b"data: " + p + sep)
    return out


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    mode: str = "normal"
    params: dict[str, str] = field(default_factory=dict)

    def param(self, name: str, default: float) -> float:
        value = self.headers.get(f"x-misbehave-{name}") or self.params.get(name)
        return float(value) if value else default

    @property
    def stream(self) -> bool:
        try:
            return bool(json.loads(self.body).get("stream"))
        except (ValueError, AttributeError):
            return False


class MisbehavingEngine:
    def __init__(
        self, mode: str = "normal", host: str = "127.0.0.1", params: dict[str, str] | None = None
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        self.mode = mode
        self.params = params or {}  # default parameters (n, delay, size) of every request
        self.host = host
        self.port = 0
        self.open_connections = 0
        self.peak_connections = 0
        self.busy = 0  # connections answering a POST right now
        self.peak_busy = 0
        self.total_connections = 0
        self.requests: list[Request] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, port: int = 0) -> int:
        self._server = await asyncio.start_server(self._serve, self.host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open_connections += 1
        self.total_connections += 1
        self.peak_connections = max(self.peak_connections, self.open_connections)
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                req = await self._read_request(reader)
                if req is None:
                    break
                if req.method == "GET":
                    self._control(req, writer)
                    continue
                if req.path == "/tokenize":
                    # no tokenizer here (as an engine without the endpoint): a gateway's
                    # `tokenizer: auto` probe falls back to counting locally; not a request
                    body = b'{"detail":"Not Found"}'
                    writer.write(
                        b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body)
                    )
                    continue
                self.requests.append(req)
                self.busy += 1
                self.peak_busy = max(self.peak_busy, self.busy)
                try:
                    more = await self._answer(req, reader, writer)
                finally:
                    self.busy -= 1
                if not more:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self.open_connections -= 1
            self._writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            if not writer.transport.is_closing():
                writer.close()

    def _control(self, req: Request, w: asyncio.StreamWriter) -> None:
        """GETs always behave (health checks and scrapes see a healthy idle engine):
        /health → 200 empty; /stats → the connection counts; anything else → 200 empty."""
        body = b""
        if req.path in ("/stats", "/stats/window"):
            stats = {
                "open": self.open_connections,
                "peak": self.peak_connections,
                "total": self.total_connections,
                "busy": self.busy,
                "peak_busy": self.peak_busy,
                "requests": len(self.requests),
            }
            body = json.dumps(stats).encode()
            if req.path == "/stats/window":
                # peak_busy since the last window read: a fault test's per-phase oracle
                self.peak_busy = self.busy
        elif req.path == "/metrics" and self.mode == "drop":
            # a dying engine's last scrape looked idle: it stays fresh in routing's eyes
            body = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        w.write(_json_head(len(body)) + body)

    async def _read_request(self, reader: asyncio.StreamReader) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        parts = urlsplit(target)
        params = {**self.params, **dict(parse_qsl(parts.query))}
        mode = headers.get("x-misbehave") or params.get("misbehave") or self.mode
        return Request(method, parts.path, headers, body, mode, params)

    async def _answer(
        self, req: Request, reader: asyncio.StreamReader, w: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; False: the connection is done."""
        mode = req.mode
        n = int(req.param("n", 5))
        delay = req.param("delay", 0.05)
        size = int(req.param("size", 1024 * 1024))
        if mode == "silent":
            await reader.read()  # until the client closes
            return False
        if mode == "drop":
            return False
        if mode in ("early-hints", "continue"):
            if mode == "early-hints":
                w.write(
                    b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n"
                    b"link: </app.js>; rel=preload\r\n\r\n"
                )
                await w.drain()
            w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await w.drain()
            await asyncio.sleep(0.01)
            return await self._normal(req, w, n)
        if mode == "unsolicited":
            ok = await self._normal(req, w, n)
            await asyncio.sleep(delay)
            w.write(BOGUS)
            await w.drain()
            return ok
        if mode == "unsolicited-inline":
            body = completion_json()
            w.write(_json_head(len(body)) + body + BOGUS)
            await w.drain()
            return True
        if mode == "header-flood":
            w.write(b"HTTP/1.1 200 OK\r\n")
            i = 0
            while True:
                w.write(b"".join(b"x-flood-%d: %s\r\n" % (i + j, b"v" * 40) for j in range(256)))
                i += 256
                await w.drain()
        if mode == "big-header":
            body = completion_json()
            w.write(
                b"HTTP/1.1 200 OK\r\nx-big: %s\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (b"a" * size, len(body), body)
            )
            await w.drain()
            return True
        if mode in ("close-json", "close-sse"):
            if mode == "close-json":
                ctype, body = b"application/json", completion_json()
                pieces = [body[: len(body) // 2], body[len(body) // 2 :]]
            else:
                ctype, pieces = b"text/event-stream", sse_events(n)
            w.write(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\nconnection: close\r\n\r\n" % ctype)
            for piece in pieces:
                await asyncio.sleep(delay)
                w.write(piece)
                await w.drain()
            w.close()
            with contextlib.suppress(ConnectionError):
                await w.wait_closed()
            return False
        if mode in ("sse-crlf", "sse-cr", "sse-mixed"):
            await self._sse(w, sse_events(n, mode[4:]), 0.0)
            return True
        if mode == "slow-sse":
            await self._sse(w, sse_events(n), delay)
            return True
        if mode == "long-sse":
            await self._sse(w, sse_events(n, pad=size), 0.0)
            return True
        if mode == "huge-body":
            w.write(_json_head(size))
            block = b"x" * 65536
            left = size
            while left > 0:
                w.write(block[: min(left, len(block))])
                left -= len(block)
                await w.drain()
            return True
        if mode == "huge-chunked":
            w.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            left = size
            while left > 0:
                w.write(_chunk(b"x" * min(left, 65536)))
                left -= 65536
                await w.drain()
            w.write(b"0\r\n\r\n")
            await w.drain()
            return True
        return await self._normal(req, w, n)

    async def _normal(self, req: Request, w: asyncio.StreamWriter, n: int) -> bool:
        if req.stream:
            await self._sse(w, sse_events(n), 0.0)
        else:
            body = completion_json()
            w.write(_json_head(len(body)) + body)
            await w.drain()
        return True

    async def _sse(self, w: asyncio.StreamWriter, events: list[bytes], delay: float) -> None:
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for event in events:
            if delay:
                await asyncio.sleep(delay)
            w.write(_chunk(event))
            await w.drain()
        w.write(b"0\r\n\r\n")
        await w.drain()


def _json_head(length: int) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % length
    )


async def _main(port: int, mode: str, params: dict[str, str]) -> None:
    engine = MisbehavingEngine(mode, params=params)
    actual = await engine.start(port)
    print(f"listening on {actual}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--mode", default="normal", choices=MODES)
    ap.add_argument(
        "--param", action="append", default=[], metavar="K=V", help="a default: n, delay, size"
    )
    args = ap.parse_args()
    params = dict(p.split("=", 1) for p in args.param)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.port, args.mode, params))


if __name__ == "__main__":
    main()
