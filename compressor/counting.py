"""Exact cl100k token counts at dictionary speed: memoised, space-delimited chunks.

tiktoken encodes ~2M tokens/s here (≈5 ms for a 10K-token prompt), more than the whole
compressor's latency budget. But a BPE count is a sum over the pre-tokenizer's pieces, and
the cl100k pre-tokenizer (pattern below) never lets a piece run across a space whose left
neighbour is not whitespace:

    '(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+
    |\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s

Claim: cutting a text at every space preceded by a non-whitespace character gives chunks
c_0, c_1, ... with count(text) = count(c_0) + Σ_{j≥1} count(" " + c_j), each chunk encoded
on its own. Why: (1) no piece contains such a space unless it starts with it: the only
pieces holding a space at a later position are whitespace runs, and the run cannot
start at the non-whitespace left neighbour; (2) the chunk to the left ends in a
non-whitespace character, so its last piece is a letter, digit, punctuation or
contraction piece, none of which can grow past a space or depends on what follows (the
only lookahead, `\\s+(?!\\S)`, and the end anchor `\\s++$` apply to whitespace pieces);
(3) the chunk to the right begins at the cut in both cases and the pattern has no
lookbehind. Each chunk therefore splits into the same pieces alone as in the text.
(Cutting at spaces *after* whitespace is not safe: `\\s++$` makes "\\n\\t" one piece
at the end of a chunk but two pieces before " x".) The same holds for a cut right after
a newline that is followed by a non-whitespace character: every piece holding a newline
ends at its last newline (`[\\r\\n]*+`, `\\s*[\\r\\n]`, `\\s++$`) and no piece starts
with a newline and continues with text, so a miss of the memo is split at its line starts
and only its first line is encoded; the other lines are memoised on their own (words
like "end.\\n\\nThe" are new combinations of old lines). tests/property/
test_counting_properties.py checks the claims against tiktoken itself.

Computation: `str.split(" ")` cuts at every space; a piece that follows an empty piece or
one ending in whitespace (indentation, double spaces) is glued back to its predecessor.
Chunks are words with their leading space, so a Zipfian vocabulary memoises well: the
memo maps piece → packed (count(" " + piece), len(piece), ends-in-whitespace) and misses
fall through to tiktoken. The memo is bounded (cleared when full, between calls) and
never changes a result, only its cost.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from itertools import islice, pairwise

import numpy as np
import numpy.typing as npt

from compressor.compiled import fast as _fast
from compressor.piecetable import PieceTable, Spans, lookup_spans
from compressor.tokenizer import Tokenizer, cl100k

IntArray = npt.NDArray[np.int64]

_SPACE_AFTER_WS = re.compile(r"\s ")  # present → some cuts of str.split(" ") must be glued
_CUT = re.compile(r"(?<=\S) ")  # the safe cuts themselves (a lookbehind: slow on long texts)
_SHORT = 2000  # below this many characters _CUT beats str.split + gluing in numpy
_LONG = 10000  # from this many characters, counting looks the pieces up in bulk (piecetable.py)
_LINE_START = re.compile(r"\n(?=\S)")  # the other safe cut: a line that starts with a non-space

DEFAULT_MAX_ENTRIES = 1 << 17  # per memo: ~50 B an entry, a long tail of vocabulary, bounded

# Packed memo value: bits 0-19 count(" " + piece), 20-41 len(piece), 42 piece is empty or
# ends in whitespace; bits 43-62 are free for callers (document.py puts the term id there).
COUNT_MASK = (1 << 20) - 1
LEN_SHIFT = 20
LEN_MASK = (1 << 22) - 1
WS_BIT = 1 << 42
USER_SHIFT = 43


class _Counts(dict[str, int]):
    """piece → count(prefix + piece); a miss is split at its line starts (see the module
    docstring) and its first line encoded with tiktoken; later lines come from `lines`."""

    __slots__ = ("_prefix", "_tokenizer", "lines")

    def __init__(self, tokenizer: Tokenizer, prefix: str, lines: _Counts | None = None) -> None:
        super().__init__()
        self._tokenizer = tokenizer
        self._prefix = prefix
        self.lines = self if lines is None else lines

    def __missing__(self, piece: str) -> int:
        text = self._prefix + piece
        cuts = [m.end() for m in _LINE_START.finditer(text)] if "\n" in piece else []
        if not cuts:
            n = len(self._tokenizer.encode(text))
        else:
            lines = self.lines
            bounds = [*cuts, len(text)]
            first = piece[: cuts[0] - len(self._prefix)]
            n = self[first] if first else len(self._tokenizer.encode(self._prefix))
            n += sum(lines[text[a:b]] for a, b in pairwise(bounds))
        self[piece] = n
        return n


class _Packed(dict[str, int]):
    """piece → packed (count(" " + piece), len, ends-in-whitespace)."""

    __slots__ = ("_spaced",)

    def __init__(self, spaced: _Counts) -> None:
        super().__init__()
        self._spaced = spaced

    def __missing__(self, piece: str) -> int:
        value = pack(self._spaced[piece], piece)
        self[piece] = value
        return value


def pack(count: int, piece: str) -> int:
    ws = WS_BIT if (not piece or piece[-1].isspace()) else 0
    return min(count, COUNT_MASK) | (min(len(piece), LEN_MASK) << LEN_SHIFT) | ws


class TokenCounter:
    """Exact token counts of one BPE tokenizer with a cl100k-style pre-tokenizer.

    `count(text)` equals `len(tokenizer.encode(text))` for every string (see the module
    docstring); `piece_counts` gives per-piece counts whose sum is that count, for callers
    (the compressor) that attribute tokens to parts of a text.
    """

    __slots__ = ("_head", "_lock", "_max_entries", "_packed", "_spaced", "_table", "tokenizer")

    def __init__(self, tokenizer: Tokenizer, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.tokenizer = tokenizer
        self._max_entries = max_entries
        self._head = _Counts(tokenizer, "")
        self._spaced = _Counts(tokenizer, " ", lines=self._head)
        self._packed = _Packed(self._spaced)
        self._table: PieceTable | None = None  # `_packed` of short pieces, for long texts
        self._lock = threading.Lock()  # around the table (callers may be threads)

    def trim_memo(self) -> None:
        """Bound the memo (call between texts, never while a caller holds packed values)."""
        if len(self._spaced) > self._max_entries or len(self._packed) > self._max_entries:
            self._spaced.clear()
            self._packed.clear()
        if len(self._head) > self._max_entries:
            self._head.clear()
        table = self._table
        if table is not None and table.full():
            with self._lock:
                table.clear()

    def count(self, text: str) -> int:
        """Exact number of tokens of `text`."""
        if not text:
            return 0
        self.trim_memo()
        if len(text) >= _LONG:
            return self._count_long(text)
        if _SPACE_AFTER_WS.search(text) is None:
            pieces = text.split(" ")
        elif len(text) < _SHORT:
            pieces = _CUT.split(text)  # the safe cuts directly (fast on short strings)
        else:
            pieces = text.split(" ")
            packed = np.array(list(map(self._packed.__getitem__, pieces)), dtype=np.int64)
            return int(self.piece_counts(pieces, packed)[0].sum())
        rest = sum(map(self._spaced.__getitem__, islice(pieces, 1, None)))
        return self.head(pieces[0]) + rest

    def _count_long(self, text: str) -> int:
        """count(text) with the pieces' memo values looked up all at once (piecetable.py)."""
        with self._lock:
            if self._table is None:
                self._table = PieceTable()
            packed, spans = lookup_spans(self._table, text, self._packed)
        return int(self.piece_counts_of(text, packed, spans, [0])[0].sum())

    def count_all(self, texts: list[str]) -> int:
        """Σ count(text) over `texts` (many short strings: one memo check, lean loop; with
        the compiled pass, long ones all at once)."""
        self.trim_memo()
        if _fast is not None and len(texts) > 1 and sum(map(len, texts)) >= _LONG:
            return self._count_joined(texts)
        spaced = self._spaced.__getitem__
        head = self._head
        search = _SPACE_AFTER_WS.search
        total = 0
        for text in texts:
            if len(text) >= _LONG or search(text) is not None:
                total += self.count(text)
                continue
            pieces = text.split(" ")
            first = pieces[0]
            total += sum(map(spaced, islice(pieces, 1, None))) + (head[first] if first else 0)
        return total

    def _count_joined(self, texts: list[str]) -> int:
        """Σ count(text) in one look-up and one chunk pass over the texts joined by spaces,
        each text's first piece a head (encoded on its own, as compressor/document.py
        counts a document's texts)."""
        heads = [0]
        for t in texts[:-1]:
            heads.append(heads[-1] + t.count(" ") + 1)
        joined = " ".join(texts)
        with self._lock:
            if self._table is None:
                self._table = PieceTable()
            packed, spans = lookup_spans(self._table, joined, self._packed)
        return int(self.piece_counts_of(joined, packed, spans, heads)[0].sum())

    def head(self, piece: str) -> int:
        """count(piece) for a piece that starts a text (no leading space)."""
        return self._head[piece] if piece else 0

    def packed(self, pieces: list[str], memo: dict[str, int] | None = None) -> IntArray:
        """Packed memo values of `text.split(" ")`'s pieces (see `pack`)."""
        source = self._packed if memo is None else memo
        return np.fromiter(map(source.__getitem__, pieces), dtype=np.int64, count=len(pieces))

    def packed_value(self, piece: str) -> int:
        return self._packed[piece]

    def piece_counts(
        self, pieces: list[str], packed: IntArray, heads: IntArray | None = None
    ) -> tuple[IntArray, IntArray]:
        """Tokens per piece of `text.split(" ")`, summing exactly to count(text), and the
        indices of the pieces glued to their predecessor. Chunks (see the module
        docstring) start at the other pieces; a chunk is charged to its first piece.
        `heads` (sorted piece indices, 0 included) start texts encoded on their own: the
        pieces of several texts split one after the other, never glued across."""
        first = [0] if heads is None else heads.tolist()
        empty = [not pieces[h] for h in first]
        counts, starts, stops, glued = _glue(packed, first, empty)
        head = self._head
        counts[first] = [head[p] if p else 0 for p in map(pieces.__getitem__, first)]
        if len(starts):
            join = " ".join
            chunks = [join(pieces[a : b + 1]) for a, b in zip(starts, stops, strict=True)]
            counts[starts] = self._chunk_values(chunks, starts, first)
        return counts, glued

    def piece_counts_in(
        self, text: str, packed: IntArray, heads: list[int]
    ) -> tuple[IntArray, IntArray]:
        """`piece_counts` of the pieces of `text` = " ".join(texts) (one text per head),
        taking each piece's length from `packed` and its string from `text` (no split)."""
        lengths = (packed >> LEN_SHIFT) & LEN_MASK
        at = np.cumsum(lengths + 1) - (lengths + 1)  # each piece's first character
        head_at = at[heads].tolist()
        head_len = lengths[heads].tolist()
        counts, starts, stops, glued = _glue(packed, heads, [n == 0 for n in head_len])
        head = self._head
        counts[heads] = [
            head[text[a : a + n]] if n else 0 for a, n in zip(head_at, head_len, strict=True)
        ]
        if len(starts):
            lo = at[starts].tolist()
            hi = (at[stops] + lengths[stops]).tolist()
            chunks = [text[a:b] for a, b in zip(lo, hi, strict=True)]
            counts[starts] = self._chunk_values(chunks, starts, heads)
        return counts, glued

    def piece_counts_of(
        self, text: str, packed: IntArray, spans: Spans, heads: list[int]
    ) -> tuple[IntArray, IntArray]:
        """`piece_counts_in`, in one compiled pass when there is one: it reads the glued
        chunks from the pieces' byte `spans` and looks them up in the memo itself, so only
        the chunks the memo lacks come back to be counted here."""
        if _fast is None:
            return self.piece_counts_in(text, packed, heads)
        n = len(packed)
        counts = np.empty(n, dtype=np.int64)
        glued = np.empty(n, dtype=np.int64)
        head_at = np.asarray(heads, dtype=np.int64)
        m, misses = _fast.chunk_counts(
            spans.raw, spans.starts, spans.ends, packed, head_at, self._spaced, self._head,
            counts, glued,
        )  # fmt: skip
        for i, chunk, is_head in misses:
            counts[i] = self._head[chunk] if is_head else self._spaced[chunk]
        return counts, glued[:m].copy()

    def _chunk_values(self, chunks: list[str], starts: list[int], heads: list[int]) -> list[int]:
        """Counts of glued chunks: spaced, or as a text's start when a head opens one."""
        is_head = set(heads)
        if is_head.isdisjoint(starts):
            return list(map(self._spaced.__getitem__, chunks))
        spaced = self._spaced
        return [
            self.head(c) if a in is_head else spaced[c] for a, c in zip(starts, chunks, strict=True)
        ]


