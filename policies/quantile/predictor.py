"""QUARTZ's predictor: the model, its calibration, the prefix index and the expected
backlog per worker, fed by the pipeline's hooks (../shared/seeds/003 §3.2–3.5, §4.2–4.4).

    features(r, w)   the Table 2 vector (features.py) of r on w as routing sees w now
    predict(r, w)    calibrated quantiles Q̂(r, w) = calibration(model(x), regime(x))
    size(r)          ŝα(r): r's α-quantile on an idle worker holding its best prefix —
                     what the admission queue orders by (Eq. 6; see below)
    backlog(w)       Ŵ(w): Σ predicted MEAN prefill of requests sent to w that have no
                     first token yet — expected work, never summed quantiles (§3.3)

As a `Hook` (policies/hooks.py) it hears the same events in both drivers:
- on_dispatch: the features and prediction for the chosen worker (those routing used, or
  computed now from the worker's view), Ŵ(w) += mean, the prompt's blocks go into the
  prefix index under w;
- on_first_token: the observed prefill y = now − dispatch feeds the calibration and
  coverage; Ŵ(w) −= that request's mean (the backlog decays by observations);
- on_complete: a request that never had a first token leaves Ŵ(w).

Where this adapts the paper: the paper routes at arrival and then queues the request for
its chosen worker (Algorithm 1). fleetgate's core routes when a worker has room (late
binding: the choice sees the state at dispatch), so ŝα for the queue key cannot be
Q̂α(r, w(r)) for a w chosen later; it is Q̂α of r alone — an idle worker (no running,
waiting or backlog) holding the longest prefix any worker has of r — which orders by the
request's own size, the part of Eq. 6 the queue is for. The routing score (Eq. 4) uses
the full per-worker prediction at dispatch.

Pure: no clock of its own; `now` comes with every event (the index's TTL reads the
latest). `view_of(worker_id)` is given by the driver so a dispatch chosen by any router
(least-loaded too) yields its features for the request log and the simulator's records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from policies.quantile.calibration import Calibration
from policies.quantile.features import CATEGORY_INDEX, PrefillModel, Quantiles, vector
from policies.quantile.prefix_index import PrefixIndex
from policies.types import Outcome, RequestInfo, WorkerView

SWEEP_EVERY = 4096  # dispatches between sweeps of the prefix index's expired entries


@dataclass(slots=True)
class Prediction:
    """One request's prediction on the worker it was sent to."""

    worker: str
    features: list[float]
    raw: Quantiles  # the model's
    q: Quantiles  # calibrated: what routing used
    regime: int
    dispatched: float = 0.0


