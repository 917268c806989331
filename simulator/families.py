"""Request-shape families: what one request of a workload looks like (lengths, class, prefixes).

Each family draws (prompt tokens, output tokens, prefix block hashes) from its own
distribution; `workloads.py` pairs them with an arrival process and clients.

- ``cdf`` — total tokens from a simulator/data CDF (Azure 2023, LMSYS, agent-heavy), split
  into input/output by `input_fraction` (0.8: FleetOpt's rule; see `lengths.py`).
- The QUARTZ families (QUARTZ §5.2). The paper builds them from corpora we do not ship
  (ShareGPT-style chat, a retrieval corpus), so they are parametric stand-ins with the
  stated shapes; every default below says what it stands for:
  ``chat`` short prompts, moderate outputs; ``rag`` long prompts made of a question plus
  k retrieved passages; ``structured`` shared templates (controlled prefix reuse, Zipf
  popularity) plus a short unique suffix. "Mixed" (Chat + RAG) and "Mixed Bursty" are
  mixtures of these declared in a scenario, not families of their own.
- ``uniform`` — lengths uniform on a range, or fixed: a synthetic load generator's requests.
- ``burstgpt`` — BurstGPT-like heavy tails: Pareto prompt and output lengths, drawn
  independently (BurstGPT reports Zipf-like request lengths and weak input/output
  correlation).

A request generates exactly its `output` tokens (the engine's ignore_eos); `max_tokens`
equals it, so L_total = prompt + output is also what placement sees.

Prefix hashes are chained over full KV blocks, as vLLM's prefix cache keys them: block i's
hash mixes block i−1's hash with the block's content id. Shared template blocks hash the
same for every request using the template; the first unique block makes every later one
unique. Families without reuse send no hashes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from simulator.lengths import LengthCDF, split

_MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a fixed 64-bit mixer (stable across runs, unlike hash(str))."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def chain_hashes(
    prompt_tokens: int, block_size: int, shared: tuple[int, int], unique: int
) -> tuple[int, ...]:
    """Chained hashes of the prompt's full blocks: the first `shared[1]` blocks carry template
    `shared[0]`'s content, the rest are unique to the request (content id `unique`)."""
    template, shared_blocks = shared
    out: list[int] = []
    h = 0
    for i in range(prompt_tokens // block_size):
        content = (
            mix64(template * 1_000_003 + i) if i < shared_blocks else mix64(unique ^ mix64(i + 1))
        )
        h = mix64(h ^ content)
        out.append(h)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Shape:
    prompt: int
    output: int
    hashes: tuple[int, ...] = ()


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


@dataclass(frozen=True, slots=True)
class CdfFamily:
    cdf: LengthCDF
    input_fraction: float = 0.8  # FleetOpt §7.1's 80/20 split (reproduces the paper's tables)

    def draw(self, rng: random.Random, seq: int) -> Shape:
        l_in, l_out = split(self.cdf.sample(rng), self.input_fraction)
        return Shape(l_in, l_out)


@dataclass(frozen=True, slots=True)
class ChatFamily:
    prompt_median: float = 300.0  # ShareGPT-style turns: a few hundred tokens of history + question
    prompt_sigma: float = 0.9
    prompt_max: int = 4096
    output_median: float = (
        220.0  # "moderate outputs": ShareGPT replies average a few hundred tokens
    )
    output_sigma: float = 0.7
    output_max: int = 1024

    def draw(self, rng: random.Random, seq: int) -> Shape:
        p = _lognormal(rng, self.prompt_median, self.prompt_sigma, 8, self.prompt_max)
        o = _lognormal(rng, self.output_median, self.output_sigma, 4, self.output_max)
        return Shape(p, o)


@dataclass(frozen=True, slots=True)
class RagFamily:
    question_median: float = 60.0  # the user's question and instructions
    passages_min: int = 3  # retrieved passages injected per prompt (top-k, k in [3, 8])
    passages_max: int = 8
    passage_median: float = 400.0  # a retrieved chunk of ~300 words
    passage_sigma: float = 0.3
    output_median: float = 180.0  # answers grounded in the passages
    output_sigma: float = 0.6
    output_max: int = 1024
    prompt_max: int = 7000  # stays inside an 8K context with its answer

    def draw(self, rng: random.Random, seq: int) -> Shape:
        p = _lognormal(rng, self.question_median, 0.5, 8, 512)
        for _ in range(rng.randint(self.passages_min, self.passages_max)):
            p += _lognormal(rng, self.passage_median, self.passage_sigma, 64, 2048)
        o = _lognormal(rng, self.output_median, self.output_sigma, 4, self.output_max)
        return Shape(min(p, self.prompt_max), o)


@dataclass(frozen=True, slots=True)
class StructuredFamily:
    templates: int = 8  # distinct shared prefixes (system prompts, few-shot templates)
    zipf_s: float = 1.1  # template popularity ∝ 1/rank^s: a few hot prefixes
    prefix_min: int = 512  # template length range in tokens
    prefix_max: int = 2048
    suffix_median: float = 120.0  # the request-specific part after the template
    output_median: float = 150.0
    output_sigma: float = 0.6
    output_max: int = 1024
    block_size: int = 16  # must match the engine's KV block size for hashes to hit
    seed: int = 0  # fixes the template lengths

    def _prefix_len(self, template: int) -> int:
        r = random.Random(mix64(self.seed * 7919 + template))
        return r.randint(self.prefix_min, self.prefix_max)

    def draw(self, rng: random.Random, seq: int) -> Shape:
        weights = [1.0 / (k + 1) ** self.zipf_s for k in range(self.templates)]
        template = rng.choices(range(self.templates), weights)[0]
        prefix = self._prefix_len(template)
        p = prefix + _lognormal(rng, self.suffix_median, 0.6, 1, 2048)
        o = _lognormal(rng, self.output_median, self.output_sigma, 4, self.output_max)
        hashes = chain_hashes(
            p,
            self.block_size,
            (template + 1, prefix // self.block_size),
            mix64(seq + (self.seed << 32)),
        )
        return Shape(p, o, hashes)


@dataclass(frozen=True, slots=True)
class BurstGptFamily:
    prompt_alpha: float = (
        1.2  # Pareto tail index of prompt lengths: heavy (α < 2: infinite variance)
    )
    prompt_min: int = 32
    prompt_max: int = 16384
    output_alpha: float = 1.6  # outputs are lighter-tailed than prompts
    output_min: int = 16
    output_max: int = 2048

    def draw(self, rng: random.Random, seq: int) -> Shape:
        p = min(self.prompt_max, int(self.prompt_min * rng.paretovariate(self.prompt_alpha)))
        o = min(self.output_max, int(self.output_min * rng.paretovariate(self.output_alpha)))
        return Shape(p, o)


@dataclass(frozen=True, slots=True)
class UniformFamily:
    """Prompt and output lengths uniform on [min, max] (fixed when min = max): a synthetic
    load generator's requests, e.g. the token-pools paper's §5.1 (Exp. 1: 64 in, 64 out;
    Exp. 2: 32–176)."""

    prompt_min: int = 64
    prompt_max: int = 64
    output_min: int = 64
    output_max: int = 64

    def __post_init__(self) -> None:
        if not (
            1 <= self.prompt_min <= self.prompt_max and 1 <= self.output_min <= self.output_max
        ):
            raise ValueError("uniform family: need 1 <= min <= max for prompt and output")

    def draw(self, rng: random.Random, seq: int) -> Shape:
        p = rng.randint(self.prompt_min, self.prompt_max)
        o = rng.randint(self.output_min, self.output_max)
        return Shape(p, o)


Family = CdfFamily | ChatFamily | RagFamily | StructuredFamily | BurstGptFamily | UniformFamily
