"""What the emulated model says: how many tokens, and which text.

EOS model: the first token is never EOS (a chat model always says something); from the
second position on the model emits EOS with probability p = 1/(mean − 1), so the natural
output length N (EOS included, as vLLM counts it) is 2 + geometric, with mean
`mean_output_tokens` (at least 2): N = 2 + ⌊ln U / ln(1 − p)⌋. U is drawn from a hash of
the seed, the request's own `seed`, the choice index and the prompt's token ids, so the
same request always gets the same length (like greedy decoding) and different prompts
get different ones. With `ignore_eos` the length is exactly max_tokens. `min_tokens`
masks EOS (and stop tokens) for the first min_tokens positions, as vLLM's and SGLang's
min-tokens processors do, so EOS comes at position ≥ min_tokens + 1. The engine then
finishes with "stop" if N < max_tokens, else "length" (the token at max_tokens is text).

Stop conditions (`plan_outcome`): `stop` strings and `stop_token_ids` end generation
at the token that matches, which is still generated and counted (usage, engine time);
the text ends before the stop string (or without the stop token), as with vLLM's
default `include_stop_str_in_output=false` and SGLang's stop trimming. The match is
found the way each server looks for it (vLLM's incremental detokenizer: only in the new
text, not before min_tokens, the one that completes first, ties in list order; SGLang:
after its length check, the first in list order, cut at its first occurrence).

Logprobs (`token_logprobs`): the recited token is always the most likely one (greedy),
so it heads its own top list; the alternatives are other passage tokens with smaller,
strictly finite, negative logprobs whose probabilities sum to less than one. Values are a
hash of the choice's key and the position: deterministic per seed and request.

Text: the model recites a fixed ASCII passage token by token (cycling), so every output
token is one cl100k token whose text decodes on its own: each streamed delta carries
exactly one token's text, and a "stop" ends with the EOS token, whose text is "".
"""

from __future__ import annotations

import hashlib
import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from emulator.chat_template import decode, encode

PASSAGE = (
    " Continuous batching keeps the accelerator busy: every step runs each request in the"
    " batch once, prefilling prompts in chunks and decoding one token for the others."
    " Latency grows with the batch, so a good router spreads long prompts across workers,"
    " keeps shared prefixes together to reuse the cache, and leaves headroom for bursts."
    " Short requests should not wait behind long ones; fair queues and token budgets make"
    " sure that every tenant gets the share it paid for, even when the fleet is busy."
)


@dataclass(frozen=True, slots=True)
class OutputModel:
    mean_output_tokens: float = 128.0  # mean natural answer length; ShareGPT-like chats
    seed: int = 0  # the emulator's --seed: change it to get other lengths for the same prompts

    def natural_length(
        self, prompt_ids: Sequence[int], index: int = 0, request_seed: int | None = None
    ) -> int:
        """Tokens up to and including EOS, ≥ 2: EOS never comes first."""
        if self.mean_output_tokens <= 2:
            return 2
        u = (self.choice_key(prompt_ids, index, request_seed) + 1) / 2.0**64  # (0, 1]
        p = 1.0 / (self.mean_output_tokens - 1)
        return 2 + math.floor(math.log(u) / math.log1p(-p))

    def choice_key(
        self, prompt_ids: Sequence[int], index: int = 0, request_seed: int | None = None
    ) -> int:
        """64 bits that name one choice of one request under this seed."""
        h = hashlib.blake2b(digest_size=8, salt=b"fleetgate-eos")
        h.update(f"{self.seed}/{request_seed}/{index}/".encode())
        h.update(array("q", prompt_ids).tobytes())
        return int.from_bytes(h.digest(), "big")


def plan_output(natural: int, max_tokens: int, ignore_eos: bool, min_tokens: int = 0) -> int:
    """The engine's `output_tokens` for a request: tokens it generates before stopping.

    EOS is masked while fewer than `min_tokens` tokens exist, so it comes no earlier than
    position min_tokens + 1.
    """
    if ignore_eos:
        return max_tokens
    return max(1, min(max_tokens, max(natural, min_tokens + 1)))


@lru_cache(maxsize=1)
def _passage_ids() -> tuple[int, ...]:
    return tuple(encode(PASSAGE))


@lru_cache(maxsize=1)
def _passage_tokens() -> tuple[str, ...]:
    return tuple(decode([t]) for t in _passage_ids())


def token_id(i: int) -> int:
    """Token id of the i-th generated (non-EOS) token."""
    ids = _passage_ids()
    return ids[i % len(ids)]


def token_text(i: int) -> str:
    """Text of the i-th generated (non-EOS) token."""
    toks = _passage_tokens()
    return toks[i % len(toks)]


def output_text(start: int, stop: int) -> str:
    """Text of generated tokens [start, stop) (none of them EOS)."""
    toks = _passage_tokens()
    n = len(toks)
    return "".join(toks[i % n] for i in range(start, stop))


@lru_cache(maxsize=1)
def _passage_offsets() -> tuple[str, tuple[int, ...]]:
    """The passage text and the character offset where each of its tokens starts (+ end)."""
    toks = _passage_tokens()
    offsets = [0]
    for t in toks:
        offsets.append(offsets[-1] + len(t))
    return "".join(toks), tuple(offsets)


