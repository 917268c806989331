"""Texts as the scorer sees them: units, their token counts and a sparse term matrix.

A document is one or more texts, each encoded on its own (the template's message texts,
compressor/template.py), analysed together. One pass over every text's space-delimited
pieces gives each unit its tokens and terms at once: each distinct piece is analysed
once per process and memoised as one packed integer (token count, length, term id,
sentence flags); a warm 10K-token prompt's pieces are looked up all at once by their bytes
(compressor/piecetable.py, the `dict` memo answering only misses and long pieces), plus a
few vectorised numpy operations, never a per-word Python loop.

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

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from compressor.arrays import unique_counts, unique_inverse
from compressor.compiled import fast as _fast
from compressor.counting import (
    DEFAULT_MAX_ENTRIES,
    LEN_MASK,
    LEN_SHIFT,
    USER_SHIFT,
    IntArray,
    TokenCounter,
    default_counter,
)
from compressor.piecetable import PieceTable, lookup_spans
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

_EMPTY = np.zeros(0, dtype=np.int64)

DEFAULT_CACHED_PIECES = 1 << 18  # ≈ 40 prompts of 10K tokens: ~6 MB of arrays
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


def _spaces(text: str) -> int:
    """text.count(" "): in C when built (str.count looks for a one-character needle a
    character at a time, ~55 µs on 37 KB)."""
    if _fast is not None:
        n: int = _fast.count_spaces(text)
        return n
    return text.count(" ")


def _term_of(chunk: str) -> str | None:
    words = chunk.split(None, 1)
    if not words:
        return None
    word = words[0].strip(_STRIP).lower()
    if len(word) < 3 or word in STOP_WORDS or not any(c.isalpha() for c in word):
        return None
    return word


@dataclass(frozen=True, slots=True)
class _Tokens:
    """One text's pieces (`text.split(" ")`) as the analysis needs them: packed memo
    values, exact tokens per piece and the pieces glued to their predecessor."""

    packed: IntArray
    counts: IntArray
    glued: IntArray  # piece indices within the text

    @property
    def tokens(self) -> int:
        return int(self.counts.sum())


class Analyzer:
    """Turns texts into `Document`s; holds the process-wide chunk memo (bounded) and the
    tokenised form of the texts it saw last (bounded by `max_cached_pieces`).

    Each text of a document is split and counted on its own (its pieces never glue to a
    neighbour's), so its tokenisation does not depend on the texts around it and is kept
    per text: a chat resends its history every turn, an agent loop its system prompt and
    tool outputs, a client its retries, and those texts then cost one `dict` lookup
    instead of a lookup per word. The cache changes no result (the values are those a
    fresh pass computes); it is emptied with the chunk memo, whose term ids it holds."""

    __slots__ = (
        "_cached_pieces", "_epoch", "_lock", "_max_cached", "_max_entries", "_memo", "_table",
        "_texts", "counter",
    )  # fmt: skip

    def __init__(
        self,
        counter: TokenCounter | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_cached_pieces: int = DEFAULT_CACHED_PIECES,
    ) -> None:
        self.counter = counter or default_counter()
        self._memo = _ChunkMemo(self.counter)
        self._table = PieceTable()  # the memo's values of short pieces, keyed by their bytes
        self._max_entries = max_entries
        self._texts: dict[str, _Tokens] = {}
        self._cached_pieces = 0
        self._max_cached = max_cached_pieces
        self._epoch = 0  # counts memo clears: a text tokenised before one is not cached after
        self._lock = threading.Lock()  # the gateway compresses on a thread pool

    def forget_texts(self) -> None:
        """Empty the per-text cache (the vocabulary memo stays)."""
        with self._lock:
            self._texts.clear()
            self._cached_pieces = 0

    def _trim(self) -> None:
        if len(self._memo) > self._max_entries:
            with self._lock:
                self._epoch += 1
                self._texts.clear()
                self._cached_pieces = 0
                self._table.clear()  # it holds the memo's values (term ids)
            self._memo.clear()  # between documents only: term ids stay consistent within one
            self._memo.terms.clear()
        elif self._table.full():
            with self._lock:
                self._table.clear()
        self.counter.trim_memo()

    def _tokenise(self, texts: Sequence[str]) -> tuple[list[_Tokens], _Tokens | None]:
        """Each text's `_Tokens`, from the cache or computed (all misses in one pass), and
        when no text was cached, the whole pass (the texts' pieces one after the other)."""
        cache = self._texts
        epoch = self._epoch
        out: list[_Tokens | None] = [cache.get(t) for t in texts]
        missing = [k for k, hit in enumerate(out) if hit is None]
        whole = None
        if missing:
            # each text is encoded on its own: joined by one space, the texts' pieces
            # are those of each text split on its own, one after the other
            joined = " ".join([texts[k] for k in missing])
            heads = [0]
            for k in missing[:-1]:  # the last text's pieces need no count: they end the rest
                heads.append(heads[-1] + _spaces(texts[k]) + 1)
            with self._lock:
                packed, spans = lookup_spans(self._table, joined, self._memo)
            counts, glued = self.counter.piece_counts_of(joined, packed, spans, heads)
            ends = [*heads[1:], len(packed)]
            cut = np.searchsorted(glued, ends, side="left").tolist()
            g0 = 0
            for arr in (packed, counts, glued):
                arr.setflags(write=False)  # shared by every document holding the text
            for k, a, b, g1 in zip(missing, heads, ends, cut, strict=True):
                out[k] = _Tokens(packed[a:b], counts[a:b], glued[g0:g1] - a)
                g0 = g1
            if len(missing) == len(texts):
                whole = _Tokens(packed, counts, glued)
        done = [t for t in out if t is not None]
        with self._lock:
            if epoch == self._epoch:
                for text, tokens in zip(texts, done, strict=True):
                    self._remember(text, tokens)
        return done, whole

    def _remember(self, text: str, tokens: _Tokens) -> None:
        """Cache `text` as most recently used, evicting the oldest beyond the bound (the
        caller holds the lock)."""
        cache = self._texts
        size = len(tokens.packed)
        if cache.pop(text, None) is None:
            if size > self._max_cached:
                return
            self._cached_pieces += size
        cache[text] = tokens
        while self._cached_pieces > self._max_cached:
            old = next(iter(cache))
            self._cached_pieces -= len(cache.pop(old).packed)

    def count_all(self, texts: Sequence[str]) -> int:
        """Σ exact tokens of `texts`, each encoded on its own (through the text cache)."""
        self._trim()
        parts, whole = self._tokenise(texts)
        return whole.tokens if whole is not None else sum(t.tokens for t in parts)

    def analyse(
        self,
        texts: Sequence[str],
        frozen: Sequence[bool] = (),
        max_unit_chars: int = DEFAULT_MAX_UNIT_CHARS,
    ) -> Document:
        """Analyse consecutive texts as one document whose units never cross a seam
        between texts (shared IDF, TextRank graph and novelty; per-text position). A
        `frozen` text is one unit (a chat template's markers, a protected message)."""
        self._trim()
        offsets = [0]
        for t in texts:
            offsets.append(offsets[-1] + len(t))
        text = "".join(texts)
        ranges = [
            (offsets[k], offsets[k + 1])
            for k, f in enumerate(frozen)
            if f and offsets[k] < offsets[k + 1]
        ]
        parts, whole = self._tokenise(texts)
        sizes = [len(p.packed) for p in parts]
        heads = [0] * len(sizes)
        for k in range(1, len(sizes)):
            heads[k] = heads[k - 1] + sizes[k - 1]
        head_idx = np.asarray(heads, dtype=np.int64)
        n_pieces = sum(sizes)
        if whole is not None or len(parts) == 1:
            one = whole if whole is not None else parts[0]
            packed, counts, glued = one.packed, one.counts, one.glued
        else:
            packed = np.concatenate([p.packed for p in parts] or [_EMPTY])
            counts = np.concatenate([p.counts for p in parts] or [_EMPTY])
            glued = np.concatenate(
                [p.glued + h for p, h in zip(parts, heads, strict=True)] or [_EMPTY]
            )
        pos, flags, terms = _piece_fields(packed, head_idx)
        units = split_units(text, max_unit_chars, offsets[:-1], ranges, (pos, flags))
        starts = np.asarray(units.starts, dtype=np.int64)
        if len(glued):
            chunk = np.ones(n_pieces, dtype=np.bool_)
            chunk[glued] = False
            chunk_pos, chunk_tokens = pos[chunk], counts[chunk]
        else:
            chunk_pos, chunk_tokens = pos, counts
        tokens = _unit_tokens(starts, chunk_pos, chunk_tokens, len(text))
        words, pu, pt, tf, n_terms = _unit_matrix(starts, pos, terms)
        seams = np.asarray(offsets[:-1], dtype=np.int64)
        group = np.searchsorted(seams, starts, side="right") - 1
        return Document(
            units, tuple(offsets), group, tokens, words, pu, pt, tf, n_terms,
            chunk_pos=chunk_pos, chunk_tokens=chunk_tokens,
        )  # fmt: skip


def _piece_fields(packed: IntArray, heads: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Per piece of the joined texts (`heads`: each text's first piece): its offset
    (sentences.piece_offsets), its sentence flags and its term id (−1: none)."""
    if _fast is not None:
        n = len(packed)
        pos, flags, terms = (np.empty(n, dtype=np.int64) for _ in range(3))
        _fast.piece_features(
            packed, heads, USER_SHIFT, _FLAG_SHIFT, NONEMPTY_FLAG, pos, flags, terms
        )
        return pos, flags, terms
    lengths = (packed >> LEN_SHIFT) & LEN_MASK
    terms = ((packed >> USER_SHIFT) & _TERM_MASK) - 1
    flags = (packed >> _FLAG_SHIFT) | np.where(lengths > 0, NONEMPTY_FLAG, 0)
    return piece_offsets(lengths, heads), flags, terms


def _unit_matrix(
    starts: IntArray, pos: IntArray, terms: IntArray
) -> tuple[IntArray, IntArray, IntArray, IntArray, int]:
    """Words per unit (the pieces that start in it) and the unit × term matrix (`_sparse`)."""
    n = len(starts)
    if _fast is not None:
        m = len(pos)
        words = np.empty(n, dtype=np.int64)
        pu, pt, tf = (np.empty(m, dtype=np.int64) for _ in range(3))
        got = _fast.unit_terms(starts, pos, terms, words, pu, pt, tf)
        if got is not None:  # None: units out of order (not from split_units)
            k, v = got
            return words, pu[:k].copy(), pt[:k].copy(), tf[:k].copy(), v
    unit_of = np.searchsorted(starts, pos, side="right") - 1
    words = np.bincount(unit_of, minlength=n).astype(np.int64)
    has = terms >= 0
    return (words, *_sparse(unit_of[has], terms[has], n))


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
    uniq, local = unique_inverse(terms)
    v = len(uniq)
    keys, tf = unique_counts(units * v + local)
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
