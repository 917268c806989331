"""A model of Compress-and-Route's compressor for the simulator, where there is no text.

The real compressor (compressor/compress.py) drops low-scoring sentences until the
prompt fits T_c exactly, or reports that it cannot (mandatory units alone too long,
nothing shortenable). What matters to the fleet is how often it succeeds (p_c) and how
many tokens reach the short pool, so the model draws, per request, the largest share of
its tokens that compression could remove — normal with a per-category mean and spread,
clipped to [0, 0.95]; code is never compressed (FleetOpt §5.2) — and succeeds when that
share reaches the target: the request then arrives with `target − slack` tokens, the
slack being the sentence granularity (a draw in [0, granularity·target]).

Defaults are stand-ins (0.45 ± 0.15 of a prompt's tokens shortenable for prose, RAG and
chat) until bench/compressor_fidelity.py measures the distributions per prompt shape;
a scenario can set its own. Seeded: the same run draws the same outcomes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from compressor.compress import Compression
from policies.types import Category


@dataclass(frozen=True, slots=True)
class Shortenable:
    mean: float  # share of a prompt's tokens compression could remove
    sd: float


DEFAULT_SHORTENABLE: Mapping[Category, Shortenable] = {
    Category.PROSE: Shortenable(0.45, 0.15),
    Category.RAG: Shortenable(0.45, 0.15),
    Category.CHAT: Shortenable(0.45, 0.15),
    Category.CODE: Shortenable(0.0, 0.0),
}


@dataclass(slots=True)
class CompressionModel:
    shortenable: Mapping[Category, Shortenable] = field(
        default_factory=lambda: dict(DEFAULT_SHORTENABLE)
    )
    granularity: float = 0.01  # the last dropped sentence's share of the target
    seed: int = 0
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def fit(self, category: Category, tokens: int, target: int, may_compress: bool) -> Compression:
        """What compressing a `tokens`-token prompt of `category` to `target` gives."""
        if tokens <= target:
            return Compression(target, tokens, tokens)
        share = self.shortenable.get(category, Shortenable(0.0, 0.0))
        if not may_compress or share.mean <= 0:
            return Compression(target, tokens, tokens, detail="not compressible")
        removable = min(0.95, max(0.0, self._rng.gauss(share.mean, share.sd)))
        if tokens * (1.0 - removable) > target:
            return Compression(target, tokens, tokens, detail="mandatory content too long")
        after = target - int(self._rng.random() * self.granularity * target)
        return Compression(target, tokens, after, units=1, units_dropped=1)
