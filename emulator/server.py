"""The emulator's HTTP face: vLLM 0.33 or SGLang 0.5.23 routes over the engine driver.

Routes per personality follow WIRE_SPEC §1 (generation in emulator/generate.py). The
cross-cutting behaviour lives in middlewares, outermost first:
- `_instrument` (vLLM): http_* metrics as prometheus-fastapi-instrumentator records them.
- `_frame`: aiohttp's 404/405 become FastAPI's `{"detail":"Not Found"}` /
  `{"detail":"Method Not Allowed"}`; an `ApiError` becomes the personality's error body;
  anything unexpected a 500 in the personality's shape; `Server: uvicorn` like both.
- `_auth`: with --api-key, vLLM guards /v1… only, SGLang everything but /health*, /metrics;
  failure → 401 `{"error":"Unauthorized"}`.
POST bodies must be `application/json` (else 400) and parse (else 400, never 422).

The server runs with aiohttp's handler cancellation on, so a client that disconnects
while waiting for a non-streamed answer cancels its handler, which aborts its engine
requests (vLLM does the same).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from emulator.chat_template import decode, render_chat, render_completion
from emulator.config import EmulatorConfig
from emulator.dp_engine import DpEngine
from emulator.driver import Event
from emulator.engine import Engine, EngineRequest
from emulator.generate import generate
from emulator.kv_events import Publisher
from emulator.metrics import RequestTag
from emulator.pd import add_pd
from emulator.routes_sglang import sglang_routes
from emulator.schema import ApiError, FieldError, SchemaError, sglang_error, vllm_error
from emulator.state import EMU, PINNED_RANK, Emulator, build_state

log = logging.getLogger("emulator.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(emu: Emulator, err: ApiError) -> web.Response:
    return web.Response(
        body=emu.wire.error(err), status=err.status, content_type="application/json"
    )


# -- middlewares ------------------------------------------------------------------------


@web.middleware
async def _frame(request: web.Request, handler: Handler) -> web.StreamResponse:
    emu = request.app[EMU]
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, 404)
    except web.HTTPMethodNotAllowed as exc:
        resp = _json({"detail": "Method Not Allowed"}, 405)
        resp.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return resp
    except ApiError as err:
        return _error(emu, err)
    except SchemaError as exc:
        return _error(emu, vllm_error(exc) if emu.vllm else sglang_error(exc))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except web.HTTPException:
        raise
    except Exception as exc:
        log.exception("unhandled error on %s", request.path)
        msg = "Internal server error" if emu.vllm else f"Internal server error: {exc}"
        return _error(emu, ApiError(500, msg, "InternalServerError"))


@web.middleware
async def _instrument(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost, so it sees the final status of every answer (a vanished client: none)."""
    t0 = time.perf_counter()
    resp = await handler(request)
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "none"
    size = resp.body_length if resp.prepared else len(getattr(resp, "body", b"") or b"")
    request.app[EMU].metrics.on_http(
        route,
        request.method,
        resp.status,
        request.content_length or 0,
        size,
        time.perf_counter() - t0,
    )
    return resp


_VLLM_GUARDED = ("/v1", "/v2", "/inference", "/cohere")


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    emu = request.app[EMU]
    key = emu.cfg.api_key
    if key and request.method != "OPTIONS":
        path = request.path
        guarded = (
            path.startswith(_VLLM_GUARDED)
            if emu.vllm
            else not path.startswith(("/health", "/metrics"))
        )
        if guarded and request.headers.get("Authorization") != f"Bearer {key}":
            return _json({"error": "Unauthorized"}, 401)
    return await handler(request)


async def _on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "uvicorn"


# -- request bodies ---------------------------------------------------------------------


async def read_json(request: web.Request, emu: Emulator) -> Any:
    media = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        if emu.vllm:
            raise ApiError(
                400,
                "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                "Bad Request",
            )
        err = {
            "loc": ["header", "content-type"],
            "msg": "Unsupported Media Type: Only 'application/json' is allowed",
            "type": "value_error",
        }
        raise ApiError(400, f"1 validation error:\n  {err!r} {[err]!r}", "Bad Request")
    raw = await request.read()
    if not raw:
        raise SchemaError([FieldError("missing", ("body",), "Field required", None)])
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SchemaError(
                [
                    FieldError(
                        "json_invalid",
                        ("body", exc.pos),
                        "JSON decode error",
                        {},
                        {"error": exc.msg},
                    )
                ]
            ) from None
        except UnicodeDecodeError:
            raise SchemaError(
                [
                    FieldError(
                        "json_invalid",
                        ("body", 0),
                        "JSON decode error",
                        {},
                        {"error": "Invalid UTF-8"},
                    )
                ]
            ) from None


