"""Memo look-ups for a whole text at once: pieces keyed by their UTF-8 bytes in numpy.

compressor/document.py (and compressor/counting.py for a long text) needs one memoised
value per space-delimited piece of a text (`text.split(" ")`), ~7,000 pieces for a
10K-token prompt. With `str.split` and a `dict`, each piece is a new string whose hash is
computed, then looked up one by one: ~1 ms per prompt. Here the text is encoded to UTF-8
once and every piece of at most `MAX_KEY_BYTES` bytes (≈ 99 % of the pieces of prose,
logs and JSON) gets an *exact* key — its bytes and its length, not a hash — read as
WORDS unaligned 64-bit words at its start and masked; the keys of all pieces are looked
up together in an open-addressing table held in one numpy array (a few vectorised probe
rounds). Only the longer pieces, the misses and the rare keys still unresolved after
`PROBES` rounds go through the `dict` memo, which stays the source of every value (a
miss is added to the table). ~0.7 ms against ~1 ms for a 10K-token prompt: numpy's cost
per operation bounds it (bench/compressor_ab.py).

Keys are the bytes themselves, so a lookup can never return another piece's value: a
crafted text can at worst make probes longer (then the dict answers). UTF-8 (with
`surrogatepass`, so any `str` encodes) is injective, and byte 0x20 is a space and
nothing else, so the byte pieces are exactly `text.split(" ")`'s. A piece longer than
MAX_KEY_BYTES gets a length byte no stored key has, so it never matches its prefix.

Slot index: the key's words mixed by multiplications, top bits. The table holds at most
half its slots (the owner clears it when fuller, and with the memo whose values it
holds: compressor/document.py, compressor/counting.py). 262,144 slots of 40 bytes: 10 MB
per table. Thread safety: the owner holds a lock around `lookup_spans` (the gateway
compresses on a thread pool).

With the compiled helper (compressor/_fast.c, compressor/compiled.py) the split, keys,
probes and inserts run in C on the same table, slot for slot, and pieces longer than a key
are read from the dict there; this numpy path is the fallback and the tests' reference.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from compressor.compiled import fast as _fast

IntArray = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]

WORDS = 4  # 64-bit words per key: 8 bytes each, the last one's top byte holds the length
MAX_KEY_BYTES = 8 * WORDS - 1  # 31: ≈ 99 % of the pieces of prose, logs and JSON
PROBES = 4  # vectorised probe rounds before the dict answers the rest
DEFAULT_BITS = 18  # 262,144 slots (10 MB); half of them filled at most
_MIX = [
    np.uint64(m)
    for m in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93)
]
_FOLD = np.uint64(31)


def _word_masks(w: int) -> U64Array:
    """Per piece length 0…MAX_KEY_BYTES (+ 1: longer): the bytes of key word w that belong to the
    piece (and, in the last word, the length + 1 in the top byte)."""
    out = []
    for n in range(MAX_KEY_BYTES + 2):
        mask = (1 << (8 * min(max(n - 8 * w, 0), 8))) - 1
        out.append(mask)
    return np.array(out, dtype=np.uint64)


_MASKS = [_word_masks(w) for w in range(WORDS)]
# a longer piece gets the top byte 0xFF, which no stored key has: it is never found
_LENGTHS = np.array(
    [(n + 1) << 56 for n in range(MAX_KEY_BYTES + 1)] + [0xFF << 56], dtype=np.uint64
)

Keys = list[U64Array]  # WORDS arrays, one per key word


def split_bytes(text: str) -> tuple[bytes, npt.NDArray[np.uint8], IntArray, IntArray]:
    """The UTF-8 bytes of `text`, as an array with 8·WORDS zero bytes appended, and the
    byte [start, end) of each piece of `text.split(" ")`."""
    raw = text.encode("utf-8", "surrogatepass")
    data = np.frombuffer(raw + bytes(8 * WORDS), dtype=np.uint8)
    spaces = np.flatnonzero(data[: len(raw)] == 32)
    starts = np.empty(len(spaces) + 1, dtype=np.int64)
    starts[0] = 0
    np.add(spaces, 1, out=starts[1:])
    ends = np.empty(len(spaces) + 1, dtype=np.int64)
    ends[:-1] = spaces
    ends[-1] = len(raw)
    return raw, data, starts, ends


def piece_keys(data: npt.NDArray[np.uint8], starts: IntArray, lengths: IntArray) -> Keys:
    """The exact keys of pieces of at most MAX_KEY_BYTES bytes (the others' keys are
    meaningless): word w holds bytes 8w … 8w + 7 (zero past the piece), the last word
    has length + 1 in its top byte."""
    words: U64Array = np.ndarray(  # unaligned 64-bit words at every byte offset
        (len(data) - 7,), dtype="<u8", buffer=data, strides=(1,)
    )
    n = np.minimum(lengths, MAX_KEY_BYTES + 1)
    keys: Keys = []
    for w in range(WORDS):
        key = words.take(starts + 8 * w if w else starts)
        key &= _MASKS[w].take(n)
        keys.append(key)
    keys[-1] |= _LENGTHS.take(n)
    return keys


_ROW = WORDS + 1  # uint64 per slot: the key's words, then the value
_VALUE = WORDS


class PieceTable:
    """Exact key (WORDS words) → int64 value, open addressing with linear probing. A
    slot is one row of the table (key words, then the value): a probe reads one or two
    cache lines."""

    __slots__ = ("_mask", "_rows", "_shift", "size")

    def __init__(self, bits: int = DEFAULT_BITS) -> None:
        cap = 1 << bits
        # the last key word is 0 only in an empty slot (a key's top byte is ≥ 1)
        self._rows = np.zeros(cap * _ROW, dtype=np.uint64)
        self._mask = cap - 1
        self._shift = np.uint64(64 - bits)
        self.size = 0

    @property
    def capacity(self) -> int:
        return self._mask + 1

    @property
    def rows(self) -> U64Array:
        """The slots, row after row (read by compressor/_fast.c)."""
        return self._rows

    @property
    def shift(self) -> int:
        """64 − bits: a hash's top bits are its home slot."""
        return int(self._shift)

    def clear(self) -> None:
        self._rows.fill(0)
        self.size = 0

    def full(self) -> bool:
        return 2 * self.size >= self.capacity

    def _slots(self, keys: Keys) -> IntArray:
        """Each key's home slot: its words mixed by multiplications, the top bits."""
        with np.errstate(over="ignore"):
            h = keys[0] * _MIX[0]
            for w in range(1, WORDS):
                h += keys[w] * _MIX[w]
            h ^= h >> _FOLD
            h *= _MIX[0]
        out: IntArray = (h >> self._shift).astype(np.int64)
        return out

    def lookup(self, keys: Keys) -> tuple[IntArray, npt.NDArray[np.bool_]]:
        """Values of the keys and which were found (not found: absent, or still probing
        after PROBES rounds)."""
        n = len(keys[0])
        values = np.zeros(n, dtype=np.int64)
        found = np.zeros(n, dtype=np.bool_)
        if self.size == 0 or n == 0:
            return values, found
        slot = self._slots(keys)
        todo = np.arange(n)
        rows = self._rows
        for _ in range(PROBES):
            base = slot * _ROW
            last = rows.take(base + (WORDS - 1))
            hit = last == keys[-1]
            for w in range(WORDS - 1):
                hit &= rows.take(base + w if w else base) == keys[w]
            at = todo[hit]
            values[at] = rows.take(base[hit] + _VALUE).view(np.int64)
            found[at] = True
            more = ~hit & (last != 0)  # occupied by another key: probe on
            if not more.any():
                break
            todo = todo[more]
            keys = [k[more] for k in keys]
            slot = (slot[more] + 1) & self._mask
        return values, found

    def insert(self, keys: Keys, values: IntArray) -> None:
        """Add distinct keys; one still unplaced after PROBES rounds is left out (the
        dict keeps answering for it)."""
        if len(keys[0]) == 0:
            return
        slot = self._slots(keys)
        todo = np.arange(len(keys[0]))
        rows = self._rows
        for _ in range(PROBES):
            cand = np.flatnonzero(rows.take(slot * _ROW + (WORDS - 1)) == 0)
            left = np.ones(len(todo), dtype=np.bool_)
            if len(cand):
                # one key per free slot this round: the first that wants it
                _, first = np.unique(slot[cand], return_index=True)
                put = cand[first]
                base, which = slot[put] * _ROW, todo[put]
                rows[base + _VALUE] = values[which].view(np.uint64)
                for w in range(WORDS):
                    rows[base + w] = keys[w][which]
                self.size += len(put)
                left[put] = False
            if not left.any():
                return
            todo = todo[left]
            slot = (slot[left] + 1) & self._mask


