"""`tokenizer: engine` (gateway/tokenize.py) against tiny aiohttp workers on loopback: a
worker that never answers /tokenize, one that fails, SGLang's missing chat form, and the
calibration loop against a worker whose counts differ from the local (cl100k) ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from compressor.compress import Compression, fit_request, request_tokens
from gateway.config import load_config
from gateway.metrics import GatewayMetrics
from gateway.tokenize import EngineTokenizer, fit_with_engine
from gateway.upstream import UpstreamClient
from gateway.workers import Fleet

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MESSAGES = [
    {"role": "system", "content": "You answer questions about the text."},
    {"role": "user", "content": " ".join(f"Sentence {i} says something new." for i in range(400))},
    {"role": "assistant", "content": "Noted."},
    {"role": "user", "content": "What does sentence 7 say?"},
]


async def _worker(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/tokenize", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def served() -> AsyncIterator[
    Callable[..., Awaitable[tuple[EngineTokenizer, GatewayMetrics]]]
]:
    runners: list[web.AppRunner] = []
    clients: list[UpstreamClient] = []

    async def start(
        handler: Handler, engine: str = "vllm", timeout_s: float = 0.2
    ) -> tuple[EngineTokenizer, GatewayMetrics]:
        runner, url = await _worker(handler)
        runners.append(runner)
        cfg = load_config(
            data={
                "pools": {
                    "short": {
                        "max_model_len": 8192,
                        "models": ["m"],
                        "tokenizer": "engine",
                        "tokenize_timeout_s": timeout_s,
                        "workers": [{"url": url, "engine": engine}],
                    }
                }
            },
            environ={},
        )
        assert cfg.pools["short"].tokenize_timeout_s == timeout_s
        fleet = Fleet(cfg)
        metrics = GatewayMetrics(fleet, time.monotonic)
        client = UpstreamClient()
        clients.append(client)
        pool = cfg.pools["short"]
        return (
            EngineTokenizer(
                client, fleet, "short", pool.tokenize_timeout_s, metrics, time.monotonic
            ),
            metrics,
        )

    yield start
    for c in clients:
        await c.close()
    for r in runners:
        await r.cleanup()


def _results(metrics: GatewayMetrics) -> dict[str, float]:
    return {
        r: metrics.tokenize_requests.labels("short", r)._value.get()
        for r in ("ok", "timeout", "error", "unsupported", "cached")
    }


async def _local(aim: int) -> Compression:
    return fit_request(aim, messages=MESSAGES)


async def _local_count() -> int:
    return request_tokens(messages=MESSAGES)


async def test_a_worker_that_never_answers_falls_back_after_the_timeout(served: Any) -> None:
    async def never(request: web.Request) -> web.Response:
        await asyncio.sleep(2)  # ten times the timeout
        return web.json_response({"count": 1})

    engine, metrics = await served(never, timeout_s=0.2)
    t0 = time.monotonic()
    out = await fit_with_engine(engine, "m", 500, True, _local, _local_count, messages=MESSAGES)
    assert out is None  # the caller counts locally
    assert time.monotonic() - t0 < 2.0
    assert _results(metrics) == {"ok": 0, "timeout": 1, "error": 0, "unsupported": 0, "cached": 0}


async def test_an_error_or_a_body_without_a_count_falls_back(served: Any) -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": "boom"}, status=500)

    engine, metrics = await served(broken)
    assert await engine.count("m", messages=MESSAGES) is None
    assert await engine.count("m", prompt="hello") is None
    assert _results(metrics)["error"] == 2


async def test_sglang_has_no_chat_form(served: Any) -> None:
    seen: list[dict[str, Any]] = []

    async def sglang(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response({"tokens": [1, 2, 3], "count": 3, "max_model_len": 8192})

    engine, metrics = await served(sglang, engine="sglang")
    assert await engine.count("m", messages=MESSAGES) is None
    assert await engine.count("m", prompt="a b") == 3
    assert seen == [{"model": "m", "prompt": "a b", "add_special_tokens": True}]
    assert _results(metrics) == {"ok": 1, "timeout": 0, "error": 0, "unsupported": 1, "cached": 0}


def _skewed(factor: float, overhead: int) -> Handler:
    """A worker whose count is the local one scaled and shifted (another vocabulary and
    template), and which records what it was asked."""

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        assert body["add_generation_prompt"] is True and body["model"] == "m"
        n = round(request_tokens(messages=body["messages"]) * factor) + overhead
        return web.json_response({"count": n, "max_model_len": 8192, "tokens": [0] * n})

    return handler


@pytest.mark.parametrize(("factor", "overhead"), [(1.0, 0), (1.12, 30), (0.9, 5)])
async def test_compressed_to_the_engines_count(served: Any, factor: float, overhead: int) -> None:
    engine, metrics = await served(_skewed(factor, overhead))
    local = request_tokens(messages=MESSAGES)
    target = int(local * 0.8)
    out = await fit_with_engine(engine, "m", target, True, _local, _local_count, messages=MESSAGES)
    assert out is not None and out.fits and out.changed
    engine_after = round(request_tokens(messages=out.messages) * factor) + overhead
    assert out.tokens_after == engine_after <= target
    assert out.tokens_before == round(local * factor) + overhead
    assert _results(metrics)["ok"] >= 2  # the original, and the result re-checked


async def test_fits_as_it_is_or_only_counted(served: Any) -> None:
    engine, metrics = await served(_skewed(1.1, 0))
    n = round(request_tokens(messages=MESSAGES) * 1.1)
    out = await fit_with_engine(engine, "m", n, True, _local, _local_count, messages=MESSAGES)
    assert out is not None and out.fits and not out.changed and out.tokens_after == n
    out = await fit_with_engine(engine, "m", n - 1, False, _local, _local_count, messages=MESSAGES)
    assert out is not None and not out.fits and out.detail == "may not be compressed"
    # the same body twice: the engine counted it once, the second answer is the cached one
    assert _results(metrics)["ok"] == 1 and _results(metrics)["cached"] == 1


async def test_a_request_the_engine_fits_or_puts_above_the_band_is_not_counted_locally(
    served: Any,
) -> None:
    # the local count only sets the compressor's aim: a request that is not compressed
    # (counted placements are mostly such) must not pay for it
    engine, _ = await served(_skewed(1.1, 0))
    n = round(request_tokens(messages=MESSAGES) * 1.1)
    local_counts = 0

    async def counted_locally() -> int:
        nonlocal local_counts
        local_counts += 1
        return request_tokens(messages=MESSAGES)

    out = await fit_with_engine(engine, "m", n, True, _local, counted_locally, messages=MESSAGES)
    assert out is not None and out.fits and not out.changed
    out = await fit_with_engine(
        engine, "m", n // 2, True, _local, counted_locally, messages=MESSAGES,
        compress_within=n - 1,
    )  # fmt: skip
    assert out is not None and not out.fits and out.detail == "above the band"
    assert local_counts == 0
    out = await fit_with_engine(engine, "m", int(n * 0.8), True, _local, counted_locally,
                                messages=MESSAGES)  # fmt: skip
    assert out is not None and out.fits and out.changed and local_counts == 1


# --- tokenizer: auto — the start-up probe (gateway/tokenizer_probe.py) ---------------------


async def test_probe_finds_both_forms_on_vllm_and_only_prompts_on_old_sglang(served: Any) -> None:
    from gateway.tokenizer_probe import probe

    async def vllm(request: web.Request) -> web.Response:
        return web.json_response({"count": 3, "max_model_len": 8192, "tokens": [1, 2, 3]})

    async def sglang(request: web.Request) -> web.Response:  # 0351c1fa: prompt only
        body = await request.json()
        if "prompt" not in body:
            return web.json_response({"object": "error", "message": "Field required"}, status=400)
        return web.json_response({"tokens": [1, 2], "count": 2, "max_model_len": -1})

    engine, _ = await served(vllm)
    assert await probe(engine, "m") == "engine" and engine.chat_form and engine.prompt_form
    # the probe's answer decides, not the engine's name: a SGLang that counts chats is used
    engine, _ = await served(vllm, engine="sglang")
    assert await probe(engine, "m") == "engine"
    assert await engine.count("m", messages=MESSAGES) == 3
    engine, metrics = await served(sglang, engine="sglang")
    assert await probe(engine, "m") == "engine_prompt" and engine.chat_form is False
    assert await engine.count("m", messages=MESSAGES) is None  # counted locally
    assert _results(metrics)["unsupported"] == 1


async def test_settle_exports_the_source_and_logs_cl100k_for_a_foreign_model(
    served: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.tokenizer_probe import settle

    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=404)

    engine, metrics = await served(broken)
    pools = {"short": ("auto", ["meta-llama/Llama-3.1-8B-Instruct"]), "gpt": ("cl100k", ["gpt-4o"])}
    with caplog.at_level("INFO", logger="fleetgate.tokenize"):
        sources = await settle(pools, {"short": engine}, metrics)
    assert sources == {"short": "cl100k", "gpt": "cl100k"}
    assert metrics.tokenizer_info.labels("short", "cl100k")._value.get() == 1
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "Llama-3.1" in errors[0].getMessage()  # gpt-4o: no error
