"""Line breaks that are unit boundaries, found with numpy instead of a per-line regex.

compressor/sentences.py cuts units at two kinds of line break, defined by these regular
expressions (kept here as the reference; tests/property/test_linebreaks_properties.py
checks that the vectorised search returns exactly their match starts):

- `LEAD_BREAK`: a blank line, or a next line that opens a list item, heading, quote or
  table row. Its blank-line branch consumes the whole whitespace run, so of a run's
  newlines only the first can match: it does if the run holds another newline (a blank
  line), else if the first character after the run's spaces and tabs opens an item.
- `END_BREAK`: a newline right after terminal punctuation (or after one blank behind it).

Computation: the text's code points as one numpy array (one `str.encode`); newline
positions, whitespace runs and a few characters after each run are then vectorised
tests, ~1.7× faster than the regex engine's per-newline attempts on 35 KB of prose.
Only `\\t`, `\\n` and `" "` are assumed to be whitespace: a text holding any other
whitespace or control character (`\\r`, no-break spaces, …) takes the regex path (the
compiled scan takes it too, with str.isspace's set: the regexes' `\\s`).
Failure posture: exact by construction (the regexes decide whenever the fast path's
assumptions do not hold).
"""

from __future__ import annotations

import re
from bisect import bisect_right

import numpy as np
import numpy.typing as npt

from compressor.compiled import fast as _fast

IntArray = npt.NDArray[np.int64]

LEAD_BREAK = re.compile(  # a blank line, or the next line opens an item, heading, quote, row
    r"""\n(?:[^\S\n]*\n\s*
        |(?=[ \t]*(?:[-*+•‣◦▪–][ \t]|\#{1,6}[ \t]|[>|]|\d{1,3}[.)][ \t]|[a-zA-Z][.)][ \t])))""",
    re.VERBOSE,
)
END_BREAK = re.compile(  # the line ends a sentence or clause
    r"""\n(?:(?<=[.!?:;…。！？"'”’)\]]\n)|(?<=[.!?:;…。！？"'”’)\]][ \t]\n))"""
)
_WINDOW = 8  # characters looked at after a newline's indentation ("######" + blank + 1)
_TAB, _NL, _SPACE, _HASH = 9, 10, 32, ord("#")
_NONE = np.zeros(0, dtype=np.int64)


def _table(chars: str) -> npt.NDArray[np.bool_]:
    table = np.zeros(0x10000, dtype=np.bool_)  # all the sets below are in the BMP
    table[[ord(c) for c in chars]] = True
    return table


_END_MARK = _table(".!?:;…。！？\"'”’)]")
_BULLET = _table("-*+•‣◦▪–")
_OPENS = _table(">|")
_LETTER = _table("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DOT_PAREN = _table(".)")
_BLANK = _table(" \t")
_MAY_OPEN = _table("-*+>|#0123456789")  # with any non-ASCII one: worth the full test
# Whitespace (str.isspace, `\\s`) above U+0020; with the control characters below it,
# their presence sends a text to the regexes.
_ODD_HIGH = _table("".join(c for c in map(chr, range(0x21, 0x10000)) if c.isspace()))


