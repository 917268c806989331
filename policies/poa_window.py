"""The PoA diagnostics over a sliding window of completed requests, fed by the core's
events (policies/poa.py has the estimators; docs/CACHE_ROUTING.md).

`PoaTracker` implements the core's `Hook` protocol for any number of windows (one per
pool): it times each request from arrival to completion (the latency L_q; only `ok`
outcomes count), notes the worker it ran on and how many requests were in flight there
when it was dispatched (its n), and appends that as a tuple to the window of the worker's
pool. A `PoaWindow` keeps the last `window_s` seconds of completions, at most
`max_requests` of them, and is also a hook by itself (its own tracker: one pool). On demand:

- `paper(now)`: eq. 12 verbatim, with each worker's n_j frozen at the mean n of its
  requests in the window (workers without one: 0) and, when an index is given, o_qj the
  fraction of q's prompt blocks the worker holds *now* (the index has moved on since the
  request was routed: an approximation);
- `calibrated(now)`: one latency function fitted to the window's (n, L) pairs — pooled
  over workers, which a short window needs — and the window's mean total concurrency,
  estimated as the mean n at dispatch times the number of workers used.

In a `pd` pool a request counts on its decode worker (the paper's routing game is played
among the decode workers): `on_pair` moves it there from the prefill worker the core's
`on_dispatch` named.

Both are regime indicators, not efficiencies (policies/poa.py says why). Estimating costs a
Hungarian assignment of the window (milliseconds for a few hundred requests): call it per
control interval, never per request. The hooks themselves are O(1): a dictionary insert at
dispatch, a pop and a tuple appended at completion; arrival and first token do nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from policies.poa import PaperCost, PoaResult, fit_latency, poa_calibrated, poa_paper
from policies.prefix_index import PrefixIndex
from policies.types import Outcome, RequestInfo, Status


@dataclass(frozen=True, slots=True)
class Completed:
    """One request of the window."""

    finished: float
    latency: float
    worker: str
    load: int  # requests in flight on the worker when this one was dispatched, itself included
    hashes: tuple[int, ...]


# a completion as the hook records it — (finished, latency, worker, load, hashes), the
# fields of `Completed` — built into a `Completed` only when a window is read
CompletedTuple = tuple[float, float, str, int, tuple[int, ...]]


def completed(recorded: Sequence[CompletedTuple]) -> list[Completed]:
    return [Completed(*d) for d in recorded]


@dataclass(slots=True)
class PoaTracker:
    """The core hook that feeds PoA windows: one for all of a driver's windows, so a
    request costs one worker → window look-up at dispatch and two dictionary operations
    at each end, whatever the number of pools. `window_of(worker)`: the window a request
    dispatched to that worker counts in (None: none; the request is not followed).

    A request's latency runs from `RequestInfo.arrival` (the core's `now` at its arrival)
    to its completion, so arrival needs no hook. Requests dispatched and never completed
    (a lost completion) are bounded by `max_pending`, oldest dropped first."""

    window_of: Callable[[str], PoaWindow | None]
    max_pending: int = 100_000
    _dispatched: dict[str, tuple[PoaWindow, str, int]] = field(default_factory=dict)
    _in_flight: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_pending < 1:
            raise ValueError("max_pending: must be >= 1")

    # --- policies/hooks.py -------------------------------------------------------------
    def on_arrival(self, request: RequestInfo, now: float) -> None:
        return None

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        dispatched = self._dispatched
        ran = dispatched.pop(request.id, None)
        if ran is not None:  # a retry: the first attempt no longer loads its worker
            self._release(ran[1])
        window = self.window_of(worker)
        if window is None:
            return
        if len(dispatched) >= self.max_pending:  # a lost completion must not leak
            self._release(dispatched.pop(next(iter(dispatched)))[1])
        in_flight = self._in_flight
        n = in_flight.get(worker, 0) + 1
        in_flight[worker] = n
        dispatched[request.id] = (window, worker, n)

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        return None

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        ran = self._dispatched.pop(request.id, None)
        if ran is None:
            return
        window, worker, n = ran
        self._release(worker)
        if outcome.status is Status.OK:  # the deque's maxlen keeps the last max_requests
            window._done.append((now, now - request.arrival, worker, n, request.prefix_hashes))

    # --- policies/hooks.py PairHook: a `pd` pool's request runs on its decode worker ------
    def on_pair(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        self.on_dispatch(request, decode, now)  # (moves it off the prefill `on_dispatch` named)

    def on_handoff(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        return None

    def _release(self, worker: str) -> None:
        in_flight = self._in_flight
        left = in_flight[worker] - 1
        if left:
            in_flight[worker] = left
        else:
            del in_flight[worker]


@dataclass(slots=True)
class PoaWindow:
    window_s: float = 60.0
    max_requests: int = 512  # the Hungarian matrix is requests × copies: keep it small
    index: PrefixIndex | None = None  # for o_qj; None: no overlap term
    cost: PaperCost = field(default_factory=PaperCost)
    capacity: float = 64.0  # C for the fitted model (the paper's C_j)
    max_pending: int = 100_000  # requests between dispatch and completion, at most
    # which workers are this window's (a pool's); None: every worker. A request dispatched
    # elsewhere leaves the window.
    ours: Callable[[str], bool] | None = None
    _done: deque[CompletedTuple] = field(init=False)
    # the window as its own hook (one pool); a driver with several windows shares one
    # `PoaTracker` among them instead
    _tracker: PoaTracker = field(init=False)

    def __post_init__(self) -> None:
        if not self.window_s > 0 or not self.capacity > 0:
            raise ValueError("window_s, capacity: must be positive")
        if self.max_requests < 1 or self.max_pending < 1:
            raise ValueError("max_requests, max_pending: must be >= 1")
        self._done = deque(maxlen=self.max_requests)
        self._tracker = PoaTracker(self._mine, self.max_pending)

    def _mine(self, worker: str) -> PoaWindow | None:
        ours = self.ours
        return self if ours is None or ours(worker) else None

    # --- policies/hooks.py (as its own tracker's) ---------------------------------------
    def on_arrival(self, request: RequestInfo, now: float) -> None:
        return None

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        self._tracker.on_dispatch(request, worker, now)

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        return None

    def on_pair(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        self._tracker.on_pair(request, prefill, decode, now)

    def on_handoff(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        return None

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self._tracker.on_complete(request, outcome, now)

    # --- estimates ---------------------------------------------------------------------
    def window(self, now: float) -> list[Completed]:
        return completed(self.recent(now))

    def recent(self, now: float) -> tuple[CompletedTuple, ...]:
        """The window's completions as recorded (a bounded copy, for another thread to
        build into `Completed`s: `completed`)."""
        done = self._done
        oldest = now - self.window_s
        while done and done[0][0] < oldest:
            done.popleft()
        return tuple(done)

    def paper(self, now: float, workers: list[str] | None = None) -> PoaResult | None:
        """Eq. 12 over the window (None when it is empty). `workers`: the columns (default:
        the workers the window's requests ran on)."""
        return paper_estimate(self.window(now), now, workers, self.index, self.cost)

    def calibrated(self, now: float, workers: list[str] | None = None) -> PoaResult | None:
        """The calibrated estimate (None with fewer than 3 completions, or when the fit
        cannot serve the window)."""
        return calibrated_estimate(self.window(now), workers, self.capacity)


def paper_estimate(
    done: Sequence[Completed],
    now: float,
    workers: Sequence[str] | None = None,
    index: PrefixIndex | None = None,
    cost: PaperCost | None = None,
) -> PoaResult | None:
    """Eq. 12 over a snapshot of a window (`PoaWindow.window`): n_j frozen at the mean n
    of a worker's requests, o_qj read from `index` at `now` (None: no overlap term)."""
    if not done:
        return None
    loads: dict[str, list[int]] = {w: [] for w in workers or ()}
    for d in done:
        loads.setdefault(d.worker, []).append(d.load)
    n = {w: (sum(v) / len(v) if v else 0.0) for w, v in loads.items()}
    overlap = None
    if index is not None:
        overlap = [
            {w: index.overlap(w, d.hashes, now) / len(d.hashes) for w in n} if d.hashes else {}
            for d in done
        ]
    return poa_paper([d.latency for d in done], n, overlap, cost or PaperCost())


def calibrated_estimate(
    done: Sequence[Completed], workers: Sequence[str] | None = None, capacity: float = 64.0
) -> PoaResult | None:
    """The calibrated estimate over a snapshot of a window (None with fewer than 3
    completions, or when the fit cannot serve the window)."""
    if len(done) < 3:
        return None
    if any(d.load >= capacity for d in done):
        return None
    model = fit_latency([(float(d.load), d.latency) for d in done], capacity)
    columns = sorted({*(workers or ()), *(d.worker for d in done)})
    concurrency = sum(d.load for d in done) / len(done) * len({d.worker for d in done})
    try:
        return poa_calibrated(
            [d.latency for d in done],
            [d.worker for d in done],
            dict.fromkeys(columns, model),
            max(concurrency, 1e-9),
        )
    except ValueError:
        return None
