"""The emulator's timing follows the engine model, and a vanished client frees the engine.

Timing is checked in engine time, read from the emulator's own /metrics histograms (the
engine model fixes it; wall-clock figures on a shared machine are noise and only appear
in failure messages): with t_iter = W + H·n and TTFT = (⌈P/C⌉ + 1)·t_iter on an idle engine
(FleetOpt Eq. 7), a long prompt's TTFT over a short one's, and TTFT and inter-token
latency under a decoding batch over an idle engine's, come out as the model predicts.

Disconnects: vLLM aborts a request whose client went away, streaming or not; the
gateway relies on /metrics showing running and waiting back at 0.
"""

from __future__ import annotations

import itertools
import math
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.contract.emu_wire import CLIENT, metrics, sample, wait_for
from tests.procs import Proc, procs

pytestmark = pytest.mark.e2e

W, H, CHUNK, SCALE = 0.02, 0.005, 512, 0.2
LAB = {"engine": "0", "model_name": "m"}


@pytest.fixture(scope="module")
def emu() -> Iterator[Proc]:
    with procs() as ps:
        p = ps.emulator("timing", "--model", "m", "--max-model-len", "8192", "--w", str(W), "--h", str(H),
                        "--prefill-chunk", str(CHUNK), "--time-scale", str(SCALE), "--no-prefix-caching",
                        "--max-lag", "2")  # fmt: skip
        yield p.wait_ready()


def _ttft(url: str, prompt_tokens: int, max_tokens: int = 1) -> tuple[float, list[float]]:
    """Wall seconds to the first streamed token, and the gaps between later chunks."""
    body = {"model": "m", "prompt": list(range(1000, 1000 + prompt_tokens)), "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}  # fmt: skip
    t0 = time.perf_counter()
    with CLIENT.stream("POST", url + "/v1/completions", json=body) as r:
        stamps = [time.perf_counter() for line in r.iter_lines() if line.startswith("data: {")]
    return stamps[0] - t0, [b - a for a, b in itertools.pairwise(stamps)]


def _model_ttft(p: int, n: int) -> float:
    return (math.ceil(p / CHUNK) + 1) * (W + H * n)


def _running(url: str) -> tuple[float, float]:
    fams = metrics(url)
    return sample(fams, "vllm:num_requests_running", **LAB), sample(
        fams, "vllm:num_requests_waiting", **LAB
    )


def _engine_mean(a: dict, b: dict, name: str) -> float:  # type: ignore[type-arg]
    """Mean of a histogram's observations between two scrapes (engine seconds)."""
    s = sample(b, name + "_sum", **LAB) - sample(a, name + "_sum", **LAB)
    n = sample(b, name + "_count", **LAB) - sample(a, name + "_count", **LAB)
    return s / n


def test_ttft_grows_with_prompt_length(emu: Proc) -> None:
    # Asserted in engine time (the emulator's own histograms), which the engine model fixes;
    # wall-clock TTFTs on a shared machine only go into the failure message.
    short_p, long_p = 64, 6000
    before = metrics(emu.url)
    wall_short = statistics.median(_ttft(emu.url, short_p)[0] for _ in range(5))
    mid = metrics(emu.url)
    wall_long = statistics.median(_ttft(emu.url, long_p)[0] for _ in range(5))
    after = metrics(emu.url)
    predicted = _model_ttft(long_p, 1) / _model_ttft(short_p, 1)  # 6.5
    e_short = _engine_mean(before, mid, "vllm:time_to_first_token_seconds")
    e_long = _engine_mean(mid, after, "vllm:time_to_first_token_seconds")
    assert e_short >= _model_ttft(short_p, 1) * 0.999  # never faster than the model
    assert predicted / 1.5 < e_long / e_short < predicted * 1.5, (
        e_short,
        e_long,
        wall_short,
        wall_long,
    )


def test_ttft_and_itl_grow_with_batch_size(emu: Proc) -> None:
    m0 = metrics(emu.url)
    for _ in range(3):
        _ttft(emu.url, 64, max_tokens=6)
    m1 = metrics(emu.url)
    idle_ttft = _engine_mean(m0, m1, "vllm:time_to_first_token_seconds")
    idle_itl = _engine_mean(m0, m1, "vllm:inter_token_latency_seconds")
    k = 24
    load = {
        "model": "m",
        "prompt": list(range(50, 114)),
        "max_tokens": 5000,
        "ignore_eos": True,
        "stream": True,
    }
    stop = threading.Event()
    decoding = threading.Semaphore(0)  # released once per stream at its first token

    def background() -> None:  # decodes until told to hang up
        with CLIENT.stream("POST", emu.url + "/v1/completions", json=load) as r:
            first = True
            for line in r.iter_lines():
                if first and line.startswith("data: "):
                    first = False
                    decoding.release()
                if stop.is_set():
                    return

    threads = [threading.Thread(target=background) for _ in range(k)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: _running(emu.url)[0] == k, timeout=20.0)
        # every stream past its (chunked) prefill: the probe meets a pure decode batch,
        # not the tail of the others' prefill chunks, however slow the machine is
        for _ in range(k):
            assert decoding.acquire(timeout=20.0)
        m2 = metrics(emu.url)
        _ttft(emu.url, 64, max_tokens=4)
        m3 = metrics(emu.url)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert wait_for(lambda: _running(emu.url) == (0, 0))
    busy_ttft = _engine_mean(m2, m3, "vllm:time_to_first_token_seconds")
    busy_itl = _engine_mean(m2, m3, "vllm:inter_token_latency_seconds")  # all k+1 streams' gaps
    predicted = (W + H * (k + 1)) / (W + H)  # 5.8: every step carries the batch
    assert idle_itl == pytest.approx(W + H, rel=0.05)
    # the probe arrives somewhere inside a busy step and joins the next one: its first
    # token comes between one and two busy steps after it arrived (engine time)
    assert predicted / 1.3 < busy_ttft / idle_ttft < 2 * predicted * 1.3, (idle_ttft, busy_ttft)
    assert predicted / 1.3 < busy_itl / idle_itl < predicted * 1.3, (idle_itl, busy_itl)


def test_stream_disconnect_aborts(emu: Proc) -> None:
    before = sample(metrics(emu.url), "vllm:request_success_total", finished_reason="abort", **LAB)
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "max_tokens": 5000,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", emu.url + "/v1/chat/completions", json=body, timeout=30.0) as r:
        lines = r.iter_lines()
        seen = 0
        while seen < 3:
            seen += next(lines).startswith("data: ")
        assert _running(emu.url) == (1, 0)
    assert wait_for(lambda: _running(emu.url) == (0, 0))
    after = sample(metrics(emu.url), "vllm:request_success_total", finished_reason="abort", **LAB)
    assert after == before + 1


def test_non_stream_disconnect_aborts(emu: Proc) -> None:
    body = {"model": "m", "prompt": "go on", "max_tokens": 5000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(emu.url + "/v1/completions", json=body, timeout=httpx.Timeout(30.0, read=0.3))
    assert wait_for(lambda: _running(emu.url) == (0, 0))
