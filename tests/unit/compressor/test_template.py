"""The engine's template (compressor/template.py): the Llama-3 layout with one token per
special, the same count as the emulator's own definition."""

from __future__ import annotations

from compressor.template import (
    chat_segments,
    chat_tokens,
    completion_tokens,
    content_text,
    fixed_tokens,
)
from emulator.chat_template import render_chat, render_completion
from tests.corpus import labelled_set
from tests.tokens import engine_tokens, text_tokens

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Part one."}, {"type": "image_url", "image_url": {}}],
    },
    {"role": "assistant", "content": None, "tool_calls": []},
    {"role": "tool", "content": "Found it."},
    {"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
]


def test_counts_match_an_independent_count() -> None:
    assert chat_tokens(MESSAGES) == engine_tokens(messages=MESSAGES)
    assert completion_tokens("Hello world") == 1 + text_tokens("Hello world")
    assert chat_tokens([{"role": "user", "content": "Hi"}]) == 1 + 3 + 1 + text_tokens("\n\nHi") + 4


def test_content_text_joins_text_parts_without_separator() -> None:
    assert content_text(MESSAGES[1]["content"]) == "Part one."
    assert content_text(MESSAGES[4]["content"]) == "AB"
    assert content_text(None) == ""


def test_segments_are_the_encoded_texts_with_their_slots() -> None:
    fixed, texts, slots = chat_segments(MESSAGES, lambda i, role, text: role != "system")
    assert fixed == fixed_tokens(MESSAGES)
    assert texts == ["\n\n" + content_text(m.get("content")) for m in MESSAGES]
    # a message with two text parts is not editable: its parts are encoded as one string
    assert slots == [None, (1, 0), None, (3, None), None]  # no content: nothing to edit
    assert fixed + sum(text_tokens(t) for t in texts) == chat_tokens(MESSAGES)


def test_the_emulator_counts_the_same() -> None:
    for s in labelled_set(per_class=4, seed=3, sizes=(200, 2000)):
        if s.messages is not None:
            assert len(render_chat(s.messages)) == chat_tokens(s.messages)
        else:
            assert s.prompt is not None
            assert len(render_completion(s.prompt)) == completion_tokens(s.prompt)
