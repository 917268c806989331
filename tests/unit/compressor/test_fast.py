"""The compiled passes (compressor/_fast.c) against the numpy/Python path they replace: the
same values, the same table slot for slot and the same chunk counts, on the bench shapes
and on any text; bad arguments raise, and memory stays flat over many calls."""

from __future__ import annotations

import resource
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressor import compiled
from compressor.counting import TokenCounter
from compressor.piecetable import PieceTable, lookup_pieces_fast, lookup_pieces_numpy
from compressor.tokenizer import cl100k

fast = pytest.importorskip("compressor._fast")


class _Ids(dict[str, int]):
    """piece → an id of its own, given on first sight (a memo's `__missing__`)."""

    def __missing__(self, piece: str) -> int:
        self[piece] = len(self) + 1
        return self[piece]


def _same_lookup(texts: list[str], bits: int = 10) -> None:
    """Both look-ups over the same texts, each with its own table and memo (passes repeat,
    so the second reads what the first inserted)."""
    t_np, t_c = PieceTable(bits=bits), PieceTable(bits=bits)
    m_np, m_c = _Ids(), _Ids()
    for text in texts + texts:
        want, spans_np = lookup_pieces_numpy(t_np, text, m_np)
        got, spans_c = lookup_pieces_fast(fast, t_c, text, m_c)
        assert got.dtype == want.dtype
        assert got.tolist() == want.tolist()
        assert got.tolist() == [m_np[p] for p in text.split(" ")]
        assert spans_c.raw == spans_np.raw
        assert spans_c.starts.tolist() == spans_np.starts.tolist()
        assert spans_c.ends.tolist() == spans_np.ends.tolist()
        assert t_c.size == t_np.size
        assert np.array_equal(t_c.rows, t_np.rows)


def _same_counts(texts: list[str], counters: tuple[TokenCounter, TokenCounter]) -> None:
    """`piece_counts_of` (compiled) against `piece_counts_in` (Python) on the texts joined as
    compressor/document.py joins a document's texts (each text's first piece a head), each
    counter with its own memo (so the compiled pass meets misses: empty memo first)."""
    joined = " ".join(texts)
    heads, n = [], 0
    for t in texts:
        heads.append(n)
        n += t.count(" ") + 1
    c_counter, py_counter = counters
    packed, spans = lookup_pieces_numpy(PieceTable(bits=6), joined, c_counter._packed)
    got, got_glued = c_counter.piece_counts_of(joined, packed, spans, heads)
    want, want_glued = py_counter.piece_counts_in(joined, packed, heads)
    assert got.tolist() == want.tolist()
    assert got_glued.tolist() == want_glued.tolist()
    cl = cl100k()
    assert int(got.sum()) == sum(len(cl.encode(t)) for t in texts)


def test_the_compiled_path_is_the_default_unless_pure() -> None:
    assert compiled.fast is fast or compiled.fast is None  # FLEETGATE_PURE=1: None


@lru_cache(maxsize=1)
def _corpus_texts() -> list[str]:
    from tests.shapes import shape_set

    texts = []
    for s in shape_set(2, seed=7):
        if s.prompt is not None:
            texts.append(s.prompt)
        texts.extend(m["content"] for m in s.messages or [] if isinstance(m.get("content"), str))
    return texts


def test_shapes_corpus_texts() -> None:
    texts = _corpus_texts()
    _same_lookup(texts, bits=14)
    counters = (TokenCounter(cl100k()), TokenCounter(cl100k()))
    for k in range(0, len(texts), 3):  # documents of 1-3 texts, the memo warming up
        _same_counts(texts[k : k + 3], counters)


_EDGES = [
    "",
    " ",
    "   ",
    f"{'x' * 31} {'x' * 31}y {'x' * 31}yz {'x' * 31} {'é' * 15}é {'é' * 16}",
    "a  a\x00 a\x00\x00  é e\u0301 日本語 \ud800 \n\n \t end. " * 3 + "  ",
    " ".join(f"w{i}" for i in range(300)),  # a small table overflows: the dict answers
    "\n\nRaises\n------\nValueError\n   x",  # a text opening with a glued run
    "  lead",
    "tail \n",
    "\x00 \x00  \x00\n \U0010ffff \ufffe " + "z" * 5000 + "  " + "é" * 3000,
]


