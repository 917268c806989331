"""Token budget estimation (baseline).

The gateway must know roughly how many tokens a prompt takes before any engine has seen
it, without paying for a tokenizer on the hot path. The baseline divides the prompt's
UTF-8 byte count by a fixed bytes-per-token figure (≈4 for English under cl100k-like
vocabularies) and adds a per-message template overhead for chat requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetConfig:
    bytes_per_token: float = 4.0  # cl100k on English prose averages ~4 bytes per token
    message_overhead: int = 4  # role markers and separators a chat template adds per message
    reply_overhead: int = 3  # the assistant header the template appends for the reply
    default_max_tokens: int = 256  # L_out assumed when the client sets no max_tokens


@dataclass(frozen=True, slots=True)
class Budget:
    prompt_tokens: int
    max_tokens: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.max_tokens


def estimate_tokens(n_bytes: int, config: BudgetConfig) -> int:
    """⌈bytes / ĉ⌉: tokens a text of `n_bytes` UTF-8 bytes is estimated to take."""
    return math.ceil(n_bytes / config.bytes_per_token)


def estimate_chat(content_bytes: int, n_messages: int, config: BudgetConfig) -> int:
    """Prompt tokens of a chat request: content plus the template around each message."""
    return (
        estimate_tokens(content_bytes, config)
        + n_messages * config.message_overhead
        + config.reply_overhead
    )
