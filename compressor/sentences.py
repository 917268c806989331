"""Unicode-aware sentence splitting into *units*: the things the compressor keeps or drops.

FleetOpt §5.2 step 1. A unit is a sentence, a line of a list or table, or a whole fenced
code block. Units tile the text: unit i is `text[starts[i]:starts[i+1]]` and owns the
whitespace *before* it, so joining any subset in order gives natural separators (a kept
paragraph-opening sentence brings its blank line, a mid-paragraph one its space) and
joining all of them gives the text back byte for byte.

Boundaries (no per-line or per-word Python loop: a 50 KB prompt splits in ~0.5 ms):
- sentence ends: a space-delimited word ending in `.` `!` `?` `…` (plus closing quotes or
  brackets) followed, after spaces, by a word starting with an uppercase letter, digit,
  opening quote/bracket or a caseless script. A `.` ending a known abbreviation ("Dr.",
  "e.g.", "Fig."), an initial ("J."), list numbering ("1.") or a dotted acronym ("U.S.")
  is not an end. Decimals (3.14), URLs and file names (example.com/a.b) have no space
  after the dot and are never split. Each distinct word's flags are computed once
  (`piece_flags`, memoised by compressor/document.py); the ends are then a vectorised
  test over the words (`_end_offsets`).
- CJK ends: `。！？` (and fullwidth `．`) end a sentence with or without a following space.
- line breaks (compressor/linebreaks.py, vectorised): a blank line (paragraph), a line ending in
  terminal punctuation or `:`/`;`, or a next line that starts a bullet (`-`, `*`, `+`,
  `•`, `1.`, `a)`), a heading (`#`), a quote (`>`) or a table row (`|`). A wrapped line
  (none of these) continues its sentence.
- fenced code blocks (``` or ~~~, unclosed → to the end) are one unit each, never split;
  the caller keeps them whole.
- a unit longer than `max_unit_chars` (tables, run-on lists) is split at its line breaks,
  then at spaces, so selection never faces an all-or-nothing block of thousands of tokens.

Failure posture: splitting never fails and never loses bytes; a wrong split only makes a
unit coarser or finer (the tests pin the listed cases).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import numpy.typing as npt

from compressor.arrays import member, unique
from compressor.fences import code_spans, has_fence_marker
from compressor.linebreaks import line_breaks
from compressor.linebreaks import sep_start as _sep_start

# Lower-cased words that end in "." without ending a sentence (the final dot stripped).
ABBREVIATIONS = frozenset(
    [
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "mt",
        "ft",
        "vs",
        "cf",
        "al",
        "fig",
        "figs",
        "eq",
        "eqs",
        "no",
        "nos",
        "nr",
        "vol",
        "vols",
        "pp",
        "ed",
        "eds",
        "approx",
        "dept",
        "est",
        "inc",
        "ltd",
        "co",
        "corp",
        "gen",
        "col",
        "lt",
        "sgt",
        "capt",
        "rev",
        "hon",
        "gov",
        "sen",
        "rep",
        "jan",
        "feb",
        "mar",
        "apr",
        "jun",
        "jul",
        "aug",
        "sep",
        "sept",
        "oct",
        "nov",
        "dec",
        "e.g",
        "i.e",
        "a.m",
        "p.m",
        "u.s",
        "u.k",
        "ph.d",
        "b.sc",
        "m.sc",
        "viz",
        "ca",
        "resp",
    ]
)

_CLOSERS = "\"'”’»)]}"
_OPENERS = "\"'“‘«([{¿¡"
_MARKS = ".!?…‼⁉"
_CJK_MARKS = "。！？．"
_CJK_END = re.compile(r"[。！？．]+[」』”’）】〉》]*")
_ANY_BREAK = re.compile(r"\s*\n\s*")  # the reference for _break_runs
_NL_RUN = re.compile(r"\n\s*")

# Per-piece flags (a piece is a space-delimited chunk of text.split(" ")).
END_FLAG = 1  # ends a sentence if the next word starts one
START_FLAG = 2  # can start a sentence: upper case, digit, opening quote, caseless letter
NONEMPTY_FLAG = 4  # set by the caller: the piece is not empty (runs of spaces leave empty ones)

_NONE = np.zeros(0, dtype=np.int64)
DEFAULT_MAX_UNIT_CHARS = 1200  # ≈300 tokens: coarser units make the greedy fill lumpy


@dataclass(frozen=True, slots=True)
class Units:
    """A text cut into units. `code[i]`: unit i is a fenced code block (keep whole).
    `lead[i]`: unit i opens a paragraph, list item or block (the position score uses it).
    `fixed[i]`: unit i is a frozen range (template, protected message: keep whole)."""

    text: str
    starts: list[int]
    code: list[bool]
    lead: list[bool]
    fixed: list[bool]

    def __len__(self) -> int:
        return len(self.starts)

    def span(self, i: int) -> tuple[int, int]:
        end = self.starts[i + 1] if i + 1 < len(self.starts) else len(self.text)
        return self.starts[i], end

    def unit(self, i: int) -> str:
        a, b = self.span(i)
        return self.text[a:b]


def piece_flags(piece: str) -> int:
    """END_FLAG | START_FLAG bits of one space-delimited piece (memoised by the caller)."""
    flags = 0
    c = piece[:1]
    if c and (c.isupper() or c.isdigit() or c in _OPENERS or (c.isalpha() and not c.islower())):
        flags |= START_FLAG
    s = piece.rstrip(_CLOSERS)
    if s and s[-1] in _MARKS:
        if s[-1] != ".":
            return flags | END_FLAG
        word = s[:-1].rsplit(None, 1)[-1] if s[:-1].strip() else ""
        if s[:-1][-1:].isspace():
            word = ""
        word = word.lstrip(_OPENERS).lower()
        if not word:
            return flags
        if len(word) == 1 and word.isalpha():
            return flags  # an initial: "J. R. R. Tolkien"
        if word.isdigit() and len(word) <= 2:
            return flags  # list numbering "1." and dates "3. März"
        if word in ABBREVIATIONS or ("." in word and all(len(x) <= 2 for x in word.split("."))):
            return flags  # "Dr.", "e.g.", "U.S."
        flags |= END_FLAG
    return flags


def _end_offsets(pos: npt.NDArray[np.int64], flags: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Offsets of ". X" sentence ends from per-piece offsets (`pos[j]`: the space before
    piece j) and flags: piece j-1 ends a sentence and the next non-empty piece starts one
    (runs of spaces leave empty pieces)."""
    if len(flags) < 2:
        return _NONE
    cand = np.flatnonzero((flags[:-1] & END_FLAG) != 0) + 1
    if len(cand) == 0:
        return _NONE
    nonempty = np.flatnonzero((flags & NONEMPTY_FLAG) != 0)
    k = np.searchsorted(nonempty, cand)
    ok = k < len(nonempty)
    cand, k = cand[ok], k[ok]
    nxt = nonempty[k]
    starts = (flags[nxt] & START_FLAG) != 0
    ends: npt.NDArray[np.int64] = pos[cand[starts]]
    return ends


