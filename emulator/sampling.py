"""What the emulated model says: how many tokens, and which text.

EOS model: at every position the model emits EOS with probability p = 1/mean, so the
natural output length N (EOS included, as vLLM counts it) is geometric with mean
`mean_output_tokens`: N = 1 + ⌊ln U / ln(1 − p)⌋. U is drawn from a hash of the seed,
the request's own `seed`, the choice index and the prompt's token ids, so the same
request always gets the same length (like greedy decoding) and different prompts get
different ones. With `ignore_eos` the length is exactly max_tokens; `min_tokens` is a
floor. The engine then finishes with "stop" if N < max_tokens, else "length".

Text: the model recites a fixed ASCII passage token by token (cycling), so every output
token is one cl100k token whose text decodes on its own: each streamed delta carries
exactly one token's text, and a "stop" ends with the EOS token, whose text is "".
"""

from __future__ import annotations

import hashlib
import math
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
        """Tokens up to and including EOS, ≥ 1."""
        if self.mean_output_tokens <= 1:
            return 1
        h = hashlib.blake2b(digest_size=8, salt=b"fleetgate-eos")
        h.update(f"{self.seed}/{request_seed}/{index}/".encode())
        h.update(array("q", prompt_ids).tobytes())
        u = (int.from_bytes(h.digest(), "big") + 1) / 2.0**64  # (0, 1]
        p = 1.0 / self.mean_output_tokens
        return 1 + math.floor(math.log(u) / math.log1p(-p))


def plan_output(natural: int, max_tokens: int, ignore_eos: bool, min_tokens: int = 0) -> int:
    """The engine's `output_tokens` for a request: tokens it generates before stopping."""
    if ignore_eos:
        return max_tokens
    return max(1, min(max_tokens, max(natural, min_tokens)))


@lru_cache(maxsize=1)
def _passage_tokens() -> tuple[str, ...]:
    return tuple(decode([t]) for t in encode(PASSAGE))


def token_text(i: int) -> str:
    """Text of the i-th generated (non-EOS) token."""
    toks = _passage_tokens()
    return toks[i % len(toks)]


def output_text(start: int, stop: int) -> str:
    """Text of generated tokens [start, stop) (none of them EOS)."""
    toks = _passage_tokens()
    n = len(toks)
    return "".join(toks[i % n] for i in range(start, stop))