def test_edges() -> None:
    _same_lookup(_EDGES, bits=4)
    for k in range(len(_EDGES)):
        counters = (TokenCounter(cl100k()), TokenCounter(cl100k()))
        _same_counts(_EDGES[k:], counters)
        _same_counts(_EDGES[k : k + 1], counters)


_PIECES = st.one_of(
    st.text(max_size=40),  # any code point, surrogates and combining marks included
    st.text(alphabet=st.sampled_from("ab \u0301\u200d.é日\x00\n\t"), max_size=70),
    st.sampled_from(["", " ", "x" * 31, "x" * 32, "y" * 8, "y" * 24, "\n", "\n  ", "a.\n\n"]),
)
_TEXTS = st.lists(st.lists(_PIECES, max_size=30).map(" ".join), min_size=1, max_size=4)


@settings(max_examples=300, deadline=None)
@given(_TEXTS, st.sampled_from([3, 6, 12]))
def test_any_text_looks_up_the_same(texts: list[str], bits: int) -> None:
    _same_lookup(texts, bits=bits)


@settings(max_examples=300, deadline=None)
@given(_TEXTS)
def test_any_text_counts_the_same(texts: list[str]) -> None:
    texts = [
        t.encode("utf-8", "replace").decode("utf-8") for t in texts
    ]  # tiktoken: no lone surrogates
    _same_counts(texts, (TokenCounter(cl100k()), TokenCounter(cl100k())))


def test_bad_arguments_raise_not_crash() -> None:
    table = PieceTable(bits=4)
    out = np.empty(1, dtype=np.int64)
    found = np.empty(1, dtype=np.bool_)
    memo: dict[str, int] = {}
    with pytest.raises(ValueError):
        fast.probe_pieces(b"a b", table.rows, 15, 60, memo, out, found, out, out)  # 2 pieces
    with pytest.raises(ValueError):
        fast.probe_pieces(b"a", table.rows, 7, 60, memo, out, found, out, out)  # mask ≠ shift
    with pytest.raises(ValueError):
        fast.probe_pieces(b"a", table.rows[:-1], 15, 60, memo, out, found, out, out)
    with pytest.raises(TypeError):
        fast.probe_pieces("a", table.rows, 15, 60, memo, out, found, out, out)
    with pytest.raises(TypeError):
        fast.probe_pieces(b"a", table.rows, 15, 60, [], out, found, out, out)
    strided = np.empty(4, dtype=np.int64)[::2]
    two, found2 = np.empty(2, dtype=np.int64), np.empty(2, dtype=np.bool_)
    with pytest.raises((BufferError, ValueError)):
        fast.probe_pieces(b"a b", table.rows, 15, 60, memo, strided, found2, two, two)
    frozen = np.empty(1, dtype=np.int64)
    frozen.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):
        fast.probe_pieces(b"a", table.rows, 15, 60, memo, out, found, out, frozen)
    long_value = {"y" * 40: "not an int"}
    v2, f2, s2, e2 = (np.empty(1, dtype=t) for t in ("i8", "?", "i8", "i8"))
    with pytest.raises(TypeError):
        fast.probe_pieces(b"y" * 40, table.rows, 15, 60, long_value, v2, f2, s2, e2)


def _chunk_args(raw: bytes, starts: list[int], ends: list[int], heads: list[int]) -> tuple:
    n = len(starts)
    i8 = np.int64
    packed = np.zeros(n, dtype=i8)
    return (
        raw, np.asarray(starts, dtype=i8), np.asarray(ends, dtype=i8), packed,
        np.asarray(heads, dtype=i8), {}, {}, np.empty(n, dtype=i8), np.empty(n, dtype=i8),
    )  # fmt: skip


