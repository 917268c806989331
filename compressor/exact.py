"""The exact token count of a selection of units, without re-encoding the text.

The compressor keeps some units of a document and must know, exactly, what the result
costs the engine (Eq. 15's guarantee rests on it). Re-counting the output costs as much
as counting the input; instead this module reuses the input's chunk counts
(compressor/counting.py, compressor/document.py):

- every input cut strictly inside a kept span is still a safe cut of the output (the
  cut's left neighbour is unchanged), so chunks between two such cuts keep their counts;
- a junction where a span that starts with " x" follows one that ends in a non-space
  (most sentence boundaries) is a safe cut of the output too;
- a seam between texts is a hard boundary (each text is encoded on its own);
- only the segments around the other junctions (paragraph and line boundaries) are new
  strings; they are counted with the memoised counter, which knows their lines.

tests/property/test_counting_properties.py checks the result against tiktoken on random
texts and random selections.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from compressor.compiled import fast as _fast
from compressor.counting import TokenCounter
from compressor.document import Document


def _split_at_seams(
    spans: Sequence[tuple[int, int]], offsets: Sequence[int]
) -> tuple[list[tuple[int, int]], list[bool]]:
    """Spans cut at the seams between texts (each text is encoded on its own), and
    whether each starts a text."""
    seams = list(offsets[1:-1])
    starts = set(offsets[:-1])
    out: list[tuple[int, int]] = []
    for a, b in spans:
        k = bisect_right(seams, a)
        while k < len(seams) and seams[k] < b:
            out.append((a, seams[k]))
            a = seams[k]
            k += 1
        out.append((a, b))
    return out, [a in starts for a, _ in out]


def kept_tokens(doc: Document, spans: Sequence[tuple[int, int]], counter: TokenCounter) -> int:
    """Exact token count of the text made of `spans` (ascending, disjoint [a, b) ranges of
    doc.units.text), mostly without counting anything again. Every input cut strictly
    inside a span is still a safe cut of the output (its left neighbour is unchanged),
    and so is a junction where a span that starts with " x" follows one that ends in a
    non-space (most sentence boundaries). Output segments between such cuts that are
    input chunks keep their counts; the rest — segments around the other junctions — are
    counted with the memoised counter (they are new strings, but made of known lines)."""
    if not spans:
        return 0
    text = doc.units.text
    cs = doc.chunk_pos
    n = doc.chunk_tokens
    spans, hard = _split_at_seams(spans, doc.offsets)
    if _fast is not None and len(cs):  # the same walk in C (compressor/_fast.c)
        flat = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        walked: tuple[int, list[str]] = _fast.kept_segments(
            text, flat[:, 0].copy(), flat[:, 1].copy(), np.asarray(hard, dtype=np.int64), cs, n
        )
        return walked[0] + counter.count_all(walked[1])
    a = np.fromiter((s for s, _ in spans), dtype=np.int64, count=len(spans))
    b = np.fromiter((e for _, e in spans), dtype=np.int64, count=len(spans))
    ends = np.append(cs[1:], len(text))
    lo = np.searchsorted(cs, a, side="right")  # chunks lo..hi-1 start strictly inside a span
    hi = np.searchsorted(cs, b, side="left")
    cum = np.append(0, np.cumsum(n))
    total = int((cum[np.maximum(hi - 1, lo)] - cum[lo]).sum())  # chunks between two such cuts
    has = hi > lo
    top = len(cs) - 1
    first = cs[np.minimum(lo, top)]
    last_k = np.clip(hi - 1, 0, top)
    tail_n = np.where(has & (ends[last_k] == b), n[last_k], -1)  # the span's last chunk, if whole
    ka = np.minimum(np.searchsorted(cs, a), top)
    starts_chunk = cs[ka] == a
    head_end = np.where(has, first, b)
    head_n = np.where(starts_chunk & (ends[ka] == head_end), n[ka], -1)

    parts: list[str] = []
    known = -1  # the open segment's count when it is exactly one input chunk
    new: list[str] = []  # segments that are new strings, counted at the end

    def close() -> int:
        if not parts:
            return 0
        if known >= 0:
            return known
        new.append("".join(parts))
        return 0

    rows = zip(
        spans,
        hard,
        has.tolist(),
        head_end.tolist(),
        head_n.tolist(),
        cs[last_k].tolist(),
        tail_n.tolist(),
        strict=True,
    )
    prev_end = -1
    for (s, e), new_text, inner, h_end, h_n, tail_start, t_n in rows:
        if prev_end >= 0 and (new_text or (text[s] == " " and not text[prev_end - 1].isspace())):
            total += close()  # a new text, or a safe junction: the open segment ends here
            parts, known = [], -1
        if not parts and h_n >= 0:
            parts, known = [text[s:h_end]], h_n
        else:
            parts.append(text[s:h_end])
            known = -1
        if inner:
            total += close()
            parts, known = [text[tail_start:e]], t_n
        prev_end = e
    total += close()
    return total + counter.count_all(new)