class Spans(NamedTuple):
    """A text's UTF-8 bytes and the byte [start, end) of each piece of `text.split(" ")`."""

    raw: bytes
    starts: IntArray
    ends: IntArray


def lookup_spans(table: PieceTable, text: str, memo: dict[str, int]) -> tuple[IntArray, Spans]:
    """Memo values of `text.split(" ")`'s pieces: through the table, and the dict `memo`
    (its `__getitem__`, so a subclass's `__missing__` computes a new piece) for the rest
    (whose short keys are then added to the table); and the pieces' byte spans
    (compressor/counting.py's chunk counts read the chunks from them)."""
    if _fast is not None:
        return lookup_pieces_fast(_fast, table, text, memo)
    return lookup_pieces_numpy(table, text, memo)


def lookup_pieces_numpy(
    table: PieceTable, text: str, memo: dict[str, int]
) -> tuple[IntArray, Spans]:
    """lookup_spans in numpy (the fallback, and the reference for the C path)."""
    raw, data, starts, ends = split_bytes(text)
    lengths = ends - starts
    keys = piece_keys(data, starts, lengths)
    values, found = table.lookup(keys)
    rest = np.flatnonzero(~found)
    if len(rest):
        _resolve(table, text, memo.__getitem__, raw, starts, ends, values, rest, keys)
    return values, Spans(raw, starts, ends)


