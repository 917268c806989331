"""Lookahead predictors: how many more decode steps a running request is expected to take.

BF-IO's lookahead needs, for each active request, its load at steps k+1..k+H; under LLM
decode that is its context plus one token a step until it ends, so a predictor only has to
say when it ends (`remaining`: steps still to run counting the current one; inf = not within
any window). The paper's central claim is that this short-horizon signal, not a forecast of
new requests' lengths, is what balancing needs.

- `none`: nobody is predicted to finish (with lookahead 0 nothing is needed).
- `oracle`: the true output length (simulator only).
- `noisy_oracle(eps)`: the true length times exp(eps·z), z ~ N(0, 1) drawn once per request
  from (seed, request id), so a request's estimate is stable from step to step.
- `max_tokens_bound`: the client's max_tokens, a hard upper bound (live-usable).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

PREDICTORS = ("none", "oracle", "noisy_oracle", "max_tokens_bound")


class _HasLengths(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def generated(self) -> int: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...


def noise_factor(eps: float, seed: int, request_id: str) -> float:
    """exp(eps·z) with z ~ N(0, 1) fixed by (seed, request id): the same on every call."""
    if eps == 0.0:
        return 1.0
    digest = hashlib.blake2b(f"{seed}:{request_id}".encode(), digest_size=8).digest()
    return math.exp(eps * random.Random(int.from_bytes(digest, "big")).gauss(0.0, 1.0))


@dataclass(frozen=True, slots=True)
class Predictor:
    kind: str = "none"
    eps: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in PREDICTORS:
            raise ValueError(f"predictor: unknown {self.kind!r}; known: {', '.join(PREDICTORS)}")
        if self.eps < 0:
            raise ValueError(f"noise_eps: cannot be negative, got {self.eps!r}")

    def predicted_length(self, request: _HasLengths) -> float:
        """The total output length this predictor expects (inf when it has no idea)."""
        if self.kind == "none":
            return math.inf
        if self.kind == "max_tokens_bound":
            return math.inf if request.max_tokens is None else float(request.max_tokens)
        if request.output_tokens is None:
            return math.inf  # an oracle with nothing to read: behave like `none`
        if self.kind == "oracle":
            return float(request.output_tokens)
        return max(
            1.0, round(request.output_tokens * noise_factor(self.eps, self.seed, request.id))
        )

    def remaining(self, request: _HasLengths) -> float:
        """Steps still to run, counting the current one (at least 1: it is running now)."""
        return max(1.0, self.predicted_length(request) - request.generated)


def resident_profile(
    context: npt.NDArray[np.float64], remaining: npt.NDArray[np.float64], horizon: int
) -> npt.NDArray[np.float64]:
    """[n, H+1]: resident i's load at k+h, context_i + h while h < remaining_i, else 0."""
    hs = np.arange(horizon, dtype=np.float64)[None, :]
    alive = hs < remaining[:, None]
    out: npt.NDArray[np.float64] = np.where(alive, context[:, None] + hs, 0.0)
    return out