def _is(table: npt.NDArray[np.bool_], codes: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    """Membership per code point; above the BMP as U+FFFF, which no table holds."""
    out: npt.NDArray[np.bool_] = table[np.minimum(codes, 0xFFFF)]
    return out


def _decimal(codes: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    """`\\d` (str.isdecimal) per code point: ASCII ranges, the rare others one by one."""
    out: npt.NDArray[np.bool_] = (codes >= 48) & (codes <= 57)
    high = codes > 127
    if high.any():
        for c in np.unique(codes[high]).tolist():
            if chr(c).isdecimal():
                out |= codes == c
    return out


def _run_length(hit: npt.NDArray[np.bool_]) -> IntArray:
    """Per column, how many leading rows are true."""
    alive = hit[0].copy()
    out: IntArray = alive.astype(np.int64)
    for row in hit[1:]:
        alive &= row
        out += alive
    return out


def _opens_item(cp: npt.NDArray[np.uint32], at: IntArray) -> npt.NDArray[np.bool_]:
    """LEAD_BREAK's lookahead alternatives at positions `at` (past the indentation)."""
    idx = at[None, :] + np.arange(_WINDOW)[:, None]  # row j: the character j after `at`
    w = cp[np.minimum(idx, len(cp) - 1)]
    w[idx >= len(cp)] = 0
    cols = np.arange(len(at))
    c0 = w[0]
    blank1 = _is(_BLANK, w[1])
    ok = (_is(_BULLET, c0) & blank1) | _is(_OPENS, c0)
    ok |= _is(_LETTER, c0) & _is(_DOT_PAREN, w[1]) & _is(_BLANK, w[2])
    hashes = _run_length(w[:7] == _HASH)
    ok |= (hashes >= 1) & (hashes <= 6) & _is(_BLANK, w[hashes, cols])
    digits = _run_length(_decimal(w[:4]))
    d = np.minimum(digits, 3)
    ok |= (digits >= 1) & (digits <= 3) & _is(_DOT_PAREN, w[d, cols]) & _is(_BLANK, w[d + 1, cols])
    return ok


def sep_start(text: str, at: int) -> int:
    """Start of the whitespace run that ends at `at` (the unit boundary owns it)."""
    i = at
    while i > 0 and text[i - 1].isspace():
        i -= 1
    return i


def _floor(seams: list[int], s: int) -> int:
    return seams[bisect_right(seams, s) - 1] if seams and seams[0] <= s else 0


def _regex_breaks(text: str, pattern: re.Pattern[str], seams: list[int]) -> list[int]:
    """Boundary offsets at a pattern's matches, each the start of its separator run; a
    separator run that began in an earlier text is cut at the seam."""
    out = [m.start() for m in pattern.finditer(text)]
    if " \n" not in text and "\t\n" not in text:
        return out  # no line ends in blanks: every run starts at its newline
    for i, s in enumerate(out):
        if text[s - 1 : s] in (" ", "\t"):
            out[i] = max(sep_start(text, s), _floor(seams, s))
    return out


def line_breaks(text: str, seams: list[int]) -> tuple[IntArray, IntArray]:
    """Unit boundaries at LEAD_BREAK's and at END_BREAK's matches: each match start, or
    the start of the blanks before it, but not before the seam (sorted `seams`) of the
    text it is in."""
    if "\n" not in text:
        return _NONE, _NONE
    if _fast is not None:  # the same scan in C (compressor/_fast.c), odd whitespace too
        got = _fast.line_breaks(text, seams, True)
        return np.frombuffer(got[0], dtype=np.int64), np.frombuffer(got[1], dtype=np.int64)
    return _numpy_breaks(text, seams)


def _numpy_breaks(text: str, seams: list[int]) -> tuple[IntArray, IntArray]:
    """`line_breaks` of a text holding a newline, vectorised (the path without the C helper)."""
    cp = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    n = len(cp)
    ws = np.flatnonzero(cp <= _SPACE)
    low = cp[ws]
    is_nl = low == _NL
    odd = bool(((low != _TAB) & ~is_nl & (low != _SPACE)).any())
    if odd or (not text.isascii() and bool(_is(_ODD_HIGH, cp[cp >= 0x85]).any())):
        return (
            np.asarray(_regex_breaks(text, LEAD_BREAK, seams), dtype=np.int64),
            np.asarray(_regex_breaks(text, END_BREAK, seams), dtype=np.int64),
        )
    k = np.flatnonzero(is_nl)
    nl = ws[k]
    # END_BREAK: terminal punctuation before the newline, or before one blank before it
    prev1 = cp[np.maximum(nl - 1, 0)]
    prev2 = cp[np.maximum(nl - 2, 0)]
    end = ((nl >= 1) & _is(_END_MARK, prev1)) | (
        (nl >= 2) & _is(_BLANK, prev1) & _is(_END_MARK, prev2)
    )
    # LEAD_BREAK: whitespace runs; each newline's run ends where the run's last blank is
    run_id = np.cumsum(np.diff(ws, prepend=-2) != 1) - 1
    run_last = np.flatnonzero(np.append(np.diff(run_id) != 0, True))
    nl_run = run_id[k]
    first = np.append(True, nl_run[1:] != nl_run[:-1])
    several = np.append(nl_run[1:] == nl_run[:-1], False)
    after = ws[run_last[nl_run]] + 1  # the first character after the run (n: none)
    lead = first & several
    single = np.flatnonzero(first & ~several & (after < n))
    if len(single):  # most lines open with a word: test the full window only where it may matter
        c0 = cp[after[single]]
        c1 = cp[np.minimum(after[single] + 1, n - 1)]
        maybe = _is(_MAY_OPEN, c0) | (c0 > 127) | (_is(_LETTER, c0) & _is(_DOT_PAREN, c1))
        single = single[maybe]
        lead[single] = _opens_item(cp, after[single])
    # a break after blanks starts at the blanks (those of its own text only)
    at = nl.copy()
    blank = np.flatnonzero((nl >= 1) & _is(_BLANK, prev1))
    if len(blank):
        run_first = np.flatnonzero(np.append(True, np.diff(run_id) != 0))
        at[blank] = ws[run_first[nl_run[blank]]]
        if seams:
            s = np.asarray(seams, dtype=np.int64)
            j = np.searchsorted(s, nl[blank], side="right") - 1
            at[blank] = np.maximum(at[blank], np.where(j >= 0, s[np.maximum(j, 0)], 0))
    return at[lead], at[end]