def test_chunk_counts_rejects_bad_spans_and_heads() -> None:
    ok = _chunk_args(b"a b", [0, 2], [1, 3], [0])
    assert fast.chunk_counts(*ok)[0] == 0
    bad = [
        _chunk_args(b"a b", [0, 2], [1, 4], [0]),  # past the end
        _chunk_args(b"a b", [0, 3], [1, 2], [0]),  # start after end
        _chunk_args(b"a b", [-1, 2], [1, 3], [0]),
        _chunk_args(b"a b", [0, 2], [1, 3], [1]),  # not from piece 0
        _chunk_args(b"a b", [0, 2], [1, 3], [0, 0]),  # not ascending
        _chunk_args(b"a b", [0, 2], [1, 3], [0, 2]),  # past the last piece
        _chunk_args(b"a b", [0, 2], [1, 3], []),
        _chunk_args(b"", [], [], [0]),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            fast.chunk_counts(*args)
    wrong = list(ok)
    wrong[8] = np.empty(1, dtype=np.int64)  # glued: too short
    with pytest.raises(ValueError):
        fast.chunk_counts(*wrong)
    glue = list(ok)
    glue[3] = np.full(2, 1 << 42, dtype=np.int64)  # piece 0 ends in whitespace: 1 is glued
    glue[6] = {"a b": "x"}  # the run opens the text: its chunk's count, not an int
    with pytest.raises(TypeError):
        fast.chunk_counts(*glue)


def _rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_memory_stays_flat_over_many_calls() -> None:
    """No reference or buffer leaks: 20,000 calls on texts with misses, long pieces and
    glued runs (every call makes strings and a miss list) leave the peak RSS where the
    first 2,000 put it."""
    counter = TokenCounter(cl100k())
    text = "A  b\n  c " + "w" * 40 + " d.\n\n " + " ".join(f"v{i}" for i in range(50))
    texts = [text, text + " tail", "  " + text]

    def calls(n: int) -> None:
        for i in range(n):
            t = texts[i % 3] + str(i % 7)
            packed, spans = lookup_pieces_fast(fast, PieceTable(bits=6), t, counter._packed)
            counter.piece_counts_of(t, packed, spans, [0])
            odd = t.replace("\n", "\xa0\n", 1)  # odd whitespace: the any_space scan
            fast.line_breaks(odd, [0, 3], True)
            fast.has_fence_marker(odd + "```")
            fast.count_spaces(odd)
            fast.count_spaces(odd.encode())

    calls(2000)
    before = _rss_kb()
    calls(20000)
    assert _rss_kb() - before < 2048


_PACKED = st.lists(
    st.tuples(
        st.integers(0, 1 << 20) | st.sampled_from([0, 1, 31, 32]),  # length
        st.integers(0, (1 << 18) - 1) | st.just(0),  # term id + 1
        st.integers(0, 3),  # sentence flags
        st.booleans(),  # starts a text
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_PACKED)
def test_piece_features_are_the_numpy_ones(rows: list[tuple[int, int, int, bool]]) -> None:
    from compressor import document

    shift = document.USER_SHIFT
    packed = np.asarray(
        [(n << 20) | (t << shift) | (f << document._FLAG_SHIFT) for n, t, f, _ in rows],
        dtype=np.int64,
    )
    heads = np.asarray([0] + [j for j, r in enumerate(rows) if r[3] and j], dtype=np.int64)
    n = len(packed)
    got = [np.empty(n, dtype=np.int64) for _ in range(3)]
    fast.piece_features(packed, heads, shift, document._FLAG_SHIFT, 4, *got)
    lengths = (packed >> 20) & ((1 << 22) - 1)
    want_pos = document.piece_offsets(lengths, heads)
    want_terms = ((packed >> shift) & ((1 << 18) - 1)) - 1
    want_flags = (packed >> document._FLAG_SHIFT) | np.where(lengths > 0, 4, 0)
    assert got[0].tolist() == want_pos.tolist()
    assert got[1].tolist() == want_flags.tolist()
    assert got[2].tolist() == want_terms.tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=12).map(sorted),
    st.lists(st.tuples(st.integers(0, 45), st.integers(-1, 300)), max_size=80),
)
def test_unit_terms_are_the_numpy_matrix(
    unit_starts: list[int], pieces: list[tuple[int, int]]
) -> None:
    from compressor import document

    starts = np.asarray([0, *unit_starts], dtype=np.int64)
    pieces = sorted(pieces, key=lambda p: p[0])  # pieces come in text order
    pos = np.asarray([p for p, _ in pieces], dtype=np.int64)
    terms = np.asarray([t for _, t in pieces], dtype=np.int64)
    m, n = len(starts), len(pos)
    words = np.empty(m, dtype=np.int64)
    pu, pt, tf = (np.empty(n, dtype=np.int64) for _ in range(3))
    k, v = fast.unit_terms(starts, pos, terms, words, pu, pt, tf)
    unit_of = np.searchsorted(starts, pos, side="right") - 1
    assert words.tolist() == np.bincount(unit_of, minlength=m).tolist()
    has = terms >= 0
    w_pu, w_pt, w_tf, w_v = document._sparse(unit_of[has], terms[has], m)
    assert (pu[:k].tolist(), pt[:k].tolist(), tf[:k].tolist(), v) == (
        w_pu.tolist(), w_pt.tolist(), w_tf.tolist(), w_v,
    )  # fmt: skip


