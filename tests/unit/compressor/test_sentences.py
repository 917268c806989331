"""Unit splitting (compressor/sentences.py): the listed cases, and that units tile the text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressor.sentences import split_units


def units_of(text: str, **kw: object) -> list[str]:
    u = split_units(text, **kw)  # type: ignore[arg-type]
    parts = [u.unit(i) for i in range(len(u))]
    assert "".join(parts) == text
    return parts


def test_simple_sentences_own_their_leading_space() -> None:
    assert units_of("One here. Two there! Three? Four.") == [
        "One here.",
        " Two there!",
        " Three?",
        " Four.",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Dr. Smith arrived. Then he left.",
        "It costs 3.50 dollars. Then he left.",
        "See https://example.com/a.b.html for details. Then he left.",
        "Use it e.g. Python or Rust. Then he left.",
        "The U.S. Army marched. Then he left.",
        "J. R. R. Tolkien wrote it. Then he left.",
        "Version v1.2.3 shipped. Then he left.",
        "Call me at 5 p.m. Tomorrow works. Then he left.",
    ],
)
def test_no_split_inside_abbreviations_decimals_urls(text: str) -> None:
    parts = units_of(text)
    assert parts[-1] == " Then he left."
    head = "".join(parts[:-1])
    # the only other boundary allowed is after "p.m." whose next word is capitalised
    assert len(parts) <= 3
    assert head.startswith(text.split(" ")[0])


def test_lowercase_continuation_is_not_a_boundary() -> None:
    assert units_of("He said no. but then agreed.") == ["He said no. but then agreed."]


def test_cjk_punctuation_splits_without_spaces() -> None:
    assert units_of("这是第一句。这是第二句！第三句？") == [
        "这是第一句。",
        "这是第二句！",
        "第三句？",
    ]


def test_wrapped_lines_continue_but_paragraphs_and_bullets_split() -> None:
    text = "A sentence that wraps\nonto a second line. Next one.\n\nNew paragraph:\n- item one\n- item two\n1. numbered"
    assert units_of(text) == [
        "A sentence that wraps\nonto a second line.",
        " Next one.",
        "\n\nNew paragraph:",
        "\n- item one",
        "\n- item two",
        "\n1. numbered",
    ]


def test_code_block_is_one_unit_and_flagged() -> None:
    code = "```python\ndef f(x):\n    return x. Then y\n\n\nz = 1\n```"
    text = f"Intro here. More text.\n\n{code}\nAfter it. Done."
    u = split_units(text)
    parts = [u.unit(i) for i in range(len(u))]
    assert "".join(parts) == text
    block = [p for p, c in zip(parts, u.code, strict=True) if c]
    assert block == ["\n\n" + code]


def test_unclosed_fence_protects_to_the_end() -> None:
    text = "Intro. More.\n```\nx = 1. Y = 2.\n\nstill code"
    u = split_units(text)
    assert u.code[-1]
    assert u.unit(len(u) - 1).endswith("still code")


def test_long_units_are_cut_at_lines_then_spaces() -> None:
    text = "word " * 1000
    parts = units_of(text.strip(), max_unit_chars=200)
    assert max(len(p) for p in parts) <= 200
    assert len(parts) >= 25


def test_seams_and_frozen_ranges() -> None:
    a, b, c = "First one. Second one.", "<|fixed|> Not. Split. Here.", "Third one. Fourth."
    text = a + b + c
    u = split_units(text, seams=[0, len(a), len(a) + len(b)], frozen=[(len(a), len(a) + len(b))])
    parts = [u.unit(i) for i in range(len(u))]
    assert b in parts
    assert u.fixed[parts.index(b)]
    assert sum(u.fixed) == 1
    assert len(a) in u.starts and len(a) + len(b) in u.starts


@pytest.mark.parametrize(
    "text", ["", "a", " ", "Hello.\n", "\n\nx", "x\n\n\n", "A. B. C.", "  lead"]
)
def test_degenerate_texts_tile(text: str) -> None:
    units_of(text)


_BREAKY = st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x85\xa0\u2028\u3000ab."))


@settings(max_examples=3000, deadline=None)
@given(st.lists(_BREAKY, max_size=40).map("".join), st.data())
def test_break_runs_are_the_any_break_matches(text: str, data: st.DataObject) -> None:
    """_cut_long's line cuts: the starts of `\\s*\\n\\s*`'s matches after `a` in text[a:b],
    with a and b anywhere (inside a whitespace run too)."""
    from compressor.sentences import _ANY_BREAK, _break_runs

    a = data.draw(st.integers(0, len(text)))
    b = data.draw(st.integers(a, len(text)))
    want = [m.start() for m in _ANY_BREAK.finditer(text, a, b) if m.start() > a]
    assert _break_runs(text, a, b) == want
