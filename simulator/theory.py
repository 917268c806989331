"""What queueing theory predicts for a pool of engines, from the engine model's constants.

FleetOpt §3.1: a request occupies one slot of a continuously batched engine for

    S = (⌈L_in / C_chunk⌉ + L_out) · t_iter          (Eq. 4)
    t_iter = W + H · n                                (Eq. 3)

and the pool's utilisation is ρ = λ · E[S] / (n_workers · slots). Here "slots" is the
engine's ``max_num_seqs``: the largest running batch, i.e. the number of requests that
can hold a slot at once, and the denominator of the slot-time busy fraction the simulator
measures. (FleetOpt's n_max is the same idea after KV sizing; an engine whose KV cache
fills before ``max_num_seqs`` requests run has fewer usable slots than that, and these
formulas assume the KV cache does not bind.)

Eq. 3 is evaluated by the paper at the full batch (n = n_slots, the sizing worst case).
Our engine charges the batch actually running, so we evaluate it at the batch a request
*sees*. At light load the number of requests on a worker is close to an M/G/∞ occupancy,
Poisson with mean m = λ_w · E[S] (λ_w = λ / n_workers, Little's law); a request in the
batch sees itself plus, on average, m others, so t_iter = W + H·(1 + m). Substituting
m into Eq. 4 gives the fixed point

    E[S] = k · (W + H) / (1 − λ_w · k · H),   k = E[⌈L_in/C⌉ + L_out]

valid while λ_w·k·H < 1 and the batch stays below ``max_num_seqs``. Capacity is where the
full batch is needed: a worker completes at most slots / (k · (W + H·slots)) requests/s.

What the prediction assumes about routing: Poisson arrivals *per worker* (Poisson
splitting — uniform random routing). Measured on this engine model it then holds within
~1.5 % up to a fifth of the slots busy. Load-balancing routers (round-robin, power of two,
least-loaded) make per-worker occupancy less variable than Poisson, so a request sees a
slightly smaller batch and the pool's measured utilisation runs 2–5 % *below* this
prediction at light load (tests/unit/simulator/test_theory.py; figures in the report).
Near capacity the fixed point amplifies any error by 1/(1 − λ_w·k·H): use it for light
load and for the capacity, not for the knee.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineTiming:
    w: float  # W, seconds per step
    h: float  # H, seconds per request in the step's batch
    chunk: int  # C_chunk, prompt tokens prefilled per request per step
    slots: int  # max_num_seqs


def slot_steps(prompt_tokens: int, output_tokens: int, chunk: int) -> int:
    """Steps a request holds a slot for (Eq. 4's bracket), with no prefix-cache hit."""
    return math.ceil(prompt_tokens / chunk) + output_tokens


def mean_slot_steps(shapes: Iterable[tuple[int, int]], chunk: int) -> float:
    total = n = 0
    for p, o in shapes:
        total += slot_steps(p, o, chunk)
        n += 1
    if n == 0:
        raise ValueError("no requests")
    return total / n


@dataclass(frozen=True, slots=True)
class Prediction:
    mean_service: float  # E[S], seconds a request holds a slot
    mean_batch: float  # m: requests holding slots on a worker, time-averaged
    t_iter: float  # step duration a request sees
    utilisation: float  # λ·E[S]/(n·slots)


def predict(rate: float, workers: int, k: float, timing: EngineTiming) -> Prediction:
    """Eq. 3–4 at the M/G/∞ fixed point (module docstring); raises past the valid range."""
    lam_w = rate / workers
    denom = 1.0 - lam_w * k * timing.h
    if denom <= 0:
        raise ValueError("offered load beyond the fixed point's range (λ_w·k·H ≥ 1)")
    service = k * (timing.w + timing.h) / denom
    m = lam_w * service
    return Prediction(service, m, timing.w + timing.h * (1 + m), m / timing.slots)


def capacity(workers: int, k: float, timing: EngineTiming) -> float:
    """Requests/s the pool completes with every worker running a full batch."""
    return workers * timing.slots / (k * (timing.w + timing.h * timing.slots))