def text_chars(g: int) -> int:
    """Characters of the text of the first g generated (non-EOS) tokens."""
    text, offsets = _passage_offsets()
    n = len(offsets) - 1
    return (g // n) * len(text) + offsets[g % n]


def text_slice(a: int, b: int) -> str:
    """Characters [a, b) of the recited text (the passage repeated)."""
    text, _ = _passage_offsets()
    size = len(text)
    out: list[str] = []
    while a < b:
        i = a % size
        take = min(b - a, size - i)
        out.append(text[i : i + take])
        a += take
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one choice ends: what the engine generates and what the client is shown."""

    tokens: int  # generated tokens, the last one included: the engine's output_tokens
    finish_reason: str  # "stop" | "length"
    text: str  # the whole visible answer
    stop_reason: str | int | None = None  # matched stop string / stop token id
    eos: bool = False  # the last token is EOS

    @property
    def stopped_early(self) -> bool:
        """Ended by a stop string or stop token (not by EOS, not by length)."""
        return self.stop_reason is not None


def plan_outcome(
    natural: int,
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    min_tokens: int = 0,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    vllm: bool = True,
) -> Outcome:
    """Where a choice ends, given its natural (EOS) length and the request's stop rules.

    vLLM (`check_stop` + the incremental detokenizer's `check_stop_strings`): a stop token
    is honoured from position min_tokens + 1 on, even with ignore_eos and even as the
    max_tokens-th token; stop strings are looked for in the text that the newest token
    added (plus len(stop) − 1 characters before it), once more than min_tokens tokens
    exist, and the one that completes first wins (ties: list order; vLLM ≥ #49391), so
    no other shows in the answer; a match on the last allowed token is still a "stop".
    SGLang (`Req.check_finished`): the length check comes first, stop tokens are ignored
    with ignore_eos, and stop strings are looked for in the whole text in list order:
    the first listed that matches wins and the text is cut where it first occurs, so
    another stop string completed by the same token can stay in the answer.
    """
    n_eos = plan_output(natural, max_tokens, ignore_eos, min_tokens)
    eos_at = n_eos if not ignore_eos and n_eos < max_tokens else 0  # 1-based, 0: none
    limit = eos_at - 1 if eos_at else max_tokens  # positions that are text tokens
    stop_ids = frozenset(stop_token_ids) if (vllm or not ignore_eos) else frozenset()
    stops = tuple(stop)
    if stops or stop_ids:
        toks = _passage_tokens()
        ids = _passage_ids()
        period = len(toks)
        longest = max((len(s) for s in stops), default=0)
        # The text is periodic: a match that can happen happens within one period (plus
        # the longest stop string) after the first position it is looked for.
        horizon = min(limit, min_tokens + period + longest + 1)
        text = ""
        for k in range(1, horizon + 1):
            tid = ids[(k - 1) % period]
            if tid in stop_ids and k > min_tokens and (vllm or k < max_tokens):
                return Outcome(k, "stop", text, tid)
            piece = toks[(k - 1) % period]
            text += piece
            if not stops:
                continue
            if vllm:
                if k <= min_tokens:
                    continue
                # the stop string that completes first wins; ties go by list order
                hit: tuple[int, int, str] | None = None
                for s in stops:
                    at = text.find(s, max(0, len(text) + 1 - len(piece) - len(s)))
                    if at != -1 and (hit is None or at + len(s) < hit[0]):
                        hit = (at + len(s), at, s)
                if hit is not None:
                    return Outcome(k, "stop", text[: hit[1]], hit[2])
            elif k < max_tokens:
                for s in stops:
                    at = text.find(s)
                    if at != -1:
                        return Outcome(k, "stop", text[:at], s)
    if eos_at:
        return Outcome(eos_at, "stop", text_slice(0, text_chars(eos_at - 1)), None, eos=True)
    return Outcome(max_tokens, "length", text_slice(0, text_chars(max_tokens)))


def visible_chars(outcome: Outcome, generated: int, holdback: int) -> int:
    """Characters of the answer a stream has shown once `generated` tokens exist.

    Before the end, the text of every generated token but the `holdback` last characters
    (vLLM holds back max(len(stop)) − 1 characters while stop strings are set, so a
    stop string split across tokens never reaches the client; SGLang holds back
    nothing). At the end, the whole (stop-trimmed) answer.
    """
    if generated >= outcome.tokens:
        return len(outcome.text)
    return max(0, text_chars(generated) - holdback)


EOS_TEXT = "<|eot_id|>"  # how both servers spell the EOS token in logprobs (decode([eos]))


@lru_cache(maxsize=1)
def _alternatives() -> tuple[str, ...]:
    """Distinct token texts the model considers besides the one it says."""
    return tuple(sorted(set(_passage_tokens())))


def token_at(outcome: Outcome, position: int) -> tuple[int, str]:
    """(id, text) of the generated token at 0-based `position` of a choice."""
    if outcome.eos and position == outcome.tokens - 1:
        from emulator.chat_template import EOS

        return EOS, EOS_TEXT
    toks = _passage_tokens()
    return token_id(position), toks[position % len(toks)]


def token_logprobs(
    key: int, position: int, token: str, top: int
) -> tuple[float, tuple[tuple[str, float], ...]]:
    """The chosen token's logprob and the `top` most likely tokens, most likely first.

    The chosen token is the most likely one (p ∈ [0.45, 0.99)); each alternative takes
    30–70 % of the probability mass still unassigned, so every logprob is finite and
    negative, the list is strictly below the chosen one, and the mass sums to < 1.
    """
    rng = random.Random((key << 24) ^ position)
    p1 = 0.45 + 0.54 * rng.random()
    lp1 = math.log(p1)
    if top <= 0:
        return lp1, ()
    pool = [t for t in _alternatives() if t != token]
    names = rng.sample(pool, min(top - 1, len(pool)))
    rest = 1.0 - p1
    probs: list[float] = []
    for _ in names:
        p = rest * (0.3 + 0.4 * rng.random())
        rest -= p
        probs.append(p)
    probs.sort(reverse=True)
    return lp1, ((token, lp1), *((t, math.log(p)) for t, p in zip(names, probs, strict=True)))