def test_unit_terms_refuse_what_is_not_a_document() -> None:
    i8 = np.int64
    one = np.zeros(1, dtype=i8)

    def call(starts: list[int], pos: list[int], terms: list[int]) -> object:
        n = len(pos)
        outs = [np.empty(n, dtype=i8) for _ in range(3)]
        return fast.unit_terms(
            np.asarray(starts, dtype=i8), np.asarray(pos, dtype=i8),
            np.asarray(terms, dtype=i8), np.empty(len(starts), dtype=i8), *outs,
        )  # fmt: skip

    assert call([0, 5], [6, 1], [1, 2]) is None  # units out of order: the numpy path
    with pytest.raises(ValueError):
        call([3], [1], [1])  # a piece before the first unit
    with pytest.raises(ValueError):
        call([5, 0], [6], [1])  # unit starts descend
    with pytest.raises(ValueError):
        call([0], [1], [1 << 19])  # a term id no memo gives
    with pytest.raises(ValueError):
        fast.unit_terms(one, one, one, one, one, one, np.empty(2, dtype=i8))


def test_count_all_joins_long_texts_exactly() -> None:
    cl = cl100k()
    texts = [t.encode("utf-8", "replace").decode("utf-8") for t in _EDGES + _corpus_texts()[:6]]
    for k in range(len(texts)):
        group = texts[k : k + 4]
        assert TokenCounter(cl).count_all(group) == sum(len(cl.encode(t)) for t in group)


_LINES = st.lists(
    st.one_of(
        st.sampled_from(list(" \t\n\n\n-*+•‣◦▪–#>|.)!?:;…。！？\"'”’]aZx017٣𝟎\x00\r\xa0\u2028")),
        st.sampled_from(["\n- ", "\n  * ", "\n## ", "\n####### ", "\n12. ", "\n1234. ", "\na) "]),
        st.text(max_size=5),
    ),
    max_size=60,
).map("".join)


@settings(max_examples=1000, deadline=None)
@given(_LINES, st.data())
def test_line_breaks_are_the_numpy_ones(text: str, data: st.DataObject) -> None:
    from compressor import linebreaks

    text = "\n" + text  # the path both take only for a text with a newline
    seams = sorted(set(data.draw(st.lists(st.integers(0, len(text) - 1), max_size=3))))
    got = fast.line_breaks(text, seams)
    if got is None:  # odd whitespace: both leave it to the regexes
        cp = [ord(c) for c in text]
        assert any((c <= 32 and c not in (9, 10, 32)) or (c > 32 and chr(c).isspace()) for c in cp)
        return
    lead, end = linebreaks._numpy_breaks(text, seams)
    assert np.frombuffer(got[0], dtype=np.int64).tolist() == lead.tolist()
    assert np.frombuffer(got[1], dtype=np.int64).tolist() == end.tolist()


