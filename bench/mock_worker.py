"""A fast stand-in for one vLLM worker, for measuring what the gateway adds.

Every answer is fixed and encoded once at start, so the mock's cost per request is one
httptools parse, one regex search and a few socket writes; it must stay far cheaper than
anything it is compared with (it shares a core with the load generator).

- `POST /v1/chat/completions`, `POST /v1/completions`:
  - non-streaming: a small fixed `chat.completion` / `text_completion` with `usage`;
  - `"stream": true`: `--chunks` SSE events (chat: role, content..., finish), one socket
    write per event as an engine flushes per token, then `data: [DONE]`; with
    `"stream_options": {"include_usage": true}` a usage event `{"choices":[],"usage":{..}}`
    comes before `[DONE]` (vLLM's shape, WIRE_SPEC §4), since the gateway asks for it.
    The request body is not parsed as JSON: two regex searches find the two flags.
- `GET /health`: 200, empty body (both engines); `GET /metrics`: a few `vllm:` gauges so
  the gateway's scraper sees a healthy idle worker; `GET /v1/models`: the one model.
- anything else: 404; a malformed request: 400 and the connection is closed.

Failure posture: none needed: no state, no delays, no timeouts; keep-alive and pipelined
requests are served in order. Uses uvloop when importable.

    python bench/mock_worker.py --port 9000 [--chunks 20] [--model mock]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time

import httptools

_STREAM = re.compile(rb'"stream"\s*:\s*true')
_USAGE = re.compile(rb'"include_usage"\s*:\s*true')
_PROMPT, _COMPLETION_TOKENS = 12, 20  # the usage every answer reports


def _response(body: bytes, status: bytes = b"200 OK", ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        ctype,
        len(body),
        body,
    )


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _frame(event: bytes) -> bytes:
    """One SSE event in chunked transfer framing."""
    data = b"data: " + event + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


class Answers:
    """Every byte the mock ever sends, encoded once."""

    def __init__(self, model: str, chunks: int) -> None:
        created = int(time.time())
        usage = {
            "prompt_tokens": _PROMPT,
            "total_tokens": _PROMPT + _COMPLETION_TOKENS,
            "completion_tokens": _COMPLETION_TOKENS,
        }
        text = "Hello! This is a fixed reply from the fleetgate bench mock worker."
        common = {"created": created, "model": model}
        self.chat = _response(
            _dumps(
                {
                    "id": "chatcmpl-mock",
                    "object": "chat.completion",
                    **common,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
            )
        )
        self.text = _response(
            _dumps(
                {
                    "id": "cmpl-mock",
                    "object": "text_completion",
                    **common,
                    "choices": [
                        {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}
                    ],
                    "usage": usage,
                }
            )
        )
        chat_base = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", **common}
        text_base = {"id": "cmpl-mock", "object": "text_completion", **common}
        self.chat_frames: list[bytes] = []
        self.text_frames: list[bytes] = []
        for i in range(chunks):
            last = i == chunks - 1
            finish = "stop" if last else None
            if i == 0:
                delta: dict[str, str] = {"role": "assistant", "content": ""}
            else:
                delta = {} if last else {"content": f"tok{i} "}
            self.chat_frames.append(
                _frame(
                    _dumps(
                        {
                            **chat_base,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": delta,
                                    "logprobs": None,
                                    "finish_reason": finish,
                                }
                            ],
                        }
                    )
                )
            )
            self.text_frames.append(
                _frame(
                    _dumps(
                        {
                            **text_base,
                            "choices": [
                                {
                                    "index": 0,
                                    "text": "" if last else f"tok{i} ",
                                    "logprobs": None,
                                    "finish_reason": finish,
                                }
                            ],
                        }
                    )
                )
            )
        self.chat_usage = _frame(_dumps({**chat_base, "choices": [], "usage": usage}))
        self.text_usage = _frame(_dumps({**text_base, "choices": [], "usage": usage}))
        self.done = _frame(b"[DONE]") + b"0\r\n\r\n"
        self.stream_head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        self.health = _response(b"")
        gauges = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{model}"}} 0.0\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{model}"}} 0.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{model_name="{model}"}} 0.0\n'
        )
        self.metrics = _response(gauges.encode(), ctype=b"text/plain; version=0.0.4")
        self.models = _response(
            _dumps(
                {
                    "object": "list",
                    "data": [
                        {"id": model, "object": "model", "created": created, "owned_by": "vllm"}
                    ],
                }
            )
        )
        self.not_found = _response(
            b'{"error":{"message":"not found","type":"NotFoundError","code":404}}',
            b"404 Not Found",
        )
        self.bad_request = _response(b'{"error":"bad request"}', b"400 Bad Request")


class _MockConnection(asyncio.Protocol):
    __slots__ = ("answers", "body", "parser", "transport", "url")

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.write(self.answers.bad_request)
                self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        t = self.transport
        if t is None:
            return
        a = self.answers
        path = self.url.split(b"?", 1)[0]
        method = self.parser.get_method()
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            chat = path == b"/v1/chat/completions"
            body = b"".join(self.body)
            if _STREAM.search(body) is None:
                t.write(a.chat if chat else a.text)
            else:
                t.write(a.stream_head)
                for frame in a.chat_frames if chat else a.text_frames:
                    t.write(frame)
                if _USAGE.search(body) is not None:
                    t.write(a.chat_usage if chat else a.text_usage)
                t.write(a.done)
        elif method in (b"GET", b"HEAD") and path == b"/health":
            t.write(a.health)
        elif method == b"GET" and path == b"/metrics":
            t.write(a.metrics)
        elif method == b"GET" and path == b"/v1/models":
            t.write(a.models)
        else:
            t.write(a.not_found)
        if not self.parser.should_keep_alive():
            t.close()


async def serve(host: str, port: int, answers: Answers) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _MockConnection(answers), host, port, backlog=1024, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"mock worker on http://{host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000, help="0: any free port (printed)")
    p.add_argument(
        "--chunks", type=int, default=20, help="SSE events per stream before usage/[DONE]"
    )
    p.add_argument("--model", default="mock", help="the model name in answers and /v1/models")
    args = p.parse_args(argv)
    answers = Answers(args.model, max(2, args.chunks))
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency where it exists
        runner = asyncio.run
    try:
        runner(serve(args.host, args.port, answers))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