def _pieces(text: str) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Offsets and flags of text.split(" ")'s pieces, without a memo (standalone use)."""
    pieces = text.split(" ")
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    flags = np.fromiter(
        ((piece_flags(p) | NONEMPTY_FLAG) if p else 0 for p in pieces),
        dtype=np.int64,
        count=len(pieces),
    )
    return piece_offsets(lengths), flags


def piece_offsets(
    lengths: npt.NDArray[np.int64], heads: npt.NDArray[np.int64] | None = None
) -> npt.NDArray[np.int64]:
    """Offset of each piece of text.split(" ") (piece j ≥ 1: of the space before it).
    With `heads`, the pieces are those of several texts split one after the other (each
    text's first piece starts at its own offset, with no space before it)."""
    sep = np.ones(len(lengths), dtype=np.int64)
    first = np.zeros(len(lengths), dtype=np.bool_)
    first[0 if heads is None else heads] = True
    sep[np.flatnonzero(first)[1:] - 1] = 0  # no space between a text and the next one
    start = np.cumsum(lengths + sep) - (lengths + sep)
    pos: npt.NDArray[np.int64] = start - np.where(first, 0, 1)
    return pos


def _break_runs(text: str, a: int, b: int) -> list[int]:
    """The starts of _ANY_BREAK's matches in text[a:b] after `a`: of each whitespace run
    holding a newline. The regex engine tries `\\s*\\n` at every character; `\\n\\s*` is
    searched for its newline directly and matches once per such run (its first newline:
    `\\s*` takes the rest), whose start is then a short walk back over whitespace."""
    cuts: list[int] = []
    for m in _NL_RUN.finditer(text, a, b):
        s = m.start()
        while s > a and text[s - 1].isspace():
            s -= 1
        if s > a:
            cuts.append(s)
    return cuts