# str.isspace's characters the regexes' \\s takes and " \t\n" do not (C0 separators, NEL,
# no-break and ideographic spaces, line and paragraph separators), around the patterns' marks
_ODD_LINES = st.lists(
    st.one_of(
        st.sampled_from(list(" \t\n\n\n-*+•#>|.)!?:;…。\"'”’]aZ1٣𝟎\x00\x01")),
        st.sampled_from(list("\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u2000\u2028\u2029\u3000")),
        st.sampled_from(["\n- ", "\n  * ", "\n## ", "\n12. ", "\na) ", ".\n", ". \n", "\n\xa0- "]),
        st.text(max_size=4),
    ),
    max_size=60,
).map("".join)


@settings(max_examples=2000, deadline=None)
@given(_ODD_LINES, st.data())
def test_line_breaks_with_any_whitespace_are_the_regexes(text: str, data: st.DataObject) -> None:
    """any_space: a text holding odd whitespace is scanned in C with str.isspace's set and
    gives exactly the reference regexes' offsets (what the pure path returns for it)."""
    from compressor.linebreaks import END_BREAK, LEAD_BREAK, _regex_breaks

    seams = sorted(set(data.draw(st.lists(st.integers(0, max(len(text) - 1, 0)), max_size=3))))
    got = fast.line_breaks(text, seams, True)
    assert got is not None
    assert np.frombuffer(got[0], dtype=np.int64).tolist() == _regex_breaks(text, LEAD_BREAK, seams)
    assert np.frombuffer(got[1], dtype=np.int64).tolist() == _regex_breaks(text, END_BREAK, seams)
    if fast.line_breaks(text, seams) is not None:  # no odd whitespace: the two modes agree
        assert fast.line_breaks(text, seams) == got


def test_line_breaks_with_any_whitespace_on_each_character() -> None:
    """Each code point of the BMP's whitespace-bearing blocks between blanks, newlines and
    marks: the C scan equals the regexes (str.isspace's set, not a list of its own)."""
    from compressor.linebreaks import END_BREAK, LEAD_BREAK, _regex_breaks

    for c in [*range(0x3100), 0xFEFF, 0x10FFFF]:
        ch = chr(c)
        for text in (f"a.{ch}\n- b", f"a. \n{ch}\nb", f"x{ch} \n# h", f"\n{ch}1. y\n"):
            lead, end = fast.line_breaks(text, [0, 1], True)
            assert np.frombuffer(lead, dtype=np.int64).tolist() == _regex_breaks(
                text, LEAD_BREAK, [0, 1]
            ), hex(c)
            assert np.frombuffer(end, dtype=np.int64).tolist() == _regex_breaks(
                text, END_BREAK, [0, 1]
            ), hex(c)


def test_line_breaks_refuse_bad_seams() -> None:
    with pytest.raises(ValueError):
        fast.line_breaks("a\nb", [2, 1])
    with pytest.raises(TypeError):
        fast.line_breaks("a\nb", [None])
    with pytest.raises(TypeError):
        fast.line_breaks(b"a\nb", [])
    assert fast.line_breaks("a.\n", []) == (b"", np.asarray([2], dtype=np.int64).tobytes())
    with pytest.raises(TypeError):
        fast.line_breaks("a\nb", [], True, 1)


