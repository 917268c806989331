"""A prefill:decode split for a `kind: pd` pool (docs/PD.md): how many prefill and decode
workers a workload needs, from the two roles' capacities on the engine model both drivers
share (emulator/engine.py: a step lasts W + H·n + s·T for n running sequences and T prompt
tokens computed in it).

- A prefill worker at saturation computes its step budget B of prompt tokens each step
  (at most `max_num_seqs` sequences running, a prompt taking ⌈P / chunk⌉ steps to compute
  and one more to sample its token and hand off): k = min(B / P, max_num_seqs / steps)
  prompts per step, n = k · steps running, T = k · P, so μ_P = k / (W + H·n + s·T).
- A decode worker at its largest batch n (max_num_seqs, or the largest whose step meets an
  ITL target: W + H·n ≤ ITL) finishes n answers every (L_out + 1) steps (the prompt's last
  token, then L_out): μ_D = n / ((L_out + 1) · (W + H·n)).

`split(G)` gives each P + D = G its capacity min(P·μ_P, D·μ_D) and picks the largest (ties:
fewer prefill workers); `size(λ)` the fewest of each role that serves λ at utilisation ≤ ρ.
Balanced, P / D = μ_D / μ_P: the split the paper's Game 1 calls the social optimum when both
sides' violation curves have the same shape. The cascade starts where P·μ_P < λ ≤ D·μ_D:
prefill saturates while the decode workers idle.

Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RoleEngine:
    """One role's engine, in emulator/engine.py's terms."""

    w: float = 0.008  # W, seconds per step
    h: float = 0.00065  # H, seconds per running sequence per step
    prefill_token_s: float = 0.0  # s, seconds per prompt token computed
    max_num_batched_tokens: int | None = None  # B, the step's token budget (None: chunk × seqs)
    max_num_seqs: int = 256
    prefill_chunk: int = 512

    def __post_init__(self) -> None:
        if self.w < 0 or self.h < 0 or self.prefill_token_s < 0 or self.w + self.h <= 0:
            raise ValueError("w, h, prefill_token_s: must be >= 0, a step must take time")
        if self.max_num_seqs < 1 or self.prefill_chunk < 1:
            raise ValueError("max_num_seqs, prefill_chunk: must be >= 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens: must be >= 1")


@dataclass(frozen=True, slots=True)
class PdWorkload:
    prompt_tokens: float  # P, mean prompt length
    output_tokens: float  # L_out, mean answer length

    def __post_init__(self) -> None:
        if not self.prompt_tokens >= 1 or not self.output_tokens >= 1:
            raise ValueError("prompt_tokens, output_tokens: must be >= 1")


def prefill_rate(workload: PdWorkload, engine: RoleEngine) -> float:
    """μ_P: requests one prefill worker hands off per second at saturation."""
    p = workload.prompt_tokens
    steps = math.ceil(p / engine.prefill_chunk) + 1
    budget = engine.max_num_batched_tokens
    if budget is None:
        budget = engine.prefill_chunk * engine.max_num_seqs
    k = min(budget / p, engine.max_num_seqs / steps)
    step = engine.w + engine.h * k * steps + engine.prefill_token_s * k * p
    return k / step


def decode_batch(engine: RoleEngine, itl_s: float | None = None) -> int:
    """The largest decode batch: max_num_seqs, or fewer to keep a step within `itl_s`."""
    n = engine.max_num_seqs
    if itl_s is not None:
        if engine.h > 0:
            n = min(n, math.floor((itl_s - engine.w) / engine.h))
        elif engine.w > itl_s:
            n = 0
        if n < 1:
            raise ValueError(f"itl_s: no decode batch steps within {itl_s} s (W = {engine.w})")
    return n


def decode_rate(workload: PdWorkload, engine: RoleEngine, itl_s: float | None = None) -> float:
    """μ_D: answers one decode worker finishes per second at its largest batch."""
    n = decode_batch(engine, itl_s)
    return n / ((workload.output_tokens + 1) * (engine.w + engine.h * n))


@dataclass(frozen=True, slots=True)
class Split:
    prefill: int
    decode: int
    prefill_rps: float  # P · μ_P
    decode_rps: float  # D · μ_D

    @property
    def capacity(self) -> float:
        return min(self.prefill_rps, self.decode_rps)

    @property
    def bound(self) -> str:
        """The side that limits the pool: "prefill" (the cascade's side) or "decode"."""
        return "prefill" if self.prefill_rps <= self.decode_rps else "decode"


@dataclass(frozen=True, slots=True)
class PdPlan:
    mu_prefill: float
    mu_decode: float
    splits: tuple[Split, ...]  # every P + D = G, or the sized pool alone
    best: Split

    @property
    def balanced_prefill_share(self) -> float:
        """P / (P + D) at which both sides serve the same rate."""
        return self.mu_decode / (self.mu_prefill + self.mu_decode)


def _rates(
    workload: PdWorkload, prefill: RoleEngine, decode: RoleEngine, itl_s: float | None
) -> tuple[float, float]:
    return prefill_rate(workload, prefill), decode_rate(workload, decode, itl_s)


def split(
    workload: PdWorkload,
    gpus: int,
    prefill: RoleEngine,
    decode: RoleEngine,
    itl_s: float | None = None,
) -> PdPlan:
    """Every split of `gpus` workers (one per worker) and the one serving the most."""
    if gpus < 2:
        raise ValueError("gpus: a pd pool needs at least 2 workers")
    mp, md = _rates(workload, prefill, decode, itl_s)
    splits = tuple(Split(p, gpus - p, p * mp, (gpus - p) * md) for p in range(1, gpus))
    best = max(splits, key=lambda s: (s.capacity, -s.prefill))
    return PdPlan(mp, md, splits, best)


def size(
    workload: PdWorkload,
    rate: float,
    prefill: RoleEngine,
    decode: RoleEngine,
    itl_s: float | None = None,
    rho: float = 0.8,
) -> PdPlan:
    """The fewest prefill and decode workers serving `rate` requests/s with each role at
    most `rho` utilised."""
    if not rate > 0 or not 0 < rho <= 1:
        raise ValueError("rate must be > 0 and rho in (0, 1]")
    mp, md = _rates(workload, prefill, decode, itl_s)
    p = max(1, math.ceil(rate / (rho * mp)))
    d = max(1, math.ceil(rate / (rho * md)))
    s = Split(p, d, p * mp, d * md)
    return PdPlan(mp, md, (s,), s)
