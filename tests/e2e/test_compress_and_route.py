"""Compress-and-Route end to end: a borderline request is compressed onto the short pool,
and the engine's own count of what it received is within the budget T_c = B_short − L_out."""

from __future__ import annotations

import inspect
import re

import httpx
import openai
import pytest

from compressor.tokenizer import cl100k
from tests.e2e.fleet import MODEL, metric

pytestmark = pytest.mark.e2e

B_SHORT = 8192
MAX_TOKENS = 256


def tokens(text: str, n: int) -> str:
    """The first `n` cl100k tokens of `text`."""
    enc = cl100k()
    return enc.decode(enc.encode(text)[:n])


def prose(words: int) -> str:
    """English prose that ships with Python: the stdlib's module docstrings."""
    import asyncio
    import email
    import json
    import logging
    import string
    import textwrap
    import unittest

    text = " ".join(
        inspect.getdoc(m) or "" for m in (asyncio, email, json, logging, string, textwrap, unittest)
    )
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    out: list[str] = []
    n = 0
    i = 0
    while n < words:
        s = sentences[i % len(sentences)]
        out.append(f"{s} (part {i})")
        n += len(s.split()) + 2
        i += 1
    return " ".join(out)


def client(fleet) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_borderline_prose_is_compressed_onto_the_short_pool(fleet):
    before = fleet.metrics()
    messages = [
        {"role": "system", "content": "You summarise documents faithfully."},
        {"role": "user", "content": "Here is the document:\n\n" + tokens(prose(8000), 9000)},
        {"role": "assistant", "content": "I have read it."},
        {"role": "user", "content": "Summarise it in three sentences."},
    ]
    raw = client(fleet).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=MAX_TOKENS
    )
    usage = raw.parse().usage
    assert raw.headers["x-fleetgate-pool"] == "short"
    before_tokens, after_tokens = map(int, raw.headers["x-fleetgate-compressed"].split("->"))
    assert before_tokens + MAX_TOKENS > B_SHORT, "the test prompt was not borderline"
    assert after_tokens <= B_SHORT - MAX_TOKENS
    # the engine's own count of what it got: the exact count the gateway compressed to
    assert usage.prompt_tokens == after_tokens
    assert usage.prompt_tokens + MAX_TOKENS <= B_SHORT
    after = fleet.metrics()
    for name in ("fleetgate_compress_borderline_total", "fleetgate_compress_compressed_total"):
        assert metric(after, name) == metric(before, name) + 1
    removed = metric(after, "fleetgate_compress_tokens_removed_total") - metric(
        before, "fleetgate_compress_tokens_removed_total"
    )
    assert removed == before_tokens - after_tokens
    assert metric(after, "fleetgate_compress_duration_seconds_count") > metric(
        before, "fleetgate_compress_duration_seconds_count"
    )


def test_borderline_code_is_not_compressed_and_goes_long(fleet):
    import asyncio.base_events as src

    code = tokens(inspect.getsource(src) * 3, 9000)  # L_total ≈ 9,257: in the band
    raw = client(fleet).completions.with_raw_response.create(
        model=MODEL, prompt=code, max_tokens=MAX_TOKENS
    )
    assert raw.headers["x-fleetgate-pool"] == "long"
    assert "x-fleetgate-compressed" not in raw.headers
    assert raw.parse().usage.prompt_tokens + MAX_TOKENS > B_SHORT


def test_short_requests_carry_the_estimate_header(fleet):
    raw = client(fleet).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello there, how are you?"}],
        max_tokens=4,
    )
    est = int(raw.headers["x-fleetgate-tokens-estimated"])
    real = raw.parse().usage.prompt_tokens
    assert raw.headers["x-fleetgate-pool"] == "short"
    assert "x-fleetgate-compressed" not in raw.headers
    assert abs(est - real) <= max(4, real // 2)


def test_bytes_per_token_is_exposed(fleet):
    text = httpx.get(fleet.url + "/metrics").text
    assert 'fleetgate_budget_bytes_per_token{category="prose"}' in text


def _borderline_messages() -> list[dict[str, str]]:
    return [
        {"role": "user", "content": "Here is the document:\n\n" + tokens(prose(8000), 9000)},
        {"role": "assistant", "content": "I have read it."},
        {"role": "user", "content": "Summarise it in three sentences."},
    ]


@pytest.mark.parametrize("single", [False, True])
def test_one_pool_compresses_only_when_configured(fresh_procs, single):
    """With no larger pool, a band request is refused naming the key, unless
    `placement.compress_single_pool: true`; then it is compressed, visibly."""
    from tests.e2e.fleet import emulator, gateway_config, start_gateway

    short = emulator(fresh_procs, "only0", B_SHORT).wait_ready("/health")
    cfg = gateway_config([short.url], [])
    if single:
        cfg["placement"] = {"compress_single_pool": True}
    gw = start_gateway(fresh_procs, cfg)
    body = {"model": MODEL, "messages": _borderline_messages(), "max_tokens": MAX_TOKENS}
    r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60)
    if not single:
        # no pool can take it: the gateway's too-long answer, as OpenAI and vLLM give it
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert "compress_single_pool" in r.json()["error"]["message"]
        return
    assert r.status_code == 200 and r.headers["x-fleetgate-pool"] == "short"
    before, after = map(int, r.headers["x-fleetgate-compressed"].split("->"))
    assert before + MAX_TOKENS > B_SHORT >= after + MAX_TOKENS
    assert metric(httpx.get(gw.url + "/metrics").text, "fleetgate_compress_compressed_total") == 1
