"""The analytic prefill model: QUARTZ's predictor when no trained model file is configured.

It evaluates the engine model (emulator/engine.py; FleetOpt §3.1 Eq. 3–4, 7) on the
feature vector of Table 2 (the QUARTZ paper), the worker's state included:

    n      = min(running + waiting + 1, max_num_seqs)         the batch it will join
    t_iter = W + H · n                                        seconds per engine step
    steps  = ⌈max(p − ℓ, 1) / C_chunk⌉ + 1                    its prefill chunks, then the
                                                              step that emits token one
    queue  = max(0, running + waiting + 1 − max_num_seqs)     requests ahead of a free slot
    wait   = queue · t_iter · mean_output_tokens / max_num_seqs
                                                              a slot frees every
                                                              (mean decode steps / n) steps
    mean   = wait + steps · t_iter

p is the prompt, ℓ the tokens the gateway's prefix index says the worker already holds
(prefix-cache hits skip prefill), C_chunk the chunked-prefill size. Chunks of different
requests run side by side in one step, so another request's backlog costs this one only
through n (the batch's width), which is how the engine model behaves; a real engine with a
per-step token budget serialises prefills more, which the online calibration absorbs.

With the engine's compute-bound prefill configured (`prefill_token_s` = c,
`max_num_batched_tokens` = B; both off by default, as in the engine model):

    mean  += c · (backlog + max(p − ℓ, 0)) + (backlog / B) · t_iter

backlog being the prompt tokens already sent to the worker without a first token.

Quantiles from a documented spread: q90 = mean · spread90, q95 = mean · spread95
(defaults 1.3 and 1.5: the engine-queue estimate is the uncertain part). Online residual
calibration (calibration.py) then corrects each regime's quantile to its observed
coverage, so the spread only matters until observations arrive.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.quantile.features import (
    BACKLOG,
    LOCALITY,
    PROMPT,
    RUNNING,
    WAITING,
    Quantiles,
    Vector,
)


@dataclass(frozen=True, slots=True)
class AnalyticModel:
    w: float = 0.008  # W: seconds per step (the engine's EngineConfig.w)
    h: float = 0.00065  # H: seconds per step per sequence in the batch
    prefill_chunk: int = 512  # C_chunk
    max_num_seqs: int = 256
    mean_output_tokens: float = 256.0  # decode steps a running request holds its slot
    spread90: float = 1.3
    spread95: float = 1.5
    # compute-bound prefill (EngineConfig's, off by default): a step lasts c per prompt
    # token it computes, and with a per-step token budget B the prompt tokens already sent
    # to the worker without a first token (the backlog feature) are computed first
    prefill_token_s: float = 0.0
    max_num_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.w < 0 or self.h < 0 or self.w + self.h <= 0:
            raise ValueError("analytic model: w and h must be >= 0 and a step must take time")
        if self.prefill_chunk < 1 or self.max_num_seqs < 1 or self.mean_output_tokens < 0:
            raise ValueError("analytic model: prefill_chunk, max_num_seqs must be >= 1")
        if self.prefill_token_s < 0 or (
            self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1
        ):
            raise ValueError(
                "analytic model: prefill_token_s must be >= 0, max_num_batched_tokens >= 1"
            )
        if not 1.0 <= self.spread90 <= self.spread95:
            raise ValueError("analytic model: need 1 <= spread90 <= spread95")

    @property
    def name(self) -> str:
        return "analytic"

    def predict(self, x: Vector) -> Quantiles:
        mean = self.mean(x)
        return Quantiles(mean, mean * self.spread90, mean * self.spread95)

    def predict_tuple(self, x: Vector) -> tuple[float, float, float]:
        """`predict` as a plain (mean, q90, q95) (the predictor's hot path: `mean` inlined)."""
        todo = x[PROMPT] - x[LOCALITY]
        ahead = x[RUNNING] + x[WAITING] + 1.0
        cap = self.max_num_seqs
        t_iter = self.w + self.h * (ahead if ahead < cap else cap)
        chunk = self.prefill_chunk
        steps = (-(-todo // chunk) if todo > 1.0 else 1.0) + 1.0
        queue = ahead - cap
        if queue > 0:
            mean = queue * t_iter * self.mean_output_tokens / cap + steps * t_iter
        else:
            mean = steps * t_iter
        if self.prefill_token_s or self.max_num_batched_tokens:
            mean += self._compute(x, todo, t_iter)
        return mean, mean * self.spread90, mean * self.spread95

    def mean(self, x: Vector) -> float:
        todo = x[PROMPT] - x[LOCALITY]
        ahead = x[RUNNING] + x[WAITING] + 1.0
        cap = self.max_num_seqs
        t_iter = self.w + self.h * (ahead if ahead < cap else cap)
        chunk = self.prefill_chunk
        steps = (-(-todo // chunk) if todo > 1.0 else 1.0) + 1.0  # ⌈max(todo, 1)/C⌉ + 1
        queue = ahead - cap
        mean = steps * t_iter
        if queue > 0:
            mean += queue * t_iter * self.mean_output_tokens / cap
        if self.prefill_token_s or self.max_num_batched_tokens:
            mean += self._compute(x, todo, t_iter)
        return mean

    def _compute(self, x: Vector, todo: float, t_iter: float) -> float:
        """The compute-bound terms: every prompt token computed before this one's first
        token costs `prefill_token_s`; under a budget B, the backlog ahead takes
        backlog / B more steps."""
        backlog = x[BACKLOG]
        extra = self.prefill_token_s * (backlog + (todo if todo > 0.0 else 0.0))
        budget = self.max_num_batched_tokens
        if budget:
            extra += backlog / budget * t_iter
        return extra
