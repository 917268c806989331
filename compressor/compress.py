"""Compress-and-Route's compressor: fit a request into T_c tokens, exactly (FleetOpt §5).

Entry points (pure; the gateway times them, the compressor reads no clock):

    fit_request(target, prompt=… | messages=…, may_compress=…, likely_fits=…)
    compress_prompt(prompt, target) / compress_chat(messages, target) → Compression
    request_tokens(prompt=… | messages=…) → the engine's exact count

`target` is T_c = B_short − L_out in the engine's tokens: the whole prompt as the engine
counts it, template and BOS included (compressor/template.py). Eq. 15's guarantee,
T_c + L_out = B_short, holds because the result's cl100k count is computed *exactly*
(compressor/document.py's `kept_tokens`, checked against tiktoken by the property tests)
and units are dropped until it fits: `tokens_after ≤ target` whenever `fits`. Otherwise
the request comes back unchanged with `fits` false and a `detail`, and the caller routes
it uncompressed (the long pool) or refuses it.

What may be shortened: in a chat, every message text except the system/developer
prompts, texts that are code (compressor/content.py) and messages whose content has
several text parts — those come back as the same objects; the last user message too
(issue 13: most real borderline prompts are one user message holding a pasted text and a
question), unless `protect_last_user`. In a completion, the whole prompt unless it is
code. All message texts are analysed as one document (each text one segment, encoded on
its own like the template does), the fixed ones as single mandatory units, so IDF, the
similarity graph and novelty see the whole conversation, and the bulkiest shortenable
content — a pasted document, retrieved passages in a tool message, long earlier turns —
loses the most units, while every shortenable text keeps its first `keep_first` (at least
1: it holds the template's "\n\n") and last `keep_last` units (FleetOpt §5.2's
primacy/recency invariant, applied per text) and its fenced code blocks byte-identical,
and the last user message (or the completion prompt) keeps its trailing question whole
(compressor/question.py: the short trailing paragraphs, else `question_tail_tokens`).
Pipeline: split (sentences.py) → count and index terms (document.py) → score
(scoring.py) → greedy select (select.py) → exact count → trim and repeat if over, or one
refill if well under → assemble in the original order.

A request with nothing shortenable (every text protected, code, empty, or with less than
`MIN_SHORTENABLE_CHARS` outside its fenced blocks) is known before any analysis: it is
only counted. One whose mandatory units alone exceed the target is known right after the
split, before scoring.

Counting is the served model's (`template`: its vocabulary and chat template,
compressor/template.py; default cl100k in the emulator's Llama-3.0 layout). A template
with `verify` (a real model's Jinja template) compresses to `target − margin` and has the
result counted again, rendered: quickly (piece by piece, within `template.margin` of the
engine's count, compressor/hf_template.py) and with a full encode only when that count
is within the margin of the target (`settled_count`); over the target, the compression
is redone for a target lowered by the excess (at most `max_verify` times). A request
that fits as given is never compressed: its count near the target is settled the same
way.

Failure posture: never raises for content reasons and never returns more than `target`
tokens with `fits` true; when the mandatory units alone exceed the target, or nothing is
shortenable, the answer is "does not fit" and the caller falls back.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from compressor.content import code_outside_fences, unfenced
from compressor.counting import default_counter
from compressor.document import Analyzer, Document
from compressor.exact import kept_tokens
from compressor.question import DEFAULT_TAIL_TOKENS, question_tail
from compressor.records import fit_records
from compressor.scoring import ScoreConfig, scores
from compressor.select import BoolArray, greedy_select, refill, trim
from compressor.sentences import DEFAULT_MAX_UNIT_CHARS
from compressor.template import Message, ServedTemplate, Slot, Tools, default_template

PROTECTED_ROLES = frozenset({"system", "developer"})
# a text with less than this outside its fenced blocks has nothing to lose: its first
# `keep_first` and last `keep_last` units (or its question) are all of it
MIN_SHORTENABLE_CHARS = 400


@dataclass(frozen=True, slots=True)
class CompressorConfig:
    scoring: ScoreConfig = field(default_factory=ScoreConfig)
    keep_first: int = 3  # FleetOpt §5.2: primacy invariant (instructions, topic)
    keep_last: int = 2  # FleetOpt §5.2: recency invariant (the question, the latest turn)
    max_unit_chars: int = DEFAULT_MAX_UNIT_CHARS  # finer units for tables and run-on lists
    max_rounds: int = 6  # exact counts before giving up; one suffices almost always
    select_margin: int = 0  # select for T_c − this (a margin trades tokens for fewer trims)
    refill_slack: int = 48  # tokens left under T_c worth one more exact count to fill
    skip_code: bool = True  # FleetOpt §5.2's safety gate: code is never compressed
    max_verify: int = 3  # re-compressions after a full recount over the target (verify templates)
    # the last user message is never shortened (the behaviour before issue 13)
    protect_last_user: bool = False
    # the trailing question of the last user message / completion prompt is kept whole:
    # its short trailing paragraphs up to this many tokens (compressor/question.py)
    question_tail_tokens: int = DEFAULT_TAIL_TOKENS


@dataclass(frozen=True, slots=True)
class Compression:
    """The outcome. `prompt` xor `messages` is the request to send: compressed when
    `changed`, the original otherwise. Token counts are exact (engine's count)."""

    target: int
    tokens_before: int
    tokens_after: int
    prompt: str | None = None
    messages: list[Message] | None = None
    units: int = 0
    units_dropped: int = 0
    detail: str = ""

    @property
    def fits(self) -> bool:
        return self.tokens_after <= self.target

    @property
    def changed(self) -> bool:
        return self.units_dropped > 0

    @property
    def tokens_removed(self) -> int:
        return self.tokens_before - self.tokens_after


@lru_cache(maxsize=1)
def default_analyzer() -> Analyzer:
    """The process-wide analyzer (its memo is shared by every request)."""
    return Analyzer()


_ANALYZERS: dict[int, tuple[ServedTemplate, Analyzer]] = {}


def analyzer_for(template: ServedTemplate) -> Analyzer:
    """The analyzer that counts with `template`'s vocabulary (one memo per template)."""
    if template.counter is default_counter():
        return default_analyzer()
    held = _ANALYZERS.get(id(template))
    if held is None or held[0] is not template:
        held = _ANALYZERS[id(template)] = (template, Analyzer(template.counter))
    return held[1]


@dataclass(frozen=True, slots=True)
class _Outcome:
    texts: list[str]  # the segments to send (the input ones unless units were dropped)
    before: int
    after: int
    units: int
    dropped: int = 0
    detail: str = ""


def _spans(doc: Document, keep: BoolArray) -> list[tuple[int, int]]:
    """[a, b) character ranges of the runs of consecutive kept units."""
    starts = np.asarray(doc.units.starts, dtype=np.int64)
    ends = np.append(starts[1:], len(doc.units.text))
    edge = np.diff(keep.astype(np.int8), prepend=0, append=0)
    first = np.flatnonzero(edge == 1)
    last = np.flatnonzero(edge == -1)
    return list(zip(starts[first].tolist(), ends[last - 1].tolist(), strict=True))


def _assemble(doc: Document, spans: list[tuple[int, int]]) -> list[str]:
    """Each segment's text made of the kept spans (a span may cross seams)."""
    text = doc.units.text
    seams = list(doc.offsets)
    out: list[list[str]] = [[] for _ in range(len(seams) - 1)]
    for a, b in spans:
        k = bisect_right(seams, a) - 1
        while k + 2 < len(seams) and seams[k + 1] == a:
            k += 1  # an empty segment ends where this one starts
        while b > seams[k + 1]:  # a run that crosses a seam belongs to two segments
            out[k].append(text[a : seams[k + 1]])
            a = seams[k + 1]
            k += 1
        out[k].append(text[a:b])
    return ["".join(p) for p in out]


def _mandatory(
    doc: Document, editable: list[bool], config: CompressorConfig, question: int | None
) -> BoolArray:
    """Fixed and code units, each editable text's first `keep_first` (at least 1: it
    holds the template's "\n\n") and last `keep_last` units (for all texts at once), and the trailing question of text `question`."""
    keep = np.asarray(doc.units.fixed, dtype=np.bool_) | np.asarray(doc.units.code, dtype=np.bool_)
    group = doc.group
    start = np.searchsorted(group, group, side="left")
    at = np.arange(len(group)) - start  # a unit's index within its text
    ends = at < max(config.keep_first, 1)
    if config.keep_last > 0:
        ends |= at >= np.searchsorted(group, group, side="right") - start - config.keep_last
    keep |= ends & np.asarray(editable, dtype=np.bool_)[group]
    if question is not None and editable[question]:
        end = int(np.searchsorted(group, question, side="right"))
        keep[question_tail(doc, question, config.question_tail_tokens) : end] = True
    return keep


def _compress(
    fixed: int,
    texts: list[str],
    editable: list[bool],
    target: int,
    config: CompressorConfig,
    analyzer: Analyzer,
    question: int | None = None,
) -> _Outcome:
    """Drop units of the editable texts until fixed + Σ tokens(text) ≤ `target` (each text
    is encoded on its own, compressor/template.py); text `question` keeps its trailing
    question."""
    if not texts:
        return _Outcome(texts, fixed, fixed, 0)
    if not any(editable):  # nothing to shorten: count, and skip the analysis
        before = fixed + analyzer.count_all(texts)
        detail = "" if before <= target else "nothing to shorten"
        return _Outcome(texts, before, before, 0, detail=detail)
    doc = analyzer.analyse(texts, [not e for e in editable], config.max_unit_chars)
    n = len(doc)
    before = fixed + int(doc.tokens.sum())  # exact: Σ over every text's chunks
    if before <= target:
        return _Outcome(texts, before, before, n)
    mandatory = _mandatory(doc, editable, config, question)
    if bool(mandatory.all()):
        return _Outcome(texts, before, before, n, detail="nothing to shorten")
    room = target - fixed
    detail = "the units kept whole exceed the target"
    if int(doc.tokens[mandatory].sum()) > room:  # no selection fits: known before scoring
        return _Outcome(texts, before, before, n, detail=detail)
    score = scores(doc, config.scoring)
    keep = greedy_select(doc.tokens, score, mandatory, room - config.select_margin)
    if keep is None:
        keep = greedy_select(doc.tokens, score, mandatory, room)
    if keep is not None:
        for _ in range(max(config.max_rounds, 1)):
            spans = _spans(doc, keep)
            after = kept_tokens(doc, spans, analyzer.counter)
            if after <= room:
                if room - after >= config.refill_slack:  # one exact try to use the slack
                    more = refill(keep, doc.tokens, score, room - after - config.refill_slack // 2)
                    if more is not None:
                        more_spans = _spans(doc, more)
                        more_after = kept_tokens(doc, more_spans, analyzer.counter)
                        if more_after <= room:
                            keep, spans, after = more, more_spans, more_after
                out = _assemble(doc, spans)
                return _Outcome(out, before, fixed + after, n, int(n - keep.sum()))
            if not trim(keep, doc.tokens, score, mandatory, after - room):
                break
        else:
            detail = f"still above the target after {config.max_rounds} exact counts"
    return _Outcome(texts, before, before, n, detail=detail)


def compress_prompt(
    prompt: str,
    target: int,
    config: CompressorConfig | None = None,
    analyzer: Analyzer | None = None,
    template: ServedTemplate | None = None,
) -> Compression:
    """Fit a completion prompt into `target` tokens (see the module docstring)."""
    config = config or _DEFAULT
    template = template or default_template()
    analyzer = analyzer or analyzer_for(template)
    rest = unfenced(prompt)
    code = config.skip_code and code_outside_fences(rest)
    editable = not code and len(rest) >= MIN_SHORTENABLE_CHARS
    bos = template.completion_tokens("")
    out = _compress(bos, [prompt], [editable], target, config, analyzer, question=0)
    detail = "code is not compressed" if code and out.before > target else out.detail
    return Compression(
        target, out.before, out.after, out.texts[0], None, out.units, out.dropped, detail
    )


def _replace(messages: list[Message], slots: list[Slot | None], texts: list[str]) -> list[Message]:
    """A copy of `messages` with the slotted texts replaced; untouched messages are the
    same objects, edited ones shallow copies."""
    out = list(messages)
    for slot, text in zip(slots, texts, strict=True):
        if slot is None:
            continue
        i, k = slot
        m = out[i]
        if k is None:
            if m.get("content") != text:
                out[i] = {**m, "content": text}
        else:
            parts: list[Any] = list(m.get("content") or [])
            if parts[k].get("text") != text:
                parts[k] = {**parts[k], "text": text}
                out[i] = {**m, "content": parts}
    return out


def compress_chat(
    messages: Sequence[Message],
    target: int,
    config: CompressorConfig | None = None,
    analyzer: Analyzer | None = None,
    template: ServedTemplate | None = None,
    tools: Tools = (),
) -> Compression:
    """Fit a chat request into `target` tokens (see the module docstring)."""
    config = config or _DEFAULT
    template = template or default_template()
    analyzer = analyzer or analyzer_for(template)
    if not template.verify:
        return _compress_chat(messages, target, config, analyzer, template, tools)[0]
    margin = template.margin
    aim = target - margin  # a quick count this far under the target needs no full encode
    result, fixed = _compress_chat(messages, aim, config, analyzer, template, tools)
    before = result.tokens_before  # the original's quick count
    if not result.changed or aim < before <= target + margin:
        # as given it may fit: the original's count decides (exact when near the target)
        before = settled_count(before, target, margin, template, messages, tools)
        if before <= target or not result.changed:
            detail = "" if before <= target else result.detail
            return replace(result, target=target, tokens_before=before, tokens_after=before,
                           messages=list(messages), units_dropped=0, detail=detail)  # fmt: skip
    for _ in range(max(config.max_verify, 1)):
        sent = result.messages or []
        # the edited texts' tokens are exact (kept_tokens); the template around them is
        # counted again, as rendered for the result
        quick = template.fixed_tokens(sent, tools) + result.tokens_after - fixed
        count = settled_count(quick, target, margin, template, sent, tools)
        if count <= target:
            return replace(result, target=target, tokens_before=before, tokens_after=count)
        aim -= count - target
        result, fixed = _compress_chat(messages, aim, config, analyzer, template, tools)
        if not result.changed:
            break
    return Compression(
        target, before, before, None, list(messages), result.units,
        detail="still above the target after a recount",
    )  # fmt: skip


def settled_count(
    quick: int,
    target: int,
    margin: int,
    template: ServedTemplate,
    messages: Sequence[Message],
    tools: Tools = (),
) -> int:
    """A chat's count as far as `target` is concerned: its quick count when that is more
    than `margin` from the target (the engine's count, within `margin` of it, is on the
    same side), else the engine's exact count (`template.chat_tokens`, a full encode).
    So `settled ≤ target` exactly when the engine's count is ≤ target."""
    if target - margin < quick <= target + margin:
        return template.chat_tokens(messages, tools)
    return quick


def _compress_chat(
    messages: Sequence[Message],
    target: int,
    config: CompressorConfig,
    analyzer: Analyzer,
    template: ServedTemplate,
    tools: Tools,
) -> tuple[Compression, int]:
    """The compression for `target` and the template's tokens outside the texts (`fixed`)."""
    original = list(messages)
    last_user = max((i for i, m in enumerate(original) if m.get("role") == "user"), default=-1)

    def editable(i: int, role: str, text: str) -> bool:
        if role in PROTECTED_ROLES or not text.strip():
            return False
        if i == last_user and config.protect_last_user:
            return False
        if len(text) < MIN_SHORTENABLE_CHARS:
            return False
        rest = unfenced(text)
        if len(rest) < MIN_SHORTENABLE_CHARS:
            return False  # short, or fenced code and a question: nothing to shorten
        return not (config.skip_code and code_outside_fences(rest))

    fixed, texts, slots = template.chat_segments(original, editable, tools)
    question = last_user if last_user >= 0 else None
    out = _compress(
        fixed, texts, [s is not None for s in slots], target, config, analyzer, question
    )
    if not out.dropped:
        sent = original
    else:
        new = [t[len(template.content_prefix) :] for t in out.texts]
        sent = _replace(original, slots, new)
    result = Compression(
        target, out.before, out.after, None, sent, out.units, out.dropped, out.detail
    )
    return result, fixed


_DEFAULT = CompressorConfig()


def fit_request(
    target: int,
    *,
    prompt: str | None = None,
    messages: Sequence[Message] | None = None,
    may_compress: bool = True,
    likely_fits: bool = False,
    config: CompressorConfig | None = None,
    analyzer: Analyzer | None = None,
    template: ServedTemplate | None = None,
    tools: Tools = (),
) -> Compression:
    """What the gateway calls for a placement with `compress_to` (policies/pools.py):
    make a completion `prompt` or chat `messages` fit `target` prompt tokens exactly.
    `may_compress` false: only count (fits or not, never changed). `likely_fits` (the
    estimate is below the target): count first and analyse only if it does not fit.
    `template`: the served model's (default cl100k in the Llama-3.0 layout); `tools`: the
    request's tool schemas, which the template renders into the prompt."""
    template = template or default_template()
    analyzer = analyzer or analyzer_for(template)
    if likely_fits or not may_compress:
        if messages is not None:  # quick, exact near the target (see settled_count)
            quick = template.quick_chat_tokens(messages, tools)
            tokens = settled_count(quick, target, template.margin, template, messages, tools)
        else:
            tokens = template.completion_tokens(prompt or "")
        if tokens <= target or not may_compress:
            detail = "" if tokens <= target else "may not be compressed"
            sent = list(messages) if messages is not None else None
            return Compression(target, tokens, tokens, prompt, sent, detail=detail)
    records = _fit_records(target, prompt, messages, template, tools, config or _DEFAULT)
    if records is not None:
        return records
    if messages is not None:
        return compress_chat(messages, target, config, analyzer, template, tools)
    return compress_prompt(prompt or "", target, config, analyzer, template)


def _fit_records(
    target: int,
    prompt: str | None,
    messages: Sequence[Message] | None,
    template: ServedTemplate,
    tools: Tools,
    config: CompressorConfig,
) -> Compression | None:
    """A request whose bulk is a JSON paste loses whole records, never lines
    (compressor/records.py); None for every other request (compressed as before)."""
    texts = [prompt or ""] if messages is None else [str(m.get("content")) for m in messages]
    if not any(("{" in t or "[" in t) and len(t) >= MIN_SHORTENABLE_CHARS for t in texts):
        return None

    @lru_cache(maxsize=1)
    def before() -> int:
        if messages is not None:
            return template.chat_tokens(messages, tools)
        return template.completion_tokens(prompt or "")

    fitted = fit_records(
        target, before, prompt, messages,
        template.completion_tokens, lambda m: template.chat_tokens(m, tools),
        config.protect_last_user,
    )  # fmt: skip
    if fitted is None:
        return None
    new_prompt, new_messages, after, units, dropped = fitted
    sent: list[Message] | None = None if new_messages is None else list(new_messages)
    return Compression(target, before(), after, new_prompt, sent, units, dropped)


def request_tokens(
    prompt: str | None = None,
    messages: Sequence[Message] | None = None,
    template: ServedTemplate | None = None,
    tools: Tools = (),
) -> int:
    """Exact prompt tokens of a request as the engine counts it (template included)."""
    template = template or default_template()
    if messages is not None:
        return template.chat_tokens(messages, tools)
    return template.completion_tokens(prompt or "")
