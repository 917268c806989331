"""Pasted JSON is compressed by dropping whole records, never lines (issue 24).

A JSON paste (an API answer, a lock file, a tool's output) is a list of records: a
top-level array, or an object whose largest field is an array (`{"packages": [...],
"count": 3}`). Dropping lines of it, as the sentence compressor does with prose, would
leave JSON that no longer parses; dropping whole items of that array leaves valid JSON
with fewer records, which is what a reader skimming the paste loses anyway.

`find_records(text)` locates the first JSON value in a text that parses (a `{` or `[`
at a line start, decoded with the standard library's `raw_decode`), and the byte spans
of its record array's items. `keep_records(text, found, keep)` rebuilds the text with
only the items in `keep`, in order, reusing the original's own separators, indentation
and surroundings, so the result parses whenever the original did
(tests/unit/compressor/test_records.py checks it with `json.loads`).

Pure: no I/O; the exact counts are the caller's (compressor/compress.py's `fit_records`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MIN_RECORDS = 4  # fewer items than this: nothing worth choosing among
MIN_SHARE = 0.5  # the array must hold at least this share of the text's characters
_DECODER = json.JSONDecoder()
_OPEN = re.compile(r"(?:^|\n)[^\S\n]*([\[{])")
_WS = " \t\n\r"


@dataclass(frozen=True, slots=True)
class Records:
    """Where a text's record array lies: `items` are (start, end) of each item."""

    start: int  # of the JSON value (its `{` or `[`)
    end: int  # just past it
    items: tuple[tuple[int, int], ...]


def _items(text: str, pos: int) -> tuple[list[tuple[int, int]], int] | None:
    """Item spans of the array whose `[` is at `pos`, and the position past its `]`."""
    i = pos + 1
    n = len(text)
    spans: list[tuple[int, int]] = []
    while i < n and text[i] in _WS:
        i += 1
    if i < n and text[i] == "]":
        return spans, i + 1
    while i < n:
        try:
            _, end = _DECODER.raw_decode(text, i)
        except ValueError:
            return None
        spans.append((i, end))
        i = end
        while i < n and text[i] in _WS:
            i += 1
        if i < n and text[i] == ",":
            i += 1
            while i < n and text[i] in _WS:
                i += 1
            continue
        if i < n and text[i] == "]":
            return spans, i + 1
        return None
    return None


def _largest_array(text: str, start: int, end: int, value: object) -> int | None:
    """Position of the `[` of the largest array field of the object at `start`."""
    if not isinstance(value, dict):
        return None
    best, best_len = None, 0
    for key, v in value.items():
        if not isinstance(v, list) or len(v) < MIN_RECORDS:
            continue
        m = re.compile(r'"' + re.escape(key) + r'"\s*:\s*\[').search(text, start, end)
        if m is None:
            continue
        size = len(json.dumps(v))
        if size > best_len:
            best, best_len = m.end() - 1, size
    return best


def find_records(text: str) -> Records | None:
    """The record array of the first JSON value in `text` (see the module docstring), or
    None when there is none worth dropping records from."""
    if "{" not in text and "[" not in text:
        return None
    for m in _OPEN.finditer(text):
        start = m.start(1)
        try:
            value, end = _DECODER.raw_decode(text, start)
        except ValueError:
            continue
        if end - start < MIN_SHARE * len(text):
            continue
        at = start if isinstance(value, list) else _largest_array(text, start, end, value)
        if at is None:
            return None
        found = _items(text, at)
        if found is None or len(found[0]) < MIN_RECORDS:
            return None
        return Records(start, end, tuple(found[0]))
    return None


def keep_records(text: str, found: Records, keep: list[int]) -> str:
    """`text` with only the record items whose indices are in `keep` (ascending; at
    least one). Items keep their own bytes; between two kept items goes the separator
    that followed the first of them in the original (so indentation stays as it was)."""
    items = found.items
    if not keep:
        raise ValueError("keep at least one record")
    out = [text[: items[0][0]]]  # up to and with the array's `[` and its first indent
    for a in keep[:-1]:
        out.append(text[items[a][0] : items[a][1]])
        out.append(text[items[a][1] : items[a + 1][0]])  # ",\n    " as the original had it
    last = keep[-1]
    out.append(text[items[last][0] : items[last][1]])
    out.append(text[items[-1][1] :])  # the whitespace and `]` after the last item, and on
    return "".join(out)


def spread(n: int, k: int) -> list[int]:
    """`k` of `n` indices spread evenly, the first and the last always among them."""
    if k >= n:
        return list(range(n))
    if k <= 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _fit_text(
    text: str,
    found: Records,
    target: int,
    count: Callable[[str], int],
    before: int,
) -> tuple[str, int, int] | None:
    """The most records of `text` (spread evenly) whose request counts ≤ `target`:
    (text, its request's tokens, records kept), or None when one record is too many.
    A bisection on how many are kept, every step an exact count (records differ in
    length too much for a proportional guess: one package lists 2 requirements, the next
    40); ~log2(n) counts."""
    n = len(found.items)
    one = keep_records(text, found, [0])
    low = count(one)
    if low > target:
        return None
    best: tuple[str, int, int] = (one, low, 1)
    lo, hi = 2, n - 1  # n itself is the original, which did not fit
    while lo <= hi:
        k = (lo + hi) // 2
        keep = spread(n, k)
        candidate = keep_records(text, found, keep)
        tokens = count(candidate)
        if tokens <= target:
            best = (candidate, tokens, len(keep))
            lo = k + 1
        else:
            hi = k - 1
    return best


def fit_records(
    target: int,
    count_before: Callable[[], int],
    prompt: str | None,
    messages: Sequence[Mapping[str, Any]] | None,
    count_prompt: Callable[[str], int],
    count_chat: Callable[[list[dict[str, Any]]], int],
    protect_last_user: bool = False,
) -> tuple[str | None, list[dict[str, Any]] | None, int, int, int] | None:
    """Drop whole records of a request's JSON paste until its exact count (`count_*`,
    the served template's) is at most `target`: (prompt, messages, tokens after, records,
    records dropped); None when the request holds no record array (the caller compresses
    as before; nothing was counted) or when keeping a single record is still too long.
    `count_before`: the request's exact count as given (asked only once records are found)."""
    if messages is None:
        text = prompt or ""
        found = find_records(text)
        if found is None:
            return None
        before = count_before()
        fitted = _fit_text(text, found, target, count_prompt, before)
        if fitted is None:
            return None
        return fitted[0], None, fitted[1], len(found.items), len(found.items) - fitted[2]
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    best: tuple[int, int, Records] | None = None
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, str) or m.get("role") in ("system", "developer"):
            continue
        if i == last_user and protect_last_user:
            continue
        if best is not None and len(content) <= best[0]:
            continue
        found = find_records(content)
        if found is not None:
            best = (len(content), i, found)
    if best is None:
        return None
    _, at, found = best
    original = [dict(m) for m in messages]
    text = str(original[at]["content"])

    def count(candidate: str) -> int:
        trial = list(original)
        trial[at] = {**original[at], "content": candidate}
        return count_chat(trial)

    fitted = _fit_text(text, found, target, count, count_before())
    if fitted is None:
        return None
    sent = [dict(m) for m in messages]
    sent[at] = {**sent[at], "content": fitted[0]}
    return None, sent, fitted[1], len(found.items), len(found.items) - fitted[2]