# -- handlers ---------------------------------------------------------------------------


def _gen(kind: str) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        emu = request.app[EMU]
        return await generate(request, emu, kind, await read_json(request, emu))

    return handle


async def _health(request: web.Request) -> web.Response:
    emu = request.app[EMU]
    if emu.fail_health:
        return web.Response(status=503)
    if emu.vllm:
        return web.Response(status=200)
    return web.Response(status=200 if await _health_generate(emu) else 503)


HEALTH_TIMEOUT = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT, wall seconds


async def _health_generate(emu: Emulator) -> bool:
    """SGLang's health check: a 1-token generation (input_ids=[0]) must come back."""
    queue: asyncio.Queue[Event] = asyncio.Queue()
    eid = "HEALTH_CHECK_" + emu.driver.new_id()
    emu.driver.submit(EngineRequest(eid, 1, 1, 1), queue, 0, RequestTag(False, 1, internal=True))
    try:
        async with asyncio.timeout(HEALTH_TIMEOUT):
            while True:
                _, _, fin = await queue.get()
                if fin is not None:
                    return True
    except TimeoutError:
        return False
    finally:
        emu.driver.abort(eid)


async def _ok(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    return _json({"version": request.app[EMU].cfg.version})


async def _models(request: web.Request) -> web.Response:
    emu = request.app[EMU]
    body = emu.wire.models(
        emu.cfg.served_names, emu.cfg.model_path, emu.info.max_model_len, int(time.time())
    )
    return web.Response(body=body, content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    emu = request.app[EMU]
    if not emu.vllm and not emu.cfg.enable_metrics:
        return _json({"detail": "Not Found"}, 404)
    engine = emu.driver.engine
    ranks = None
    # per-rank series, as the real engines export them (a per-rank port, from
    # --data-parallel-rank-ports, exports the whole group's too: one registry)
    if isinstance(engine, DpEngine):
        ranks = [engine.rank_stats(g) for g in range(len(engine.ranks))]
    body, ctype = emu.metrics.render(
        engine.stats, request.headers.get("Accept", ""), emu.driver.clock.wall_now(), ranks
    )
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = ctype
    return resp


async def _tokenize(request: web.Request) -> web.Response:
    emu = request.app[EMU]
    b = await read_json(request, emu)
    if not isinstance(b, dict):
        raise SchemaError(
            [
                FieldError(
                    "model_attributes_type", ("body",), "Input should be a valid dictionary", b
                )
            ]
        )
    if emu.vllm and b.get("model") and b["model"] not in emu.cfg.served_names:
        raise ApiError(404, f"The model `{b['model']}` does not exist. Valid aliases: "
                       f"{', '.join(emu.cfg.served_names)}.", "NotFoundError", "model")  # fmt: skip
    add_special = bool(b.get("add_special_tokens", True))
    if "messages" in b and emu.vllm:
        ids = render_chat(b["messages"], bool(b.get("add_generation_prompt", True)), b.get("tools"))
    elif "prompt" in b:
        prompt = b["prompt"]
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(x, str) for x in prompt)
            and not emu.vllm
        ):
            lists = [render_completion(x, add_special) for x in prompt]
            L = emu.info.max_model_len
            return _json({"tokens": lists, "count": [len(x) for x in lists], "max_model_len": L})
        if not isinstance(prompt, str):
            raise SchemaError(
                [
                    FieldError(
                        "string_type", ("body", "prompt"), "Input should be a valid string", prompt
                    )
                ]
            )
        ids = render_completion(prompt, add_special)
    else:
        field = "messages" if emu.vllm else "prompt"
        raise SchemaError([FieldError("missing", ("body", field), "Field required", b)])
    strs = [decode([t]) for t in ids] if b.get("return_token_strs") else None
    return web.Response(
        body=emu.wire.tokenize(ids, emu.info.max_model_len, strs), content_type="application/json"
    )


