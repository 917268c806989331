"""The vectorised line-break search equals its reference regexes (compressor/linebreaks.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from compressor.linebreaks import END_BREAK, LEAD_BREAK, _regex_breaks, line_breaks

# What the patterns look at around a newline: blanks, blank lines, item markers (bullets,
# headings, numbering, quotes, rows), terminal punctuation, digits of other scripts and
# the whitespace that sends a text to the regex path.
_ALPHABET = st.sampled_from(
    list(" \t\n\n\n")
    + list("-*+•‣◦▪–#>|.)!?:;…。！？\"'”’]")
    + list("aZx017٣")
    + ["\r", "\xa0", "\u3000", "\x0b"]
)
_WORDS = st.sampled_from(
    ["\n- ", "\n  * ", "\n## ", "\n####### ", "\n12. ", "\n1234. ", "\na) ", "\n> ", "end.\n"]
)
_TEXT = st.lists(st.one_of(_ALPHABET, _WORDS), max_size=50).map("".join)


@settings(max_examples=3000, deadline=None)
@given(_TEXT, st.data())
def test_line_breaks_equal_the_regexes(text: str, data: st.DataObject) -> None:
    seams = sorted(set(data.draw(st.lists(st.integers(0, max(len(text) - 1, 0)), max_size=3))))
    lead, end = line_breaks(text, seams)
    assert lead.tolist() == _regex_breaks(text, LEAD_BREAK, seams)
    assert end.tolist() == _regex_breaks(text, END_BREAK, seams)


@settings(max_examples=500, deadline=None)
@given(_TEXT)
def test_line_breaks_without_odd_whitespace(text: str) -> None:
    text = text.replace("\r", "").replace("\xa0", " ").replace("\u3000", "\t")
    text = text.replace("\x0b", "\n")
    lead, end = line_breaks(text, [0])
    assert lead.tolist() == _regex_breaks(text, LEAD_BREAK, [0])
    assert end.tolist() == _regex_breaks(text, END_BREAK, [0])


def test_no_whitespace_outside_the_tables() -> None:
    # the fast path assumes every whitespace character is in the Basic Multilingual Plane
    assert not any(chr(c).isspace() for c in range(0x10000, 0x110000))


def test_no_table_holds_the_code_point_that_stands_for_the_astral_planes() -> None:
    from compressor import linebreaks

    tables = [v for k, v in vars(linebreaks).items() if k.isupper() and hasattr(v, "dtype")]
    assert len(tables) >= 7
    assert not any(bool(t[0xFFFF]) for t in tables if len(t) == 0x10000)
