"""Texts as the scorer sees them: units, their token counts and a sparse term matrix.

A document is one or more texts, each encoded on its own (the template's message texts,
compressor/template.py), analysed together. One pass over every text's space-delimited
pieces gives each unit its tokens and terms at once: each distinct piece is analysed
once per process and memoised as one packed integer (token count, length, term id,
sentence flags), so a warm 10K-token prompt costs one `dict` lookup per word plus a few
vectorised numpy operations, never a per-word Python loop.

- Token counts: the pieces form the exact counter's chunks (compressor/counting.py), so
  their counts add up to each text's exact count. A unit gets F(end) − F(start) of the
  cumulative count F (see `_unit_tokens`): exact where a unit boundary falls between
  chunks, split by characters inside a chunk that straddles a boundary (a line break
  inside a run of words). Selection works on these sums; the guarantee comes from
  compressor/exact.py, which counts a selection exactly.
- Terms: a piece's term is its first word, lower-cased, stripped of punctuation; numbers,
  words shorter than 3 characters and English stop words have none. The matrix holds
  (unit, term, tf) triples with term ids local to the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compressor.counting import (
    DEFAULT_MAX_ENTRIES,
    LEN_MASK,
    LEN_SHIFT,
    USER_SHIFT,
    IntArray,
    TokenCounter,
    default_counter,
)
from compressor.sentences import (
    DEFAULT_MAX_UNIT_CHARS,
    NONEMPTY_FLAG,
    Units,
    piece_flags,
    piece_offsets,
    split_units,
)

FloatArray = npt.NDArray[np.float64]
__all__ = ["Analyzer", "Document", "FloatArray", "IntArray"]

_STRIP = "\"'`“”‘’«»()[]{}<>.,;:!?*_#|/\\-–—=+~^%$&@…"

STOP_WORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "also",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "may",
        "me",
        "might",
        "more",
        "most",
        "must",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "shall",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "upon",
        "us",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "one",
        "two",
        "use",
        "used",
        "using",
        "see",
        "also",
        "however",
        "thus",
        "therefore",
        "etc",
    ]
)

_TERM_BITS = 18  # term id + 1 in the counter's free high bits, then the sentence flags
_TERM_MASK = (1 << _TERM_BITS) - 1
_FLAG_SHIFT = USER_SHIFT + _TERM_BITS


class _ChunkMemo(dict[str, int]):
    """piece → the counter's packed value | (term id + 1, sentence flags) << USER_SHIFT."""

    __slots__ = ("_counter", "terms")

    def __init__(self, counter: TokenCounter) -> None:
        super().__init__()
        self._counter = counter
        self.terms: dict[str, int] = {}

    def __missing__(self, piece: str) -> int:
        term = _term_of(piece)
        tid = 0
        if term is not None:
            tid = self.terms.get(term, -1) + 1
            if tid == 0 and len(self.terms) < _TERM_MASK - 1:
                tid = len(self.terms) + 1
                self.terms[term] = tid - 1
        value = (
            self._counter.packed_value(piece)
            | (tid << USER_SHIFT)
            | (piece_flags(piece) << _FLAG_SHIFT)
        )
        self[piece] = value
        return value


def _term_of(chunk: str) -> str | None:
    words = chunk.split(None, 1)
    if not words:
        return None
    word = words[0].strip(_STRIP).lower()
    if len(word) < 3 or word in STOP_WORDS or not any(c.isalpha() for c in word):
        return None
    return word


