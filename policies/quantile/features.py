"""QUARTZ's router-visible features (Table 2 of the QUARTZ paper) as one fixed vector,
and the protocol of a model that maps it to prefill-time quantiles.

This file is the contract between the parts of QUARTZ: the gateway and the simulator
build the vector the same way (policies/quantile/), the request log and the simulator's
records store it under `features` beside the observed `prefill_s`, `fleetgate
train-predictor` fits a model on it, and the router evaluates that model on the hot path.
The order of `FEATURES` is part of the model file format: append, never reorder.

`prefill_s` (the target) is the time from dispatch to the worker until its first token:
the engine's own queueing plus prefill, on the worker the request was sent to. The
gateway's queue wait is not in it (that is what the router and the queue decide).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.types import RequestInfo

FEATURES: tuple[str, ...] = (
    "prompt_tokens",  # p_r: the gateway's estimate (or exact count) of the prompt
    "max_tokens",  # m_r: the generation budget
    "temperature",  # θ_r: decoding parameters (1.0 when the client gave none)
    "top_p",
    "category",  # request type: policies.types.Category as its index in CATEGORY_CODES
    "stream",  # 1.0 when streamed
    "locality_tokens",  # ℓ_r: longest prefix this gateway sent the worker before, tokens
    "locality_bucket",  # 0 none / 1 partial / 2 high (the proxy's coarse class)
    "running",  # n_seq(w): the worker's active sequences (telemetry ∨ in flight)
    "waiting",  # the engine's own queue on w
    "prefill_backlog_tokens",  # prompt tokens sent to w that have not had a first token
    "kv_usage",  # KV-cache pressure on w, 0..1
)
CATEGORY_CODES: tuple[str, ...] = ("chat", "prose", "code", "rag")

Vector = Sequence[float]


@dataclass(slots=True)
class Quantiles:
    """A predicted prefill time (seconds): the mean (for expected backlog Ŵ, and the
    PointPred baseline) and the α-quantiles QUARTZ routes and orders by. A value, never
    changed once built (not frozen only because a frozen dataclass costs a setattr call
    per field to build, several times per routing decision)."""

    mean: float
    q90: float
    q95: float

    def at(self, alpha: float) -> float:
        """The quantile at α ∈ {0.9, 0.95}."""
        if alpha == 0.95:
            return self.q95
        if alpha == 0.9:
            return self.q90
        raise ValueError(f"alpha: {alpha} is not one of 0.9, 0.95")


def at_index(alpha: float) -> int:
    """Where `Quantiles.at(alpha)` is in a plain (mean, q90, q95) (the hot paths' form)."""
    if alpha == 0.95:
        return 2
    if alpha == 0.9:
        return 1
    raise ValueError(f"alpha: {alpha} is not one of 0.9, 0.95")


class PrefillModel(Protocol):
    """A model of prefill time from the feature vector: the analytic estimate from the
    engine model (no file needed) or a trained tree ensemble (policies/quantile/trees.py)."""

    @property
    def name(self) -> str:
        """What the gateway reports it uses (`analytic`, or the model file's version)."""
        ...

    def predict(self, x: Vector) -> Quantiles: ...


CATEGORY_INDEX: dict[str, float] = {c: float(i) for i, c in enumerate(CATEGORY_CODES)}
# positions in the vector, for the parts that read it (analytic model, calibration)
PROMPT, MAX_TOKENS, LOCALITY, BUCKET, RUNNING, WAITING, BACKLOG, KV = (
    FEATURES.index(n)
    for n in (
        "prompt_tokens",
        "max_tokens",
        "locality_tokens",
        "locality_bucket",
        "running",
        "waiting",
        "prefill_backlog_tokens",
        "kv_usage",
    )
)


# The worker-state features of an idle worker (nothing running, waiting or sent, an
# empty KV cache): the queue key's vector (predictor.size_tuple) holds these, so a model
# may compile a function specialised to them (trees.py: `predict_idle_tuple`).
IDLE_WORKER: dict[int, float] = {RUNNING: 0.0, WAITING: 0.0, BACKLOG: 0.0, KV: 0.0}


def vector(
    request: RequestInfo,
    locality_tokens: int,
    locality_bucket: int,
    running: int,
    waiting: int,
    backlog_tokens: int,
    kv_usage: float,
) -> list[float]:
    """The feature vector in `FEATURES` order, from the request and one worker's state.

    The worker's part is what routing sees *before* the request is sent: `running` is
    max(engine running, this gateway's in flight), `backlog_tokens` the prompt tokens
    sent it with no first token yet (`WorkerView.prefill_tokens`)."""
    return [
        float(request.prompt_tokens),
        float(request.max_tokens),
        request.temperature,
        request.top_p,
        CATEGORY_INDEX.get(request.category, 0.0),
        1.0 if request.stream else 0.0,
        float(locality_tokens),
        float(locality_bucket),
        float(running),
        float(waiting),
        float(backlog_tokens),
        kv_usage,
    ]
