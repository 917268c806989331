"""Compress-and-Route for a model that is not cl100k: emulators that count prompts with
Qwen3's tokenizer.json and chat template (`--tokenizer hf:…`) behind a gateway whose
pools say `tokenizer: hf:<the same folder>`. Every borderline chat that the gateway
compresses onto the short pool fits: the engine's own prompt_tokens ≤ B_short − max_tokens."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.corpus import borderline_set
from tests.e2e.fleet import MODEL, emulator, gateway_config, start_gateway
from tests.served_models import qwen3_dir

pytestmark = pytest.mark.e2e

B_SHORT = 8192


def _qwen_fleet(fresh_procs, short_tokenizer: str, long_tokenizer: str | None) -> str:
    """Qwen3-counting emulators (short and long) behind a gateway; its URL."""
    spec = f"hf:{qwen3_dir()}"
    short = emulator(fresh_procs, "short0", B_SHORT, "--tokenizer", spec)
    long = emulator(fresh_procs, "long0", 65536, "--tokenizer", spec)
    for p in (short, long):
        p.wait_ready("/health")
    cfg = gateway_config([short.url], [long.url])
    pools = cfg["pools"]
    pools["short"]["tokenizer"] = short_tokenizer  # type: ignore[index]
    if long_tokenizer is not None:
        pools["long"]["tokenizer"] = long_tokenizer  # type: ignore[index]
    return start_gateway(fresh_procs, cfg).url


def _send_borderline_chats(url: str, n: int) -> int:
    """Send `n` borderline chats; each that lands on the short pool fits it in the
    engine's own tokens, and a compressed one's engine count is the gateway's. Returns
    how many were compressed."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    chats = [s for s in borderline_set(n=24, seed=7) if s.messages is not None][:n]
    compressed = 0
    for s in chats:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=s.messages, max_tokens=s.max_tokens
        )
        usage = raw.parse().usage
        if raw.headers["x-fleetgate-pool"] == "short":
            assert usage.prompt_tokens + s.max_tokens <= B_SHORT
        if "x-fleetgate-compressed" in raw.headers:
            compressed += 1
            _, after = map(int, raw.headers["x-fleetgate-compressed"].split("->"))
            assert raw.headers["x-fleetgate-pool"] == "short"
            assert usage.prompt_tokens == after  # the gateway counted as the engine does
    return compressed


def test_borderline_chats_fit_the_qwen_engine(fresh_procs):
    spec = f"hf:{qwen3_dir()}"
    url = _qwen_fleet(fresh_procs, spec, spec)
    assert _send_borderline_chats(url, 12) >= 12 // 2


def test_tokenizer_engine_counts_with_the_workers_tokenize(fresh_procs):
    """`tokenizer: engine`: the gateway has no tokenizer files; the short pool's workers
    (Qwen3 emulators) count borderline chats through /tokenize, and every compressed chat
    fits in the engine's own tokens."""
    url = _qwen_fleet(fresh_procs, "engine", None)
    assert _send_borderline_chats(url, 8) >= 8 // 2
    metrics = httpx.get(url + "/metrics").text
    ok = [
        line
        for line in metrics.splitlines()
        if line.startswith("fleetgate_tokenize_requests_total")
    ]
    assert any('result="ok"' in line and not line.endswith(" 0.0") for line in ok), ok


def _llama_or_qwen(fresh_procs, model: str, tmp_path) -> str:
    """Emulators counting with Llama-3.1's or Qwen3's real tokenizer and template, behind a
    gateway whose pools name no tokenizer (the default, `auto`); its URL."""
    from tests.served_models import llama31_dir

    folder = qwen3_dir() if model == "qwen3" else llama31_dir(tmp_path)
    spec = f"hf:{folder}"
    short = emulator(fresh_procs, "short0", B_SHORT, "--tokenizer", spec)
    long = emulator(fresh_procs, "long0", 65536, "--tokenizer", spec)
    for p in (short, long):
        p.wait_ready("/health")
    return start_gateway(fresh_procs, gateway_config([short.url], [long.url])).url


@pytest.mark.parametrize("model", ["llama3.1", "qwen3"])
def test_tokenizer_auto_counts_with_the_engine_and_no_request_overflows(
    fresh_procs, tmp_path, model
):
    """`tokenizer: auto` (nothing configured): the start-up probe finds the engine's
    /tokenize (exported), and borderline requests of every shape — Chinese and Japanese
    pages and pasted logs and JSON included — either fit the short pool in the engine's
    own tokens or go long: no engine 400, no retry (the oracle is the engine's usage)."""
    from tests.shapes import CJK_SHAPES, SHAPES, shape_set

    url = _llama_or_qwen(fresh_procs, model, tmp_path)
    metrics = httpx.get(url + "/metrics").text
    assert 'fleetgate_tokenizer_info{pool="short",source="engine"} 1.0' in metrics
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    corpus = [s for s in shape_set(per_shape=1, seed=5, shapes=SHAPES + CJK_SHAPES)]
    on_short = 0
    for s in corpus:
        if s.messages is not None:
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=s.messages, max_tokens=s.max_tokens
            )
        else:
            raw = client.completions.with_raw_response.create(
                model=MODEL, prompt=s.prompt, max_tokens=s.max_tokens
            )
        usage = raw.parse().usage
        assert "x-fleetgate-retried" not in raw.headers, s.meta["shape"]
        if raw.headers["x-fleetgate-pool"] == "short":
            on_short += 1
            assert usage.prompt_tokens + s.max_tokens <= B_SHORT, s.meta["shape"]
    assert on_short > 0
    after = httpx.get(url + "/metrics").text
    assert "fleetgate_compress_uncertain_total" in after
