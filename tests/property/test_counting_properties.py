"""The memoised chunk counter agrees with tiktoken on every string (compressor/counting.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compressor.counting import TokenCounter
from compressor.tokenizer import cl100k

# Characters that stress the pre-tokenizer: every kind of whitespace it distinguishes,
# letters, digits, punctuation, apostrophes (contractions) and a few non-Latin scripts.
_ALPHABET = st.sampled_from(
    list(" \t\n\r\x0b\x0c\xa0\u2028\u3000")
    + list("aZ'sdmtlv019.,;:!?()-_*#`\"")
    + list("éßЖж中文。！")
)
_WORDS = st.sampled_from(
    [
        "the",
        " The",
        "don't",
        "we'll",
        "I'M",
        "12345",
        "3.14",
        "https://x.org/a.b",
        "  ",
        "\n\n",
        "\n\t",
        "\n    ",
        " \n",
        "\t ",
    ]
)

_TEXT = st.lists(st.one_of(_ALPHABET, _WORDS), max_size=60).map("".join)


@settings(max_examples=3000, deadline=None)
@given(_TEXT)
def test_count_equals_tiktoken(text: str) -> None:
    counter = TokenCounter(cl100k())
    assert counter.count(text) == len(cl100k().encode(text))


@settings(max_examples=300, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=8))
def test_count_is_stable_under_a_shared_memo(texts: list[str]) -> None:
    counter = TokenCounter(cl100k(), max_entries=16)
    for _ in range(2):
        for text in texts:
            assert counter.count(text) == len(cl100k().encode(text))


def test_count_of_real_prose_and_code() -> None:
    import inspect
    import textwrap

    counter = TokenCounter(cl100k())
    for text in (
        inspect.getsource(textwrap),
        textwrap.__doc__ or "",
        "a\n\t b",
        "a\n    b",
        "x\t ",
    ):
        assert counter.count(text) == len(cl100k().encode(text))


_DOC = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "The cat sat.",
                "A dog ran!",
                "Why?",
                "e.g. this",
                "x = 1",
                "  indented line",
                "- item",
                "1. first",
            ]
        ),
        _TEXT,
    ),
    min_size=1,
    max_size=30,
).map(
    lambda parts: "".join(
        p + sep for p, sep in zip(parts, [" ", "\n", "\n\n", " ", "\n  "] * 8, strict=False)
    )
)


@settings(max_examples=400, deadline=None)
@given(_DOC, st.lists(st.booleans(), min_size=1, max_size=80))
def test_kept_tokens_is_the_exact_count_of_any_selection(text: str, mask: list[bool]) -> None:
    import numpy as np

    from compressor.compress import _assemble, _spans
    from compressor.document import Analyzer
    from compressor.exact import kept_tokens

    analyzer = Analyzer(TokenCounter(cl100k()))
    doc = analyzer.analyse([text])
    assert int(doc.tokens.sum()) == len(cl100k().encode(text))
    keep = np.resize(np.asarray(mask, dtype=bool), len(doc))
    spans = _spans(doc, keep)
    out = "".join(_assemble(doc, spans))
    assert kept_tokens(doc, spans, analyzer.counter) == len(cl100k().encode(out))
