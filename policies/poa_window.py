"""The PoA diagnostics over a sliding window of completed requests, fed by the core's
events (policies/poa.py has the estimators; docs/CACHE_ROUTING.md).

`PoaWindow` implements the core's `Hook` protocol: it times each request from arrival to
completion (the latency L_q; only `ok` outcomes count), notes the worker it ran on and how
many of this window's requests were in flight there when it was dispatched (its n), and
keeps the last `window_s` seconds of completions, at most `max_requests` of them. On demand:

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
control interval, never per request. The hooks themselves are O(1).
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


@dataclass(slots=True)
class PoaWindow:
    window_s: float = 60.0
    max_requests: int = 512  # the Hungarian matrix is requests × copies: keep it small
    index: PrefixIndex | None = None  # for o_qj; None: no overlap term
    cost: PaperCost = field(default_factory=PaperCost)
    capacity: float = 64.0  # C for the fitted model (the paper's C_j)
    max_pending: int = 100_000  # requests between arrival and completion, at most
    # which workers are this window's (a pool's); None: every worker. A request dispatched
    # elsewhere leaves the window.
    ours: Callable[[str], bool] | None = None
    _arrived: dict[str, float] = field(default_factory=dict)
    _dispatched: dict[str, tuple[str, int]] = field(default_factory=dict)
    _in_flight: dict[str, int] = field(default_factory=dict)
    _done: deque[Completed] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if not self.window_s > 0 or not self.capacity > 0:
            raise ValueError("window_s, capacity: must be positive")
        if self.max_requests < 1 or self.max_pending < 1:
            raise ValueError("max_requests, max_pending: must be >= 1")

    # --- policies/hooks.py -------------------------------------------------------------
    def on_arrival(self, request: RequestInfo, now: float) -> None:
        pending = self._arrived
        if len(pending) >= self.max_pending:  # a lost completion must not leak
            gone = next(iter(pending))
            del pending[gone]
            self._leave(gone)
        pending[request.id] = now

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        self._leave(request.id)  # a retry: the first attempt no longer loads its worker
        ours = self.ours
        if ours is not None and not ours(worker):
            self._arrived.pop(request.id, None)
            return
        n = self._in_flight.get(worker, 0) + 1
        self._in_flight[worker] = n
        self._dispatched[request.id] = (worker, n)

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        return None

    # --- policies/hooks.py PairHook: a `pd` pool's request runs on its decode worker ------
    def on_pair(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        self.on_dispatch(request, decode, now)  # (moves it off the prefill `on_dispatch` named)

    def on_handoff(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        return None

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        t0 = self._arrived.pop(request.id, None)
        ran = self._leave(request.id)
        if t0 is None or ran is None or outcome.status is not Status.OK:
            return
        done = self._done
        done.append(Completed(now, now - t0, ran[0], ran[1], request.prefix_hashes))
        if len(done) > self.max_requests:
            done.popleft()

    def _leave(self, request_id: str) -> tuple[str, int] | None:
        ran = self._dispatched.pop(request_id, None)
        if ran is not None:
            left = self._in_flight[ran[0]] - 1
            if left:
                self._in_flight[ran[0]] = left
            else:
                del self._in_flight[ran[0]]
        return ran

    # --- estimates ---------------------------------------------------------------------
    def window(self, now: float) -> list[Completed]:
        done = self._done
        oldest = now - self.window_s
        while done and done[0].finished < oldest:
            done.popleft()
        return list(done)

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