class Analyzer:
    """Turns texts into `Document`s; holds the process-wide chunk memo (bounded)."""

    __slots__ = ("_max_entries", "_memo", "counter")

    def __init__(
        self, counter: TokenCounter | None = None, max_entries: int = DEFAULT_MAX_ENTRIES
    ) -> None:
        self.counter = counter or default_counter()
        self._memo = _ChunkMemo(self.counter)
        self._max_entries = max_entries

    def analyse(
        self,
        texts: Sequence[str],
        frozen: Sequence[bool] = (),
        max_unit_chars: int = DEFAULT_MAX_UNIT_CHARS,
    ) -> Document:
        """Analyse consecutive texts as one document whose units never cross a seam
        between texts (shared IDF, TextRank graph and novelty; per-text position). A
        `frozen` text is one unit (a chat template's markers, a protected message)."""
        if len(self._memo) > self._max_entries:
            self._memo.clear()  # between documents only: term ids stay consistent within one
            self._memo.terms.clear()
        offsets = [0]
        for t in texts:
            offsets.append(offsets[-1] + len(t))
        text = "".join(texts)
        ranges = [
            (offsets[k], offsets[k + 1])
            for k, f in enumerate(frozen)
            if f and offsets[k] < offsets[k + 1]
        ]
        self.counter.trim_memo()
        pieces: list[str] = []
        heads: list[int] = []
        for t in texts:  # each text is encoded on its own: split it on its own
            heads.append(len(pieces))
            pieces.extend(t.split(" "))
        head_idx = np.asarray(heads, dtype=np.int64)
        packed = self.counter.packed(pieces, self._memo)
        counts, glued = self.counter.piece_counts(pieces, packed, head_idx)
        lengths = (packed >> LEN_SHIFT) & LEN_MASK
        terms = ((packed >> USER_SHIFT) & _TERM_MASK) - 1
        flags = (packed >> _FLAG_SHIFT) | np.where(lengths > 0, NONEMPTY_FLAG, 0)
        pos = piece_offsets(lengths, head_idx)
        units = split_units(text, max_unit_chars, offsets[:-1], ranges, (pos, flags))
        starts = np.asarray(units.starts, dtype=np.int64)
        unit_of = np.searchsorted(starts, pos, side="right") - 1
        n = len(units)
        if len(glued):
            chunk = np.ones(len(pieces), dtype=np.bool_)
            chunk[glued] = False
            chunk_pos, chunk_tokens = pos[chunk], counts[chunk]
        else:
            chunk_pos, chunk_tokens = pos, counts
        tokens = _unit_tokens(starts, chunk_pos, chunk_tokens, len(text))
        words = np.bincount(unit_of, minlength=n).astype(np.int64)
        has = terms >= 0
        pu, pt, tf, n_terms = _sparse(unit_of[has], terms[has], n)
        seams = np.asarray(offsets[:-1], dtype=np.int64)
        group = np.searchsorted(seams, starts, side="right") - 1
        return Document(
            units, tuple(offsets), group, tokens, words, pu, pt, tf, n_terms,
            chunk_pos=chunk_pos, chunk_tokens=chunk_tokens,
        )  # fmt: skip


def _unit_tokens(starts: IntArray, cpos: IntArray, cn: IntArray, length: int) -> IntArray:
    """Tokens per unit: F(end) − F(start) where F is the cumulative token count along the
    text, exact at chunk starts and linear inside a chunk. A chunk that straddles a unit
    boundary (a line break inside a run of words) is thus split by characters, so the
    sums are exact in total and unbiased per unit; F is rounded before differencing so
    the integers still add up to the text's exact count."""
    keep = np.append(np.diff(cpos) > 0, True)  # an empty first chunk duplicates offset 0
    xp = np.append(cpos[keep], length)
    fp = np.append(0, np.cumsum(cn)[keep])
    edges = np.rint(np.interp(np.append(starts, length), xp, fp))
    out: IntArray = np.diff(edges).astype(np.int64)
    return out


def _sparse(units: IntArray, terms: IntArray, n: int) -> tuple[IntArray, IntArray, IntArray, int]:
    """(unit, local term, tf) triples sorted by unit then term."""
    if len(terms) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, 0
    uniq, local = np.unique(terms, return_inverse=True)
    v = len(uniq)
    keys, tf = np.unique(units * v + local, return_counts=True)
    return keys // v, keys % v, tf.astype(np.int64), v


@dataclass(frozen=True, slots=True)
class Document:
    """Texts ready for scoring: `tokens[i]`/`words[i]`/`group[i]` per unit, and the
    unit × term matrix as parallel arrays (`pu`, `pt`, `tf`) over `n_terms` local term ids."""

    units: Units
    offsets: tuple[int, ...]  # text k is units.text[offsets[k]:offsets[k + 1]]
    group: IntArray  # the text each unit belongs to
    tokens: IntArray
    words: IntArray
    pu: IntArray
    pt: IntArray
    tf: IntArray
    n_terms: int
    chunk_pos: IntArray  # where each exact-count chunk starts (its safe cut)
    chunk_tokens: IntArray  # and its tokens: Σ = the whole text's exact count

    def __len__(self) -> int:
        return len(self.units)
