"""QUARTZ's quantile-aware routing (the QUARTZ paper, §3.3, Eq. 4–5, Algorithm 1 lines 2–8).

Over K candidates sampled (seeded) from the eligible workers with room — the power of two
choices at K = 2 (Mitzenmacher) — pick the lowest

    S_α(r, w) = Ŵ(w) + Q̂α(r, w) + ψ(r, w)                                      (Eq. 4)

Ŵ(w) is the predictor's expected backlog (Σ predicted mean prefill of requests sent to w
without a first token: expected work, never summed quantiles); Q̂α(r, w) the calibrated
α-quantile of r's prefill on w (policies/quantile/predictor.py); ψ(r, w) = `kv_penalty_s`
· max(0, kv_usage − `kv_threshold`) / (1 − `kv_threshold`), seconds of penalty that grow as
w's KV cache nears full (a preemption risk the prefill quantile does not see).

`point_pred` is the same router with Q̂α replaced by the predicted mean (the PointPred
baseline). Without a predictor bound (`bind_predictor`, done by the drivers), or while the
predictor's calibration reports degraded coverage (§3.5), it routes least-loaded over all
eligible workers: the safe baseline.

Reads: `healthy`, `stale`, `running`, `waiting`, `in_flight`, `kv_usage`,
`prefill_tokens`, and the capacity fields through `has_room`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.protocols.routing import config_from, register
from policies.quantile.features import at_index
from policies.quantile.predictor import Predictor
from policies.routing.least_loaded import least_loaded
from policies.routing.profile import DEFAULT_FILTERS, Profile
from policies.types import RequestInfo, WorkerView


@dataclass(frozen=True, slots=True)
class QuartzConfig:
    # the quantile routed by (0.9 or 0.95); None: the predictor's (`quartz.alpha`), the one
    # its calibration corrects and its coverage is judged at
    alpha: float | None = None
    k: int = 2  # candidates sampled per decision
    kv_threshold: float = 0.8  # ψ starts above this KV usage
    kv_penalty_s: float = 1.0  # ψ at a full KV cache, seconds
    seed: int = 0  # the candidate sampler's (simulated runs are reproducible)

    def __post_init__(self) -> None:
        if self.alpha not in (None, 0.9, 0.95):
            raise ValueError("alpha: must be 0.9 or 0.95")
        if self.k < 1:
            raise ValueError("k: must be >= 1")
        if not 0.0 <= self.kv_threshold < 1.0:
            raise ValueError("kv_threshold: must be in [0, 1)")
        if self.kv_penalty_s < 0:
            raise ValueError("kv_penalty_s: must not be negative")


@dataclass(slots=True)
class QuartzRouter:
    name: str
    config: QuartzConfig
    point: bool = False  # score with the mean (PointPred)
    predictor: Predictor | None = None
    fallback: Profile = field(default_factory=least_loaded)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.config.seed)

    def bind_predictor(self, predictor: Predictor) -> None:
        self.predictor = predictor

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        predictor = self.predictor
        if predictor is None or predictor.calibration.degraded:
            return self.fallback.choose(request, candidates)
        c = self.config
        n = len(candidates)
        if c.k == 2 and n > 2:  # `_sample`'s fast path, inlined (the common case)
            draw = self._rng.random
            i = int(draw() * n)
            j = int(draw() * (n - 1))
            a, b = candidates[i], candidates[j + 1 if j >= i else j]
            fresh = a.healthy and b.healthy and not a.stale and not b.stale
            workers = [a, b] if fresh and a.has_room and b.has_room else None
        else:
            workers = None
        if workers is None:
            workers = self._sample(request, candidates, c.k, drawn=n > 2 and c.k == 2)
        if not workers:
            return None
        alpha = predictor.alpha if c.alpha is None else c.alpha
        at = 0 if self.point else at_index(alpha)  # the mean, or Q̂α, of (mean, q90, q95)
        head = predictor.request_part(request)
        backlog = predictor.backlog_of
        threshold, penalty, room = c.kv_threshold, c.kv_penalty_s, 1.0 - c.kv_threshold
        best, best_e, best_s = workers[0], None, 0.0
        for w in workers:
            e = predictor.estimate(request, w, head)
            over = w.kv_usage - threshold  # ψ(r, w)
            s = backlog.get(w.id, 0.0) + e[2][at] + (penalty * over / room if over > 0 else 0.0)
            if best_e is None or s < best_s:
                best, best_e, best_s = w, e, s
        assert best_e is not None
        predictor.chose_estimate(request, best.id, best_e)
        return best

    def _sample(
        self,
        request: RequestInfo,
        candidates: Sequence[WorkerView],
        k: int,
        drawn: bool = False,
    ) -> list[WorkerView]:
        """K candidates drawn uniformly from the eligible workers with room (the default
        filters of profile.py). Fast path for K = 2: two distinct draws from all
        candidates, kept when both are healthy, fresh and have room — conditioned on
        that, a uniform pair of eligible workers; otherwise filter, then draw. `drawn`:
        the caller made the fast path's draws (and did not keep them)."""
        n = len(candidates)
        rng = self._rng
        if k == 2 and n > 2 and not drawn:
            draw = rng.random  # C-level; randrange is several Python calls
            i = int(draw() * n)
            j = int(draw() * (n - 1))
            a, b = candidates[i], candidates[j + 1 if j >= i else j]
            fresh = a.healthy and b.healthy and not a.stale and not b.stale
            if fresh and a.has_room and b.has_room:
                return [a, b]
        workers = list(candidates)
        for keep in DEFAULT_FILTERS:
            workers = keep(request, workers)
            if not workers:
                return workers
        if len(workers) > k:
            workers = rng.sample(workers, k)
        return workers


@register("quartz")
def _quartz(params: Mapping[str, Any]) -> QuartzRouter:
    return QuartzRouter("quartz", config_from(QuartzConfig, params))


@register("point_pred")
def _point_pred(params: Mapping[str, Any]) -> QuartzRouter:
    return QuartzRouter("point_pred", config_from(QuartzConfig, params), point=True)
