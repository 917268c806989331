"""The retry policy: may a failed attempt go to another worker?

Only before the first byte of an answer reached the client (a stream cannot be spliced),
only for a failure that left the engine untouched (a connect error: `retryable`), and
only `max_retries` times (one, by default): a request that failed on two workers is
more likely the request's fault than the fleet's. The core excludes the workers already
tried when it routes the retry (policies/core.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 1

    def again(self, retries: int, retryable: bool, before_response: bool) -> bool:
        """Send the request to another worker after a failed attempt?"""
        return retryable and before_response and retries < self.max_retries