def _glue(
    packed: IntArray, first: list[int], empty: list[bool]
) -> tuple[IntArray, list[int], list[int], IntArray]:
    """Per-piece counts before the heads and glued chunks are charged, the first and last
    piece of each glued run (a chunk), and the glued pieces' indices. `first`: the pieces
    that start a text; `empty[k]`: piece first[k] is empty."""
    counts: IntArray = packed & COUNT_MASK
    none = np.zeros(0, dtype=np.int64)
    if len(packed) < 2:
        return counts, [], [], none
    unsafe = (packed[:-1] & WS_BIT) != 0  # unsafe[j - 1]: the cut before piece j
    unsafe[[h - 1 for h in first if h > 0]] = False  # a new text: nothing to glue to
    last = len(packed) - 1
    # a space at a text's start has no left neighbour
    unsafe[[h for h, e in zip(first, empty, strict=True) if h < last and e]] = False
    if not unsafe.any():
        return counts, [], [], none
    glued = np.flatnonzero(unsafe) + 1  # piece j joins piece j - 1's chunk
    run_first = np.flatnonzero(np.diff(glued, prepend=-2) != 1)  # each run's first glued j
    starts = (glued[run_first] - 1).tolist()
    stops = glued[np.append(run_first[1:], len(glued)) - 1].tolist()
    counts[glued] = 0
    return counts, starts, stops, glued


@lru_cache(maxsize=1)
def default_counter() -> TokenCounter:
    """The process-wide exact cl100k counter (one memo shared by all callers)."""
    return TokenCounter(cl100k())
