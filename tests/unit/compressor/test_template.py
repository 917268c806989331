"""The chat template (compressor/template.py) renders one fixed layout, in one piece or in
editable segments that join to the same string."""

from __future__ import annotations

from compressor.template import content_text, render_chat, segments

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Part one."},
            {"type": "image_url", "image_url": {}},
            {"type": "text", "text": "Part two."},
        ],
    },
    {"role": "assistant", "content": None, "tool_calls": []},
    {"role": "tool", "content": "Found it."},
]


def test_render_layout() -> None:
    assert render_chat([{"role": "user", "content": "Hi"}]) == "<|user|>\nHi</s>\n<|assistant|>\n"
    assert render_chat(MESSAGES) == (
        "<|system|>\nBe brief.</s>\n<|user|>\nPart one.\nPart two.</s>\n"
        "<|assistant|>\n</s>\n<|tool|>\nFound it.</s>\n<|assistant|>\n"
    )


def test_content_text_keeps_only_text_parts() -> None:
    assert content_text(MESSAGES[1]["content"]) == "Part one.\nPart two."
    assert content_text(None) == ""


def test_segments_join_to_the_rendering_and_tag_editable_texts() -> None:
    segs, slots = segments(MESSAGES, lambda i, role, text: role != "system")
    assert "".join(segs) == render_chat(MESSAGES)
    tagged = {slot: seg for seg, slot in zip(segs, slots, strict=True) if slot is not None}
    assert tagged == {(1, 0): "Part one.", (1, 2): "Part two.", (3, None): "Found it."}