@dataclass(slots=True)
class Predictor:
    model: PrefillModel
    calibration: Calibration = field(default_factory=Calibration)
    index: PrefixIndex = field(default_factory=PrefixIndex)
    view_of: Callable[[str], WorkerView | None] | None = None
    alpha: float = 0.95
    use_locality: bool = True  # False: ℓ_r = 0 always (the "no locality" ablation)
    _backlog: dict[str, float] = field(default_factory=dict)  # Ŵ(w), seconds
    _pending: dict[str, Prediction] = field(default_factory=dict)  # sent, no first token
    _chosen: dict[str, Prediction] = field(default_factory=dict)  # routing's, by request
    _now: float = 0.0
    _dispatches: int = 0
    observed: int = 0  # first tokens observed
    last: Prediction | None = None  # the last dispatch's (the driver copies it to its record)

    # --- what routing and the queue ask ---------------------------------------------
    @property
    def degraded(self) -> bool:
        return self.calibration.degraded

    @property
    def name(self) -> str:
        return self.model.name

    def locality(self, request: RequestInfo, worker: str) -> int:
        if not self.use_locality:
            return 0
        return self.index.locality(worker, request.prefix_hashes, request.prompt_tokens, self._now)

    def features(
        self, request: RequestInfo, view: WorkerView, dispatched: bool = False
    ) -> list[float]:
        """The vector of `request` on `view` as routing sees it before sending; with
        `dispatched`, the view already counts the request (its slot and prefill lease are
        taken before the hooks run) and those are taken off."""
        loc = self.locality(request, view.id)
        in_flight, backlog = view.in_flight, view.prefill_tokens
        if dispatched:
            in_flight -= 1
            backlog = max(backlog - request.prompt_tokens, 0)
        return vector(
            request,
            loc,
            self.index.bucket(loc, request.prompt_tokens),
            max(view.running, in_flight),
            view.waiting,
            backlog,
            view.kv_usage,
        )

    def predict(self, request: RequestInfo, view: WorkerView) -> Prediction:
        """`_predict(view.id, features(request, view))`, inlined: routing calls it K times
        per decision."""
        prompt = request.prompt_tokens
        loc = bucket = 0
        if request.prefix_hashes and self.use_locality:
            index = self.index
            loc = index.locality(view.id, request.prefix_hashes, prompt, self._now)
            bucket = index.bucket(loc, prompt) if loc else 0
        running = view.running
        x = [
            float(prompt),
            float(request.max_tokens),
            request.temperature,
            request.top_p,
            CATEGORY_INDEX.get(request.category, 0.0),
            1.0 if request.stream else 0.0,
            float(loc),
            float(bucket),
            float(running if running > view.in_flight else view.in_flight),
            float(view.waiting),
            float(view.prefill_tokens),
            view.kv_usage,
        ]
        raw = self.model.predict(x)
        calibration = self.calibration
        regime = calibration.regime(x)
        return Prediction(view.id, x, raw, calibration.correct(raw, regime), regime)

    def _predict(self, worker: str, x: list[float]) -> Prediction:
        raw = self.model.predict(x)
        regime = self.calibration.regime(x)
        return Prediction(worker, x, raw, self.calibration.correct(raw, regime), regime)

    def chose(self, request: RequestInfo, p: Prediction) -> None:
        """Routing picked `p.worker` for `request` with this prediction (on_dispatch uses it)."""
        self._chosen[request.id] = p

    def backlog(self, worker: str) -> float:
        return self._backlog.get(worker, 0.0)

    def size(self, request: RequestInfo) -> Quantiles:
        """r's calibrated quantiles on an idle worker holding the longest prefix of r any
        worker was sent: ŝα(r) for the queue's key (Eq. 6 as adapted above)."""
        loc = 0
        if self.use_locality and request.prefix_hashes:
            loc = self.index.best_locality(request.prefix_hashes, request.prompt_tokens, self._now)
        x = vector(request, loc, self.index.bucket(loc, request.prompt_tokens), 0, 0, 0, 0.0)
        calibration = self.calibration
        return calibration.correct(self.model.predict(x), calibration.regime(x))

    # --- Hook ---------------------------------------------------------------------
    def on_arrival(self, request: RequestInfo, now: float) -> None:
        self._now = now

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        self._now = now
        rid = request.id
        p = self._chosen.pop(rid, None)
        if p is None or p.worker != worker:
            view = self.view_of(worker) if self.view_of is not None else None
            if view is None:
                return
            p = self._predict(worker, self.features(request, view, dispatched=True))
        p.dispatched = now
        self._forget(rid)  # a retry: the earlier attempt leaves its worker's backlog
        self._pending[rid] = p
        self._backlog[worker] = self._backlog.get(worker, 0.0) + p.q.mean
        self.index.add(worker, request.prefix_hashes, now)
        self.last = p
        self._dispatches += 1
        if self._dispatches % SWEEP_EVERY == 0:
            self.index.sweep(now)

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        self._now = now
        p = self._forget(request.id)
        if p is not None:
            self.observed += 1
            self.calibration.observe(p.regime, p.raw, p.q.at(self.alpha), now - p.dispatched)

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self._now = now
        self._forget(request.id)
        self._chosen.pop(request.id, None)

    def _forget(self, rid: str) -> Prediction | None:
        p = self._pending.pop(rid, None)
        if p is not None:
            left = self._backlog.get(p.worker, 0.0) - p.q.mean
            if left > 1e-9:
                self._backlog[p.worker] = left
            else:
                self._backlog.pop(p.worker, None)
        return p

    def pending(self, request_id: str) -> Prediction | None:
        return self._pending.get(request_id)

    def __len__(self) -> int:
        """Requests sent and awaiting their first token."""
        return len(self._pending)


def attach(policy: object, predictor: Predictor) -> bool:
    """Give a router or dispatcher that uses the predictor (it has `bind_predictor`) the
    shared one; False when it does not use one. Called by the drivers at start-up."""
    bind = getattr(policy, "bind_predictor", None)
    if bind is None:
        return False
    bind(predictor)
    return True
