"""The Analyzer's per-text tokenisation cache (compressor/document.py) changes no result."""

from __future__ import annotations

import numpy as np

from compressor.counting import TokenCounter
from compressor.document import Analyzer, Document
from compressor.tokenizer import cl100k

TEXTS = [
    "\n\nYou are a careful assistant. Answer from the text.",
    "\n\nThe first paragraph  has double spaces.\n    An indented line follows. And more.\n\n"
    "A second paragraph. It ends here.",
    "\n\n- a list item\n- another item: with a colon\n\nWhat does the list say? Thanks!",
]


def same(a: Document, b: Document) -> None:
    assert a.units == b.units and a.offsets == b.offsets and a.n_terms == b.n_terms
    for name in ("group", "tokens", "words", "pu", "pt", "tf", "chunk_pos", "chunk_tokens"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_a_cached_text_analyses_as_an_uncached_one() -> None:
    """Against an analyzer with the same history and no cache (term ids follow the
    order the vocabulary memo met the words in)."""
    warm = Analyzer(TokenCounter(cl100k()))
    plain = Analyzer(TokenCounter(cl100k()), max_cached_pieces=0)
    for a in (warm, plain):
        a.analyse(TEXTS[1:2])  # one text cached alone, then in other company
        a.analyse(TEXTS[::-1], [True, False, False])
    assert warm._texts and not plain._texts
    for frozen in ([False, False, False], [True, False, False], [False, True, True]):
        same(warm.analyse(TEXTS, frozen), plain.analyse(TEXTS, frozen))
        same(warm.analyse(TEXTS, frozen), plain.analyse(TEXTS, frozen))  # all cached now


def test_count_all_is_exact_and_shares_the_cache() -> None:
    analyzer = Analyzer(TokenCounter(cl100k()))
    want = sum(len(cl100k().encode(t)) for t in TEXTS)
    assert analyzer.count_all(TEXTS) == want
    assert analyzer.count_all(TEXTS) == want
    doc = analyzer.analyse(TEXTS)
    assert int(doc.tokens.sum()) == want


def test_the_cache_is_bounded_and_can_be_emptied() -> None:
    analyzer = Analyzer(TokenCounter(cl100k()), max_cached_pieces=40)
    texts = [f"\n\nText number {i} holds a handful of words, nothing more." for i in range(10)]
    for t in texts:
        analyzer.analyse([t])
    assert 0 < analyzer._cached_pieces <= 40
    assert len(analyzer._texts) < len(texts)
    assert texts[-1] in analyzer._texts and texts[0] not in analyzer._texts
    analyzer.forget_texts()
    assert analyzer._cached_pieces == 0 and not analyzer._texts


def test_a_memo_clear_empties_the_cache() -> None:
    """Term ids are renumbered when the chunk memo is cleared: cached ones would clash."""
    analyzer = Analyzer(TokenCounter(cl100k()), max_entries=5)
    analyzer.analyse([TEXTS[1]])
    assert TEXTS[1] in analyzer._texts
    analyzer.analyse([TEXTS[2]])  # the memo is over its bound: cleared first
    assert TEXTS[1] not in analyzer._texts and TEXTS[2] in analyzer._texts
    plain = Analyzer(TokenCounter(cl100k()), max_entries=5, max_cached_pieces=0)
    plain.analyse([TEXTS[1]])
    plain.analyse([TEXTS[2]])
    same(analyzer.analyse(TEXTS), plain.analyse(TEXTS))
