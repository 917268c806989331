"""The compiled split + key + probe (compressor/_fast.c) against the numpy path it replaces:
the same values and the same table, slot for slot, on the bench shapes and on any text."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressor import piecetable
from compressor.piecetable import PieceTable, lookup_pieces_fast, lookup_pieces_numpy

fast = pytest.importorskip("compressor._fast")


def _memo() -> tuple[dict[str, int], object]:
    memo: dict[str, int] = {}

    def value(piece: str) -> int:
        return memo.setdefault(piece, len(memo) + 1)

    return memo, value


def _same(texts: list[str], bits: int = 10) -> None:
    """Both paths over the same texts, each with its own table and memo (passes repeat, so
    the second reads what the first inserted)."""
    t_np, t_c = PieceTable(bits=bits), PieceTable(bits=bits)
    _, v_np = _memo()
    _, v_c = _memo()
    for text in texts + texts:
        want = lookup_pieces_numpy(t_np, text, v_np)  # type: ignore[arg-type]
        got = lookup_pieces_fast(fast, t_c, text, v_c)  # type: ignore[arg-type]
        assert got.dtype == want.dtype
        assert got.tolist() == want.tolist()
        assert got.tolist() == [v_np(p) for p in text.split(" ")]  # type: ignore[operator]
        assert t_c.size == t_np.size
        assert np.array_equal(t_c.rows, t_np.rows)


def test_the_compiled_path_is_the_default_unless_pure() -> None:
    assert piecetable._fast is fast or piecetable._fast is None  # FLEETGATE_PURE=1: None


def test_shapes_corpus_texts() -> None:
    from bench.shapes import shape_set

    texts = []
    for s in shape_set(2, seed=7):
        if s.prompt is not None:
            texts.append(s.prompt)
        texts.extend(m["content"] for m in s.messages or [] if isinstance(m.get("content"), str))
    _same(texts, bits=14)


def test_edges() -> None:
    long = "x" * 31
    _same(
        [
            "",
            " ",
            "   ",
            f"{long} {long}y {long}yz {long} {'é' * 15}é {'é' * 16}",
            "a  a\x00 a\x00\x00  é e\u0301 日本語 \ud800 \n\n \t end. " * 3 + "  ",
            " ".join(f"w{i}" for i in range(300)),  # a small table overflows: the dict answers
        ],
        bits=4,
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(
            st.one_of(
                st.text(max_size=40),  # any code point, surrogates and combining marks included
                st.text(alphabet=st.sampled_from("ab \u0301\u200d.é日\x00"), max_size=70),
                st.sampled_from(["", " ", "x" * 31, "x" * 32, "y" * 8, "y" * 24]),
            ),
            max_size=30,
        ).map(" ".join),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from([3, 6, 12]),
)
def test_any_text(texts: list[str], bits: int) -> None:
    _same(texts, bits=bits)


def test_bad_arguments_raise_not_crash() -> None:
    table = PieceTable(bits=4)
    out = np.empty(1, dtype=np.int64)
    found = np.empty(1, dtype=np.bool_)
    with pytest.raises(ValueError):
        fast.probe_pieces(b"a b", table.rows, 15, 60, out, found, out, out)  # 2 pieces
    with pytest.raises(ValueError):
        fast.probe_pieces(b"a", table.rows, 7, 60, out, found, out, out)  # mask ≠ shift
    with pytest.raises(ValueError):
        fast.probe_pieces(b"a", table.rows[:-1], 15, 60, out, found, out, out)
    with pytest.raises(TypeError):
        fast.probe_pieces("a", table.rows, 15, 60, out, found, out, out)
    strided = np.empty(4, dtype=np.int64)[::2]
    two, found2 = np.empty(2, dtype=np.int64), np.empty(2, dtype=np.bool_)
    with pytest.raises((BufferError, ValueError)):
        fast.probe_pieces(b"a b", table.rows, 15, 60, strided, found2, two, two)
    frozen = np.empty(1, dtype=np.int64)
    frozen.setflags(write=False)
    with pytest.raises((BufferError, ValueError)):
        fast.probe_pieces(b"a", table.rows, 15, 60, out, found, out, frozen)