async def _detokenize(request: web.Request) -> web.Response:
    emu = request.app[EMU]
    b = await read_json(request, emu)
    tokens = b.get("tokens") if isinstance(b, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise SchemaError(
            [FieldError("list_type", ("body", "tokens"), "Input should be a valid list", tokens)]
        )
    try:
        text = decode(tokens)
    except ValueError as exc:
        raise ApiError(400, str(exc), "BadRequestError") from None
    return web.Response(body=emu.wire.detokenize(text), content_type="application/json")


# -- the app ----------------------------------------------------------------------------


def build_app(emu: Emulator) -> web.Application:
    middlewares = [_instrument, _frame, _auth] if emu.vllm else [_frame, _auth]
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
    app[EMU] = emu
    app.on_response_prepare.append(_on_prepare)
    r = app.router
    r.add_post("/v1/chat/completions", _gen("chat"))
    r.add_post("/v1/completions", _gen("completion"))
    r.add_get("/v1/models", _models, allow_head=False)
    r.add_get("/health", _health, allow_head=False)
    r.add_get("/metrics", _metrics, allow_head=False)
    r.add_post("/tokenize", _tokenize)
    r.add_post("/detokenize", _detokenize)
    if emu.vllm:
        r.add_get("/ping", _health, allow_head=False)
        r.add_post("/ping", _health)
        r.add_get("/version", _version, allow_head=False)
    else:
        r.add_get("/health_generate", _health, allow_head=False)
        r.add_get("/ping", _health, allow_head=False)
        r.add_get("/ready", _ok, allow_head=False)
        r.add_post("/v1/tokenize", _tokenize)
        r.add_post("/v1/detokenize", _detokenize)
        sglang_routes(r)
    if emu.cfg.pd is not None:
        add_pd(app)  # one side of a P/D pair (emulator/pd.py)
    return app


async def serve(cfg: EmulatorConfig, ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGTERM/SIGINT; `ready(url)` is called once the socket listens."""
    emu = build_state(cfg)
    warm_up()  # load the tokenizer before listening, as a real server loads its model
    publisher = _kv_events(emu, cfg)
    emu.driver.start()
    # Streams in flight get 1 s to end on SIGTERM (aiohttp would wait 60 s).
    runner = web.AppRunner(
        build_app(emu), handler_cancellation=True, access_log=None, shutdown_timeout=1.0
    )
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024, reuse_address=True)
    await site.start()
    runners = [runner]
    if cfg.dp_rank_ports is not None:  # one app per rank on the one lockstep group
        for g in range(cfg.dp.ranks):
            app = build_app(emu)
            app[PINNED_RANK] = g
            rank_runner = web.AppRunner(
                app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
            )
            await rank_runner.setup()
            port = cfg.dp_rank_ports + g
            await web.TCPSite(rank_runner, cfg.host, port, backlog=1024, reuse_address=True).start()
            runners.append(rank_runner)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, _toggle_health, emu)
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    url = f"http://{host}:{cfg.port}"
    if ready is not None:
        ready(url)
    try:
        await stop.wait()
    finally:
        for r in runners:
            await r.cleanup()
        await emu.driver.stop()
        if publisher is not None:
            publisher.close()


def _kv_events(emu: Emulator, cfg: EmulatorConfig) -> Publisher | None:
    """--kv-events-config: the engine tells its cache's changes, published every step."""
    engine = emu.driver.engine
    if cfg.kv_events is None or not isinstance(engine, Engine):
        return None
    publisher = Publisher(cfg.kv_events, cfg.engine.block_size)
    events: list[tuple[Any, ...]] = []
    engine.kv_events = events
    emu.driver.after_step = lambda: publisher.publish(events)
    return publisher


def warm_up() -> None:
    from emulator.sampling import output_text

    render_chat([{"role": "user", "content": "warm up"}])
    output_text(0, 1)


def _toggle_health(emu: Emulator) -> None:
    emu.fail_health = not emu.fail_health
    log.warning("health now %s", "failing" if emu.fail_health else "ok")


def run(cfg: EmulatorConfig, ready: Callable[[str], None] | None = None) -> None:
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is optional off Linux
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(cfg, ready))