def _cut_long(text: str, a: int, b: int, limit: int, out: list[int]) -> None:
    """Boundaries inside text[a:b] so no piece exceeds `limit` chars: lines, then spaces."""
    if b - a <= limit:
        return
    cuts = _break_runs(text, a, b)
    points = [a, *cuts, b]
    for x, y in pairwise(points):
        if x != a:
            out.append(x)
        pos = x
        while y - pos > limit:
            cut = text.rfind(" ", pos + limit // 2, pos + limit)
            if cut <= pos:
                cut = pos + limit
            out.append(_sep_start(text, cut) if text[cut - 1].isspace() else cut)
            if out[-1] <= pos:
                out[-1] = cut
            pos = out[-1]


def _outside(bounds: npt.NDArray[np.int64], ranges: list[tuple[int, int]]) -> npt.NDArray[np.int64]:
    """The bounds not strictly inside any of the (sorted, disjoint) ranges."""
    if not ranges or not len(bounds):
        return bounds
    lo = np.asarray([a for a, _ in ranges], dtype=np.int64)
    hi = np.asarray([b for _, b in ranges], dtype=np.int64)
    k = np.searchsorted(lo, bounds, side="left") - 1
    inside = (k >= 0) & (bounds < hi[np.maximum(k, 0)])
    kept: npt.NDArray[np.int64] = bounds[~inside]
    return kept


def _marks(arr: npt.NDArray[np.int64], values: npt.NDArray[np.int64]) -> list[bool]:
    """Per element of the sorted, unique `arr`: is it one of `values`."""
    out = np.zeros(len(arr), dtype=np.bool_)
    if len(values) and len(arr):
        at = np.searchsorted(arr, values)
        ok = at < len(arr)
        at = at[ok]
        out[at[arr[at] == values[ok]]] = True
    marks: list[bool] = out.tolist()
    return marks


def split_units(
    text: str,
    max_unit_chars: int = DEFAULT_MAX_UNIT_CHARS,
    seams: Sequence[int] = (),
    frozen: Sequence[tuple[int, int]] = (),
    pieces: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None,
) -> Units:
    """Cut `text` into units (see the module docstring). `seams` are offsets where a unit
    must start (the compressor joins several texts into one document and cuts at their
    seams); each `frozen` range [a, b) (bounded by seams) is a single unit, never split.
    `pieces` = (offsets, flags) of text.split(" ") when the caller has them memoised."""
    seam_list = sorted(set(seams))
    pos, flags = _pieces(text) if pieces is None else pieces
    lead_breaks, end_breaks = line_breaks(text, seam_list)
    parts = [_end_offsets(pos, flags), lead_breaks, end_breaks]
    if any(mark in text for mark in _CJK_MARKS):
        cjk = [m.end() for m in _CJK_END.finditer(text)]
        parts.append(np.asarray(cjk, dtype=np.int64))
    found = np.concatenate(parts)
    code_starts: set[int] = set()
    fenced = code_spans(text) if has_fence_marker(text) else []
    if fenced and seam_list:  # a fence left open in one text ends at the next seam
        cut: list[tuple[int, int]] = []
        for a, b in fenced:
            inner = [s for s in seam_list if a < s < b]
            cut.extend(zip([a, *inner], [*inner, b], strict=True))
        fenced = cut
    frozen_list = sorted(frozen)
    fence_units: list[tuple[int, int]] = []
    for a, b in fenced:
        if any(x <= a < y for x, y in frozen_list):
            continue  # inside a frozen range: kept whole anyway
        floor = seam_list[bisect_right(seam_list, a) - 1] if seam_list and seam_list[0] <= a else 0
        s = max(_sep_start(text, a), floor)
        fence_units.append((s, b))
        code_starts.add(s)
    whole = sorted([*fence_units, *frozen_list])
    edges = [x for ab in whole for x in ab]
    fixed_bounds = np.asarray([*seam_list, *edges, 0], dtype=np.int64)
    arr = unique(np.concatenate([_outside(found, whole), fixed_bounds]))
    arr = arr[arr < max(len(text), 1)]
    seam_set = set(seam_list)
    while len(arr) > 1 and int(arr[-1]) not in seam_set and text[int(arr[-1]) :].isspace():
        arr = arr[:-1]  # no whitespace-only unit at the end
    frozen_starts = np.asarray([a for a, _ in frozen], dtype=np.int64)
    code_arr = np.asarray(sorted(code_starts), dtype=np.int64)
    if max_unit_chars > 0:
        sizes = np.diff(np.append(arr, len(text)))
        long = np.flatnonzero(sizes > max_unit_chars)
        if len(long):
            ok = ~member(arr[long], code_arr) & ~member(arr[long], np.sort(frozen_starts))
            extra: list[int] = []
            for i in long[ok].tolist():
                _cut_long(text, int(arr[i]), int(arr[i] + sizes[i]), max_unit_chars, extra)
            if extra:
                arr = unique(np.append(arr, np.asarray(extra, dtype=np.int64)))
    other_leads = [0, *seam_list, *code_starts, *(b for _, b in fence_units)]
    leads = np.concatenate([np.asarray(other_leads, dtype=np.int64), lead_breaks])
    starts = arr.tolist()
    return Units(
        text=text,
        starts=starts,
        code=_marks(arr, code_arr),
        lead=_marks(arr, leads),
        fixed=_marks(arr, frozen_starts),
    )