def test_insert_pieces_refuses_what_is_not_a_keyed_piece() -> None:
    table = PieceTable(bits=4)
    i8 = np.int64

    def call(raw: bytes, starts: list[int], ends: list[int], at: list[int]) -> object:
        return fast.insert_pieces(
            raw, np.asarray(starts, dtype=i8), np.asarray(ends, dtype=i8),
            np.asarray(at, dtype=i8), np.ones(len(at), dtype=i8), table.rows, 15, 60,
        )  # fmt: skip

    assert call(b"ab cd", [0, 3], [2, 5], [1]) == 1
    for bad in (
        (b"ab cd", [0, 3], [2, 5], [2]),  # no piece 2
        (b"ab cd", [0, 3], [2, 6], [1]),  # past the end
        (b"x" * 40, [0], [40], [0]),  # too long for a key
        (b"ab cd", [0, 3], [2, 5], [-1]),
    ):
        with pytest.raises(ValueError):
            call(*bad)
    with pytest.raises(ValueError):
        fast.insert_pieces(b"a", np.zeros(1, i8), np.ones(1, i8), np.zeros(1, i8),
                           np.zeros(1, i8), table.rows[:-5], 15, 60)  # fmt: skip
    frozen = table.rows.copy()
    frozen.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):
        fast.insert_pieces(b"a", np.zeros(1, i8), np.ones(1, i8), np.zeros(1, i8),
                           np.zeros(1, i8), frozen, 15, 60)  # fmt: skip


@lru_cache(maxsize=1)
def _analyzer() -> object:
    from compressor.document import Analyzer

    return Analyzer()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab cd ef gh. \nXY"), max_size=200), max_size=3))
def test_textrank_floats_are_numpy_s_bit_for_bit(extra: list[str]) -> None:
    from compressor import scoring
    from compressor.document import Analyzer

    analyzer = _analyzer()
    assert isinstance(analyzer, Analyzer)
    texts = [*_corpus_texts()[:2], *extra]
    for k in range(len(texts)):
        doc = analyzer.analyse(texts[k:])
        with_c = scoring.scores(doc)
        scoring._fast = None
        try:
            without = scoring.scores(doc)
        finally:
            scoring._fast = compiled.fast
        assert with_c.tobytes() == without.tobytes()


def test_textrank_refuses_entries_outside_the_matrix() -> None:
    i8, f8 = np.int64, np.float64
    one = np.zeros(1, dtype=f8)
    with pytest.raises(ValueError):
        fast.textrank(np.asarray([1], i8), np.asarray([0], i8), one, one, one, one.copy(),
                      0.1, 0.85, 3, 1)  # fmt: skip
    with pytest.raises(ValueError):
        fast.textrank(np.asarray([0], i8), np.asarray([1], i8), one, one, one, one.copy(),
                      0.1, 0.85, 3, 1)  # fmt: skip
    with pytest.raises(ValueError):
        fast.textrank(np.asarray([0], i8), np.asarray([0], i8), one, one, one, one.copy(),
                      0.1, 0.85, 3, -1)  # fmt: skip


def test_the_odd_whitespace_list_is_str_isspace_s() -> None:
    """_fast.c's odd_char names str.isspace's characters above U+0020 one by one: a text
    holding any of them (or a control character) goes to the regexes."""
    for c in [*range(0x21), *range(0x21, 0x3100, 1), 0xFEFF, 0x10FFFF]:
        got = fast.line_breaks("a\n" + chr(c), [])
        odd = (c <= 32 and chr(c) not in " \t\n") or (c > 32 and chr(c).isspace())
        assert (got is None) == odd, hex(c)
    assert [c for c in range(0x3100, 0x110000) if chr(c).isspace()] == []


_CODEY = st.lists(
    st.one_of(
        st.sampled_from([" = ", " = = ", "()", "(()", "return ", "rreturn ", "def ", "ddef ",
                         ". ", ", ", ">>> ", ">>>> ", "\n", ":\n", ")\n", ",\n", "x", " ", "="]),
        st.text(max_size=4),
    ),
    max_size=60,
).map("".join)  # fmt: skip


