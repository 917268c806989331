"""The trailing question (compressor/question.py) and the last user message's rule."""

from __future__ import annotations

import random

import pytest

from compressor.compress import CompressorConfig, compress_chat, compress_prompt, default_analyzer
from compressor.content import code_outside_fences, is_log, unfenced
from compressor.question import question_tail
from tests.corpus import prose_prompt
from tests.tokens import engine_tokens


@pytest.fixture(scope="module")
def document() -> str:
    s = prose_prompt(random.Random(11), 3000)
    assert s.prompt is not None
    return s.prompt


def tail(text: str, budget: int = 256) -> str:
    doc = default_analyzer().analyse([text])
    i = question_tail(doc, 0, budget)
    return text[doc.units.starts[i] :]


def test_the_tail_is_the_trailing_paragraphs_within_the_budget(document: str) -> None:
    q = "What does the text say about scoping? Please answer in two sentences."
    assert tail(document + "\n\n" + q, 20) == "\n\n" + q
    t = tail(document + "\n\n" + q)  # earlier short paragraphs too, up to 256 tokens
    assert t.startswith("\n\n") and t.endswith("\n\n" + q) and engine_tokens(prompt=t) <= 257


def test_polite_paragraphs_after_the_question_stay_with_it(document: str) -> None:
    q = "What does the text say about scoping?\n\nThanks in advance!\n\nBullet points are fine."
    assert tail(document + "\n\n" + q).endswith("\n\n" + q)


def test_a_document_boundary_stops_the_tail(document: str) -> None:
    q = "Which of these rules surprised you?"
    assert tail(document + "\n</document>\n\n" + q) == "\n\n" + q
    assert tail(document + '\n"""\n\n' + q) == "\n\n" + q
    assert tail(document + "\n\n---\n\nThanks!\n\n" + q) == "\n\nThanks!\n\n" + q


def test_a_long_last_paragraph_keeps_the_units_that_fit_the_budget(document: str) -> None:
    glued = document.replace("\n\n", " ") + " What is the main point?"
    t = tail(glued, 40)
    assert t.endswith(" What is the main point?") and 0 < engine_tokens(prompt=t) - 1 <= 40


def test_the_last_user_message_is_compressed_around_its_question(document: str) -> None:
    q = "Summarise the text above.\n\nThank you so much. I really appreciate it."
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Here is a document:\n\n" + document + "\n\n" + q},
    ]
    before = engine_tokens(messages=messages)
    r = compress_chat(messages, int(before * 0.8))
    assert r.fits and r.changed and r.messages is not None
    assert r.messages[0] is messages[0]
    assert r.messages[1]["content"].startswith("Here is a document:")
    assert r.messages[1]["content"].endswith("\n\n" + q)
    assert engine_tokens(messages=r.messages) == r.tokens_after <= int(before * 0.8)
    old = compress_chat(messages, int(before * 0.8), CompressorConfig(protect_last_user=True))
    assert not old.fits and old.messages is not None and old.messages[1] is messages[1]
    assert old.detail == "nothing to shorten"


def test_a_completion_prompt_keeps_its_question(document: str) -> None:
    q = "Question: What are the three most important points?\nAnswer:"
    prompt = document + "\n\n" + q
    r = compress_prompt(prompt, int(engine_tokens(prompt=prompt) * 0.8))
    assert r.fits and r.prompt is not None and r.prompt.endswith("\n\n" + q)


def test_logs_are_not_code() -> None:
    lines = [
        f"Mar  3 10:0{i % 10}:1{i % 6} web-01 nginx[812]: upstream timed out (110), client: x,"
        for i in range(60)
    ]
    log = "\n".join(lines)
    assert is_log(log) and not code_outside_fences(unfenced(log))
    source = "def f(x):\n    return g(x)\n\n" * 40
    assert not is_log(source) and code_outside_fences(unfenced(source))
