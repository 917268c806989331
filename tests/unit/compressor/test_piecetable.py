"""The numpy piece table answers exactly what the dict memo answers, piece for piece."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compressor.piecetable import MAX_KEY_BYTES, PieceTable, lookup_spans


class _Ids(dict[str, int]):
    """piece → an id of its own, given on first sight (a memo's `__missing__`)."""

    def __missing__(self, piece: str) -> int:
        self[piece] = len(self) + 1
        return self[piece]


def _check(table: PieceTable, text: str) -> None:
    memo = _Ids()
    for _ in range(2):  # the first pass fills the table, the second reads it
        got = lookup_spans(table, text, memo)[0]
        assert got.tolist() == [memo[p] for p in text.split(" ")]


def test_a_long_piece_never_matches_its_short_prefix() -> None:
    prefix = "x" * MAX_KEY_BYTES
    table = PieceTable(bits=10)
    _check(table, f"{prefix} {prefix}y {prefix}yz {prefix}")


def test_lengths_bytes_and_empty_pieces() -> None:
    _check(
        PieceTable(bits=10), "a  a\x00 a\x00\x00  é e\u0301 日本語 \ud800 \n\n \t end. " * 3 + "  "
    )
    _check(PieceTable(bits=10), "")
    _check(PieceTable(bits=10), " ")


def test_collisions_on_a_small_table_fall_back_to_the_dict() -> None:
    table = PieceTable(bits=4)  # 16 slots for ~60 keys: most probes run out
    _check(table, " ".join(f"w{i}" for i in range(60)))
    assert table.size <= table.capacity


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from("ab \n\t.é日\x00"), max_size=40),
        min_size=1,
        max_size=30,
    )
)
def test_same_values_as_the_dict(parts: list[str]) -> None:
    table = PieceTable(bits=8)
    _check(table, " ".join(parts))