@settings(max_examples=1000, deadline=None)
@given(_CODEY)
def test_code_counts_are_str_count_s(s: str) -> None:
    from compressor import content

    c = s.count
    code = len(content._CODE_ENDINGS.findall(s)) + c(" = ") + c("()") + c("return ") + c("def ")
    assert fast.code_counts(s) == (code, c(">>> "), c(". ") + c(", "), c("\n"))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text(alphabet=st.sampled_from("ab c. D\n\n  \t-é"), max_size=300), max_size=4),
    st.lists(st.booleans(), min_size=1, max_size=400),
)
def test_kept_segments_are_exact_py_s(extra: list[str], keep_bits: list[bool]) -> None:
    from compressor import exact
    from compressor.compress import _spans
    from compressor.document import Analyzer

    analyzer = _analyzer()
    assert isinstance(analyzer, Analyzer)
    texts = [*_corpus_texts()[:1], "", *extra]
    doc = analyzer.analyse(texts)
    keep = np.resize(np.asarray(keep_bits, dtype=np.bool_), len(doc))
    spans = _spans(doc, keep)
    got = exact.kept_tokens(doc, spans, analyzer.counter)
    exact._fast = None
    try:
        want = exact.kept_tokens(doc, spans, analyzer.counter)
    finally:
        exact._fast = compiled.fast
    assert got == want


def test_kept_segments_refuse_spans_outside_the_text() -> None:
    i8 = np.int64
    cs, n = np.asarray([0, 2], dtype=i8), np.asarray([1, 1], dtype=i8)

    def call(a: list[int], b: list[int], hard: list[int]) -> object:
        return fast.kept_segments(
            "ab cd", np.asarray(a, dtype=i8), np.asarray(b, dtype=i8),
            np.asarray(hard, dtype=i8), cs, n,
        )  # fmt: skip

    assert call([0], [5], [1]) == (2, [])
    assert call([0, 3], [2, 5], [1, 0]) == (0, ["abcd"])  # "c" after "b": one new string
    assert call([0, 2], [2, 5], [1, 0]) == (2, [])  # " cd" after "b": a safe cut, both known
    for bad in (([0], [6], [1]), ([3], [2], [1]), ([-1], [2], [1])):
        with pytest.raises(ValueError):
            call(*bad)
    with pytest.raises(ValueError):
        fast.kept_segments("ab", np.zeros(1, i8), np.ones(1, i8), np.ones(1, i8),
                           np.zeros(0, i8), np.zeros(0, i8))  # fmt: skip


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(["`", "~", "``", "~~", "\n", " ", "a", "é", "€", "𝟎"]),
                  st.text(max_size=3)),
        max_size=40,
    ).map("".join)
)  # fmt: skip
def test_has_fence_marker_is_the_substring_test(text: str) -> None:
    """Any string of any kind (1, 2, 4 bytes a character), a marker at either end."""
    for t in (text, text + "```", "~~~" + text, text[:-1]):
        assert fast.has_fence_marker(t) is ("```" in t or "~~~" in t)


def test_has_fence_marker_refuses_what_is_not_a_str() -> None:
    with pytest.raises(TypeError):
        fast.has_fence_marker(b"```")
    with pytest.raises(TypeError):
        fast.has_fence_marker()


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" a\t\x00\xa0\xe9\xff€\u3000𝟎 ")), max_size=80))
def test_count_spaces_is_str_count(text: str) -> None:
    """Any kind of str, and its UTF-8 bytes; lengths around the 8-byte words it reads."""
    for t in (text, text * 9):
        assert fast.count_spaces(t) == t.count(" ")
        assert fast.count_spaces(t.encode("utf-8", "surrogatepass")) == t.count(" ")


def test_count_spaces_over_many_words() -> None:
    """Past 255 words per lane sum (where a lane could overflow) and at every tail."""
    for n in (0, 1, 7, 8, 9, 2039, 2040, 2041, 100_003):
        assert fast.count_spaces(" " * n) == n
        assert fast.count_spaces(b" " * n) == n
        assert fast.count_spaces(memoryview(b"x " * n)) == n
    with pytest.raises(TypeError):
        fast.count_spaces(3)
