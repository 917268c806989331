from gateway.telemetry import apply, parse_metrics
from gateway.workers import Telemetry

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
vllm:num_requests_running_fake 99
"""

SGLANG_OPENMETRICS = """# TYPE sglang:num_running_reqs gauge
sglang_num_running_reqs{model_name="m",tp_rank="0"} 7.0
sglang_num_queue_reqs{model_name="m",tp_rank="0"} 1.0
sglang_token_usage{model_name="m",tp_rank="0"} 0.75
sglang_cache_hit_rate{model_name="m",tp_rank="0"} 0.4
# EOF
"""


def test_vllm_sums_counts_and_averages_fractions():
    f = parse_metrics(VLLM)
    assert f["running"] == 5 and f["waiting"] == 4
    assert f["kv"] == 0.375
    t = Telemetry()
    apply(t, f, now=1.0)
    assert (t.running, t.waiting, t.scraped_at) == (5, 4, 1.0)
    # the hit rate comes from the change between two scrapes
    f2 = parse_metrics(VLLM.replace("1000.0", "2000.0").replace("250.0", "750.0"))
    apply(t, f2, now=2.0)
    assert t.prefix_hit_rate == 0.5


def test_legacy_vllm_kv_name_is_a_fallback():
    f = parse_metrics(
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.9\nvllm:num_requests_running 1\n'
    )
    t = Telemetry()
    apply(t, f, now=0.0)
    assert t.kv_usage == 0.9 and t.running == 1


def test_sglang_escaped_names():
    t = Telemetry()
    apply(t, parse_metrics(SGLANG_OPENMETRICS), now=0.0)
    assert (t.running, t.waiting, t.kv_usage, t.prefix_hit_rate) == (7, 1, 0.75, 0.4)


def test_garbage_is_ignored():
    f = parse_metrics(
        'vllm:num_requests_running{a="b"} notanumber\n\n#\nvllm:num_requests_waiting\n'
    )
    assert f == {}


# --- bad engines: the scrape loop survives anything an engine answers ---------------------

import asyncio  # noqa: E402
import math  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402
from aiohttp import web  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gateway.periodic import PerWorkerLoops  # noqa: E402
from gateway.telemetry import Scraper, parse  # noqa: E402
from gateway.upstream import Endpoint  # noqa: E402
from gateway.workers import WorkerState  # noqa: E402

GOOD = 'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5\n'
BAD_BODIES = {
    "nan": "vllm:num_requests_running NaN\nvllm:num_requests_waiting 2\n",
    "inf": "vllm:num_requests_running +Inf\nvllm:kv_cache_usage_perc -Inf\n",
    "garbage": "\x00\x01 not prometheus {{{\n}}} 1 2 3 4\nvllm:num_requests_running{oops 7\n",
    "empty": "",
}


class _Engine:
    """A /metrics endpoint on 127.0.0.1 whose answer the test switches."""

    def __init__(self) -> None:
        self.body = GOOD
        self.status = 200
        self.hits = 0
        self.url = ""

    async def metrics(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(text=self.body, status=self.status)


@pytest.fixture
async def engine() -> AsyncIterator[_Engine]:
    e = _Engine()
    app = web.Application()
    app.router.add_get("/metrics", e.metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    e.url = f"http://127.0.0.1:{port}"
    yield e
    await runner.cleanup()


def _worker(url: str) -> WorkerState:
    return WorkerState(
        id="w0",
        pool="short",
        url=url,
        engine="vllm",
        max_model_len=8192,
        endpoint=Endpoint.from_url(url),
        extra_headers=b"",
    )


async def _wait(pred, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_scrape_loop_survives_nan_inf_garbage_empty_and_500(engine):
    """Before: `int(float("nan"))` raised ValueError (and +Inf OverflowError) inside the
    worker's scrape loop, which nothing caught, so the loop's task died on the first NaN
    and the worker's telemetry was never refreshed again (stale forever); an empty or
    garbage body was taken as a fresh scrape of an idle engine (running = waiting = 0).
    Now every bad answer is counted under a reason, the snapshot keeps its last finite
    values, and the loop goes on to read the next good answer."""
    worker = _worker(engine.url)
    errors: list[str] = []
    clock = [0.0]
    async with httpx.AsyncClient(timeout=2.0) as client:
        scraper = Scraper([worker], client, 0.01, lambda: clock[0], lambda w, r: errors.append(r))
        scraper.start()
        try:
            clock[0] = 1.0
            await _wait(lambda: worker.telemetry.scraped_at == 1.0)
            assert (worker.telemetry.running, worker.telemetry.waiting) == (3, 1)
            for mode, body in [*BAD_BODIES.items(), ("http_500", GOOD)]:
                engine.body, engine.status = body, 500 if mode == "http_500" else 200
                clock[0] += 1.0
                hits = engine.hits
                await _wait(lambda hits=hits: engine.hits >= hits + 3)
                t = worker.telemetry
                assert all(math.isfinite(v) for v in (t.running, t.waiting, t.kv_usage)), mode
                assert t.running == 3, mode  # the NaN/Inf sample was not stored
                if mode == "nan":
                    assert t.waiting == 2  # the same scrape's finite field was
            # a good answer again: the same loop is still running and reads it
            engine.body, engine.status = GOOD.replace(" 3\n", " 5\n"), 200
            clock[0] += 1.0
            await _wait(lambda: worker.telemetry.running == 5)
            assert worker.telemetry.scraped_at == clock[0]
        finally:
            await scraper.stop()
    assert {"non_finite", "malformed", "empty", "http_500"} <= set(errors)


async def test_a_probe_that_raises_does_not_end_its_loop():
    """Before: any exception from a probe ended that worker's loop for the process's life."""
    calls = 0

    async def probe(w: WorkerState) -> bool:
        nonlocal calls
        calls += 1
        if calls % 2:
            raise RuntimeError("boom")
        return True

    loops = PerWorkerLoops([_worker("http://127.0.0.1:9")], 0.001, probe)
    loops.start()
    try:
        await _wait(lambda: calls >= 6)
    finally:
        await loops.stop()


def test_parse_counts_bad_lines_and_drops_non_finite_fields():
    p = parse(BAD_BODIES["nan"])
    assert p.fields == {"waiting": 2.0} and p.non_finite == 1 and p.problem == "non_finite"
    p = parse(BAD_BODIES["inf"])
    assert p.fields == {} and p.non_finite == 2
    p = parse(BAD_BODIES["garbage"])
    assert p.fields == {} and p.malformed == 3 and p.problem == "malformed"
    assert parse("").problem == "empty"
    # one NaN rank drops the whole summed field (a partial sum would under-count)
    p = parse(
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} NaN\n'
    )
    assert "running" not in p.fields
    # finite samples whose sum overflows are no better than an Inf
    p = parse('vllm:num_requests_running{engine="0"} 1e308\nvllm:num_requests_running 1e308\n')
    assert p.fields == {} and p.problem == "non_finite"
    # a timestamp and an OpenMetrics exemplar are not mistaken for the value
    p = parse(
        "vllm:num_requests_running 4 1700000000000\n"
        'vllm:prefix_cache_hits_total{engine="0"} 9 # {trace_id="x"} 1 2\n'
    )
    assert p.fields == {"running": 4.0, "hits": 9.0} and p.problem is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(),
            st.sampled_from(
                [
                    "vllm:num_requests_running",
                    'vllm:kv_cache_usage_perc{a="}"}',
                    "sglang:token_usage",
                    "NaN",
                    "+Inf",
                    "-inf",
                    "1e999",
                    "1e308",
                    "{",
                    "}",
                    " ",
                    "# {",
                    "0.5",
                ]
            ),
        ),
        max_size=12,
    ).map(lambda parts: " ".join(parts).replace("  ", "\n"))
)
def test_parse_never_raises_and_keeps_only_finite_values(text):
    p = parse(text)
    assert all(math.isfinite(v) for v in p.fields.values())
    t = _worker("http://127.0.0.1:9").telemetry
    apply(t, p.fields, now=0.0)  # nor does applying what it kept


# --- the KV cache's size: the engine's own capacity figure ------------------------------
def test_vllm_kv_cache_tokens_come_from_cache_config_info_labels():
    text = (
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",'
        'num_gpu_blocks="2048",num_gpu_blocks_override="None"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1024"} 1.0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
    )
    t = Telemetry()
    apply(t, parse_metrics(text), 1.0)
    assert t.kv_tokens == (2048 + 1024) * 16  # data-parallel ranks add up
    assert t.block_size == 16  # the cache-aware routers' unit (WorkerView.block_size)


def test_sglang_kv_cache_tokens_are_used_over_the_fraction_used():
    t = Telemetry()
    apply(t, parse_metrics("sglang:num_used_tokens 5000\nsglang:token_usage 0.25\n"), 1.0)
    assert t.kv_tokens == 20_000
    # an idle engine says nothing about its size: the last figure stays
    apply(t, parse_metrics("sglang:num_used_tokens 0\nsglang:token_usage 0\n"), 2.0)
    assert t.kv_tokens == 20_000


def test_a_label_that_only_ends_like_the_name_is_not_read():
    text = 'vllm:cache_config_info{block_size="16",xnum_gpu_blocks="9"} 1.0\n'
    assert "kv_tokens" not in parse_metrics(text)


def test_the_emulators_own_vllm_exposition_gives_its_kv_size():
    """The emulator's vLLM /metrics, whose cache_config_info copies vLLM's label set."""
    from emulator.engine import Engine, EngineConfig
    from emulator.metrics_vllm import VllmMetrics
    from policies.clock import ManualClock

    cfg = EngineConfig(num_kv_blocks=4096, block_size=32)
    body, _ = VllmMetrics("m", cfg).render(Engine(cfg, ManualClock()).stats, "text/plain", 0.0)
    text = body.decode()
    t = Telemetry()
    apply(t, parse_metrics(text), 1.0)
    assert t.kv_tokens == 4096 * 32 and t.block_size == 32
