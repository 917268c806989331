"""The compressor's entry points (compressor/compress.py) against the real tokenizer."""

from __future__ import annotations

import random

import pytest

from compressor.compress import (
    CompressorConfig,
    compress_chat,
    compress_prompt,
    fit_request,
    request_tokens,
)
from tests.corpus import chat_sample, prose_prompt, rag_sample
from tests.tokens import engine_tokens


def engine_count(prompt: str) -> int:
    return engine_tokens(prompt=prompt)


@pytest.fixture(scope="module")
def prose() -> str:
    s = prose_prompt(random.Random(3), 3000)
    assert s.prompt is not None
    return s.prompt


def test_prompt_is_cut_to_the_exact_target(prose: str) -> None:
    before = engine_count(prose)
    target = int(before * 0.8)
    r = compress_prompt(prose, target)
    assert r.fits and r.changed and r.prompt is not None
    assert r.tokens_before == before
    assert r.tokens_after == engine_count(r.prompt) <= target
    assert r.tokens_removed == before - r.tokens_after


def test_a_prompt_that_fits_is_returned_as_is(prose: str) -> None:
    r = compress_prompt(prose, 10**6)
    assert r.fits and not r.changed and r.prompt is prose and not r.detail


def test_an_unreachable_target_leaves_the_prompt_unchanged(prose: str) -> None:
    r = compress_prompt(prose, 10)
    assert not r.fits and not r.changed and r.prompt is prose
    assert r.tokens_after == r.tokens_before and r.detail


def test_code_is_not_compressed() -> None:
    import inspect
    import json.decoder as module

    source = inspect.getsource(module)
    r = compress_prompt(source, engine_count(source) // 2)
    assert not r.fits and r.prompt == source and "code" in r.detail


def test_chat_keeps_system_and_last_user_message_as_the_same_objects() -> None:
    sample = chat_sample(random.Random(5), 4000)
    assert sample.messages is not None
    before = engine_tokens(messages=sample.messages)
    r = compress_chat(sample.messages, int(before * 0.75))
    assert r.fits and r.changed and r.messages is not None
    assert r.tokens_after == engine_tokens(messages=r.messages)
    assert r.messages[0] is sample.messages[0]  # system
    assert r.messages[-1] is sample.messages[-1]  # last user message
    assert len(r.messages) == len(sample.messages)
    assert [m["role"] for m in r.messages] == [m["role"] for m in sample.messages]


def test_rag_tool_results_are_what_gets_shortened() -> None:
    sample = rag_sample(random.Random(8), 4000, as_chat=True)
    assert sample.messages is not None
    before = engine_tokens(messages=sample.messages)
    r = compress_chat(sample.messages, int(before * 0.85))
    assert r.fits and r.messages is not None
    changed = [
        i for i, (a, b) in enumerate(zip(sample.messages, r.messages, strict=True)) if a is not b
    ]
    assert changed == [3]  # only the tool message with the retrieved passages


def test_chat_with_nothing_to_shorten() -> None:
    messages = [
        {"role": "system", "content": "Rules. " * 200},
        {"role": "user", "content": "Question? " * 200},
    ]
    r = compress_chat(messages, 50)
    assert not r.fits and r.messages == messages and r.detail


def test_list_content_parts_are_shortened_in_place() -> None:
    text = prose_prompt(random.Random(9), 1500).prompt or ""
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": "x"}},
            ],
        },
        {"role": "assistant", "content": "Sure."},
        {"role": "user", "content": "And?"},
    ]
    before = engine_tokens(messages=messages)
    r = compress_chat(messages, before - 200)
    assert r.fits and r.messages is not None
    parts = r.messages[0]["content"]
    assert parts[1] == messages[0]["content"][1] and len(parts[0]["text"]) < len(text)


def test_fit_request_modes(prose: str) -> None:
    n = engine_count(prose)
    assert fit_request(n, prompt=prose, likely_fits=True).fits
    counted = fit_request(n - 100, prompt=prose, may_compress=False)
    assert not counted.fits and not counted.changed and counted.tokens_before == n
    squeezed = fit_request(n - 100, prompt=prose, likely_fits=True)
    assert squeezed.fits and squeezed.changed
    messages = [{"role": "user", "content": prose}]
    assert request_tokens(messages=messages) == engine_tokens(messages=messages)
    assert request_tokens(prompt=prose) == n


def test_more_first_and_last_units_can_be_required(prose: str) -> None:
    n = engine_count(prose)
    loose = compress_prompt(prose, int(n * 0.6), CompressorConfig(keep_first=3, keep_last=2))
    strict = compress_prompt(prose, int(n * 0.6), CompressorConfig(keep_first=400, keep_last=400))
    assert loose.fits and not strict.fits
