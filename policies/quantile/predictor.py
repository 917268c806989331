"""QUARTZ's predictor: the model, its calibration, the prefix index and the expected
backlog per worker, fed by the pipeline's hooks (the QUARTZ paper, §3.2–3.5, §4.2–4.4).

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

The hot path (issue 15's budget: tens of µs per decision) computes these as plain tuples
— `estimate(r, w)` per candidate, with r's half of the vector made once per decision, and
one `Prediction` for the worker routing picks; `size_tuple(r)` for the queue key — by the
same arithmetic as `features` + the model's `predict` + `Calibration.correct`, so every
decision is the same (bench/quartz_determinism.py checks it on a simulator run).

Pure: no clock of its own; `now` comes with every event (the index's TTL reads the
latest). `view_of(worker_id)` is given by the driver so a dispatch chosen by any router
(least-loaded too) yields its features for the request log and the simulator's records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from policies.quantile.calibration import Calibration
from policies.quantile.features import (
    CATEGORY_INDEX,
    PrefillModel,
    Quantiles,
    Vector,
    at_index,
    vector,
)
from policies.quantile.prefix_index import PrefixIndex
from policies.types import Outcome, RequestInfo, WorkerView

SWEEP_EVERY = 4096  # dispatches between sweeps of the prefix index's expired entries
_BUCKETS = (0.0, 1.0, 2.0)  # a locality bucket (prefix_index NONE/PARTIAL/HIGH) as a feature

# (x, the model's (mean, q90, q95), the calibrated ones, the regime): a `Prediction` not
# yet made (routing makes one for the worker it picks only)
Estimate: TypeAlias = tuple[
    list[float], tuple[float, float, float], tuple[float, float, float], int
]
# a request's half of the vector: (its features, its prompt tokens, prompt class · 9)
Head: TypeAlias = tuple[tuple[float, ...], int, int]


def model_tuple(model: PrefillModel) -> Callable[[Vector], tuple[float, float, float]]:
    """x ↦ the model's (mean, q90, q95) as a plain tuple: its `predict_tuple` when it has
    one (the built-in models: no `Quantiles` is made per call), else from `predict`."""
    fast: Callable[[Vector], tuple[float, float, float]] | None = getattr(
        model, "predict_tuple", None
    )
    if fast is not None:
        return fast

    def from_predict(x: Vector) -> tuple[float, float, float]:
        q = model.predict(x)
        return q.mean, q.q90, q.q95

    return from_predict


@dataclass(slots=True)
class Prediction:
    """One request's prediction on the worker it was sent to. The quantiles are kept as
    plain (mean, q90, q95) tuples (`raw3`, `q3`: made per routing decision, read by the
    hooks); `raw` and `q` give them as `Quantiles`."""

    worker: str
    features: list[float]
    raw3: tuple[float, float, float]  # the model's
    q3: tuple[float, float, float]  # calibrated: what routing used
    regime: int
    dispatched: float = 0.0

    @property
    def raw(self) -> Quantiles:
        return Quantiles(*self.raw3)

    @property
    def q(self) -> Quantiles:
        return Quantiles(*self.q3)


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
    _model3: Callable[[Vector], tuple[float, float, float]] = field(init=False)
    # _model3 for a vector whose worker state is IDLE_WORKER (size_tuple's): the model's
    # `predict_idle_tuple` when it has one (a tree model's, specialised), else _model3
    _idle3: Callable[[Vector], tuple[float, float, float]] = field(init=False)
    _model_of: PrefillModel | None = None  # the model _model3 is of

    def __post_init__(self) -> None:
        self._refresh()

    def _refresh(self) -> None:
        self._model3 = model_tuple(self.model)
        idle: Callable[[Vector], tuple[float, float, float]] | None = getattr(
            self.model, "predict_idle_tuple", None
        )
        self._idle3 = self._model3 if idle is None else idle
        self._model_of = self.model

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
        """`_predict(view.id, features(request, view))`, by the hot path's `estimate`."""
        return self.chose_estimate(None, view.id, self.estimate(request, view))

    def estimate(
        self, request: RequestInfo, view: WorkerView, head: Head | None = None
    ) -> Estimate:
        """What `predict` computes, as plain tuples (x, raw, calibrated, regime): routing
        calls it K times per decision and builds a `Prediction` for its pick only.

        `_predict(view.id, features(request, view))` by the same arithmetic, inlined.
        `head`: `request_part(request)`, made once per decision for its K estimates (not
        kept longer: a request's fields may change between decisions)."""
        if head is None:
            head = self.request_part(request)
        front, prompt, prompt_regime = head
        if self._model_of is not self.model:
            self._refresh()
        loc = bucket = 0
        if request.prefix_hashes and self.use_locality:
            index = self.index
            loc = index.locality(view.id, request.prefix_hashes, prompt, self._now)
            if loc:  # `index.bucket(loc, prompt)`, inlined: PARTIAL (1) or HIGH (2)
                bucket = 2 if loc >= index.high_fraction * (prompt if prompt > 1 else 1) else 1
        running = view.running
        if view.in_flight >= running:  # `running if running > in_flight else in_flight`
            running = view.in_flight
        waiting = view.waiting
        x = [
            *front,
            float(loc) if loc else 0.0,  # no locality: the common case, no call
            _BUCKETS[bucket],
            float(running),
            float(waiting),
            float(view.prefill_tokens),
            view.kv_usage,
        ]
        raw = self._model3(x)
        cal = self.calibration
        load = running + waiting  # Calibration.regime(x), from the ints x was made of
        le = cal.load_edges
        regime = prompt_regime + bucket * 3 + (0 if load < le[0] else 1 if load < le[1] else 2)
        return x, raw, cal.correct_tuple(raw, regime), regime

    def request_part(self, request: RequestInfo) -> Head:
        """The request's half of the vector, its prompt tokens and prompt class · 9."""
        prompt = request.prompt_tokens
        pe = self.calibration.prompt_edges
        front = (
            float(prompt),
            float(request.max_tokens),
            request.temperature,
            request.top_p,
            CATEGORY_INDEX.get(request.category, 0.0),
            1.0 if request.stream else 0.0,
        )
        return front, prompt, (0 if prompt < pe[0] else 1 if prompt < pe[1] else 2) * 9

    def _predict(self, worker: str, x: list[float]) -> Prediction:
        if self._model_of is not self.model:
            self._refresh()
        raw = self._model3(x)
        regime = self.calibration.regime(x)
        return Prediction(worker, x, raw, self.calibration.correct_tuple(raw, regime), regime)

    def chose(self, request: RequestInfo, p: Prediction) -> None:
        """Routing picked `p.worker` for `request` with this prediction (on_dispatch uses it)."""
        self._chosen[request.id] = p

    def chose_estimate(self, request: RequestInfo | None, worker: str, e: Estimate) -> Prediction:
        """Routing picked `worker` for `request` with the estimate `e` (on_dispatch uses
        it); the `Prediction` made of it. `request` None: only make the prediction."""
        p = Prediction(worker, *e)
        if request is not None:
            self._chosen[request.id] = p
        return p

    def backlog(self, worker: str) -> float:
        return self._backlog.get(worker, 0.0)

    @property
    def backlog_of(self) -> Mapping[str, float]:
        """Ŵ by worker (absent: 0), read-only: routing reads it K times per decision."""
        return self._backlog

    def size(self, request: RequestInfo) -> Quantiles:
        """r's calibrated quantiles on an idle worker holding the longest prefix of r any
        worker was sent: ŝα(r) for the queue's key (Eq. 6 as adapted above)."""
        return Quantiles(*self.size_tuple(request))

    def size_tuple(self, request: RequestInfo) -> tuple[float, float, float]:
        """`size` as a plain (mean, q90, q95), by the same arithmetic (the queue's hot path)."""
        prompt = request.prompt_tokens
        index = self.index
        loc = bucket = 0
        if self.use_locality and request.prefix_hashes:
            loc = index.best_locality(request.prefix_hashes, prompt, self._now)
            if loc:  # `index.bucket(loc, prompt)`, inlined: PARTIAL (1) or HIGH (2)
                bucket = 2 if loc >= index.high_fraction * (prompt if prompt > 1 else 1) else 1
        x = [
            float(prompt),
            float(request.max_tokens),
            request.temperature,
            request.top_p,
            CATEGORY_INDEX.get(request.category, 0.0),
            1.0 if request.stream else 0.0,
            float(loc) if loc else 0.0,
            _BUCKETS[bucket],
            0.0,  # running, waiting, backlog, KV usage: IDLE_WORKER (what _idle3 is for)
            0.0,
            0.0,
            0.0,
        ]
        if self._model_of is not self.model:
            self._refresh()
        cal = self.calibration
        pe = cal.prompt_edges
        regime = (0 if prompt < pe[0] else 1 if prompt < pe[1] else 2) * 9 + bucket * 3
        if cal.load_edges[0] <= 0:  # an idle worker's load (0) is not in the lowest class
            regime = cal.regime(x)
        return cal.correct_tuple(self._idle3(x), regime)

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
        self._backlog[worker] = self._backlog.get(worker, 0.0) + p.q3[0]
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
            routed = p.q3[at_index(self.alpha)]
            self.calibration.observe_tuple(p.regime, p.raw3, routed, now - p.dispatched)

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self._now = now
        self._forget(request.id)
        self._chosen.pop(request.id, None)

    def _forget(self, rid: str) -> Prediction | None:
        p = self._pending.pop(rid, None)
        if p is not None:
            left = self._backlog.get(p.worker, 0.0) - p.q3[0]
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