def lookup_pieces_fast(
    fast: ModuleType, table: PieceTable, text: str, memo: dict[str, int]
) -> tuple[IntArray, Spans]:
    """lookup_spans with the split, the keys and the probes in C (one pass, the same table
    and the same results; pieces longer than a key are looked up in `memo` there too, so
    only true misses come back); the misses go through the same `_resolve`."""
    raw = text.encode("utf-8", "surrogatepass")
    n = fast.count_spaces(raw) + 1  # bytes.count is ~10× slower on a one-byte needle
    values = np.empty(n, dtype=np.int64)
    found = np.empty(n, dtype=np.bool_)
    starts = np.empty(n, dtype=np.int64)
    ends = np.empty(n, dtype=np.int64)
    fast.probe_pieces(
        raw, table.rows, table.capacity - 1, table.shift, memo, values, found, starts, ends
    )
    rest = np.flatnonzero(~found)
    if len(rest):
        _resolve(table, text, memo.__getitem__, raw, starts, ends, values, rest, fast)
    return values, Spans(raw, starts, ends)


def _resolve(
    table: PieceTable,
    text: str,
    memo: Callable[[str], int],
    raw: bytes,
    starts: IntArray,
    ends: IntArray,
    values: IntArray,
    rest: IntArray,
    keys: Keys | ModuleType,
) -> None:
    """The pieces at `rest` (not found in the table) from the dict `memo`, written into
    `values`; their short keys are then added to the table: from `keys`, all pieces' keys
    (the numpy path), or made and placed by the compiled helper `keys` is (the C path)."""
    lengths = ends - starts
    at = rest.tolist()
    piece_at: Callable[[int], str]
    if 8 * len(rest) > len(starts):  # many misses (a cold table): split the text once
        pieces = text.split(" ")
        got = list(map(memo, map(pieces.__getitem__, at)))
        piece_at = pieces.__getitem__
    else:
        spans = zip(starts[rest].tolist(), ends[rest].tolist(), strict=True)
        missed = [raw[a:b].decode("utf-8", "surrogatepass") for a, b in spans]
        got = list(map(memo, missed))
        where = dict(zip(at, missed, strict=True))
        piece_at = where.__getitem__
    values[rest] = got
    keyed = rest[lengths[rest] <= MAX_KEY_BYTES].tolist()[::-1]
    # one index per distinct piece (its first occurrence: later ones are overwritten)
    new = list(dict(zip(map(piece_at, keyed), keyed, strict=True)).values())
    if new:
        if isinstance(keys, ModuleType):  # the C path: keys made and placed there
            at = np.asarray(new, dtype=np.int64)
            table.size += keys.insert_pieces(
                raw, starts, ends, at, values[at], table.rows, table.capacity - 1, table.shift
            )
        else:
            table.insert([k[new] for k in keys], values[new])
