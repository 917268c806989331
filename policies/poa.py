"""Price-of-anarchy diagnostics for a window of completed requests ("The Price of Anarchy in
Disaggregated Inference", eq. 12 and §6.4; docs/CACHE_ROUTING.md). Diagnostics only: no
routing decision reads them.

    PoA^(W) = Σ_{q ∈ W} L_q(actual) / OPT(W)                                    (eq. 12)

OPT(W) is the least total cost of assigning W's requests to the workers: the Hungarian
algorithm's value on a matrix whose columns are each worker's copies (the many-to-one
assignment made one-to-one). Solved without building that matrix where its structure
allows: eq. 12's copies of a worker are identical, a transportation problem over the
workers (`_transport`, successive shortest paths); the calibrated model without an overlap
credit has identical rows (the sum of the cheapest marginals). scipy's
linear_sum_assignment solves the rest (the calibrated model with a credit).

`poa_paper` is the paper's estimator verbatim: every copy of worker j costs

    c_qj = a·n_j + b + d/(C_j − n_j)^β − w_c·o_qj
    a = 0.005, b = 0.020, d = 0.010, β = 2, C_j = 64 copies, w_c = 0.015

with n_j the worker's load frozen from the observed allocation and o_qj ∈ [0, 1] the
request's prefix overlap on j. What it measures, and not: the numerator is measured
seconds, the denominator an uncalibrated model of ~0.02–0.2 s per request, so the ratio
mostly tracks the latency scale and n_j (a fleet of 2 workers at n_j = 32 has a model cost
2.4× a fleet of 5 at n_j = 12.8 — exactly the plateau ratio the paper attributes to a
larger routing game); the frozen loads make OPT a lower bound, so PoA^ is an upper bound of
the true ratio and may also fall below 1. Read it as a regime indicator, never as "x times
worse than optimal". Our choices where the paper is silent: n_j ≥ C_j is clamped to
C_j − 1 (the model's pole), and when |W| exceeds Σ_j C_j every worker gets ⌈|W|/m⌉ copies
so that every request is assigned.

`poa_calibrated` replaces the model by latency functions fitted to observed latencies
(`fit_latency`: f(n) = b + a·n + d/(C − n)^β by non-negative least squares, so f is convex
and increasing below C) and lets the loads follow the assignment: W is treated as one batch
sharing the workers, m requests on j running at concurrency n = m·s (s = the window's
observed mean concurrency / |W|), so the k-th copy of j costs its marginal
k·f(k·s) − (k−1)·f((k−1)·s). Those marginals increase with k, so the Hungarian optimum is
the exact many-to-one optimum of the model; when the observed latencies are the model's,
PoA ≥ 1. It is still a model: it knows load and overlap, not prefill/decode interference,
queueing order or KV evictions.

The matrix is |W| × (Σ copies): windows of a few hundred requests solve in milliseconds,
thousands in seconds. numpy and scipy are imported on first use (the gateway's start-up
does not load them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PaperCost:
    """Eq. 12's cost model with the paper's constants."""

    a: float = 0.005
    b: float = 0.020
    d: float = 0.010
    beta: float = 2.0
    capacity: int = 64  # C_j: copies per worker, and the model's pole
    w_c: float = 0.015

    def latency(self, n: float) -> float:
        """a·n + b + d/(C − n)^β, with n clamped below the pole at C − 1."""
        n = min(n, self.capacity - 1)
        return self.a * n + self.b + self.d / math.pow(self.capacity - n, self.beta)


@dataclass(frozen=True, slots=True)
class PoaResult:
    actual: float  # Σ observed latencies, seconds
    opt: float  # OPT(W), in the cost model's units
    requests: int

    @property
    def ratio(self) -> float:
        return self.actual / self.opt if self.opt > 0 else math.inf


def _assign(cost: Any) -> float:
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].sum())


TRANSPORT_MAX_WORKERS = 16  # 512 requests: 58 ms against the Hungarian's 97; at 32, 159 vs 63


def _transport(cost: Sequence[Sequence[float]], capacity: Sequence[int]) -> float:
    """The least total cost of giving each row one of the m columns, column j at most
    `capacity[j]` rows: the Hungarian's value on the matrix with each column copied
    `capacity[j]` times, for few columns (workers) without building it. Rows are inserted
    one at a time along a shortest augmenting path — successive shortest paths, so the
    assignment stays optimal for the rows inserted so far: a path enters a column and may
    move one of its rows on to another column, the cheapest such move from j to k being the
    top of a heap of (c_rk − c_rj) over the rows r on j (stale entries skipped). Bellman–
    Ford over the m columns (the moves can be negative; an optimal assignment has no
    negative cycle). O(|W|·m³) plus the heaps: milliseconds for hundreds of rows over a few
    workers, where the copied matrix's assignment takes a hundred."""
    import heapq

    m = len(capacity)
    if sum(capacity) < len(cost):
        raise ValueError("_transport: more rows than places")
    where: list[int] = []  # row → its column
    used = [0] * m
    moves: list[list[list[tuple[float, int]]]] = [[[] for _ in range(m)] for _ in range(m)]

    def place(r: int, j: int) -> None:
        row = cost[r]
        for k in range(m):
            if k != j:
                heapq.heappush(moves[j][k], (row[k] - row[j], r))

    def best_move(j: int, k: int) -> tuple[float, int] | None:
        heap = moves[j][k]
        while heap and where[heap[0][1]] != j:
            heapq.heappop(heap)  # the row has moved since
        return heap[0] if heap else None

    inf = math.inf
    for q, row in enumerate(cost):
        dist = list(row)
        via: list[tuple[int, int] | None] = [None] * m  # (previous column, moved row)
        top = [[best_move(j, k) if j != k else None for k in range(m)] for j in range(m)]
        for _ in range(m - 1):  # Bellman–Ford: at most m − 1 rounds
            changed = False
            for j in range(m):
                dj = dist[j]
                if dj == inf:
                    continue
                for k in range(m):
                    e = top[j][k]
                    if e is not None and dj + e[0] < dist[k] - 1e-15:
                        dist[k] = dj + e[0]
                        via[k] = (j, e[1])
                        changed = True
            if not changed:
                break
        sink = min((k for k in range(m) if used[k] < capacity[k]), key=dist.__getitem__)
        used[sink] += 1
        where.append(-1)
        k = sink
        path: list[tuple[int, int, int]] = []  # (row, from, to)
        seen = 0
        while via[k] is not None and seen < m:
            j, r = via[k]  # type: ignore[misc]
            path.append((r, j, k))
            k = j
            seen += 1
        for r, _j, to in path:  # each moved row leaves its column for the next one
            where[r] = to
            place(r, to)
        where[q] = k  # the new row enters the path's first column
        place(q, k)
    return math.fsum(cost[r][where[r]] for r in range(len(cost)))


def _overlap(overlap: Sequence[Mapping[str, float]] | None, q: int, worker: str) -> float:
    if overlap is None:
        return 0.0
    o = overlap[q].get(worker, 0.0)
    if not 0.0 <= o <= 1.0:
        raise ValueError(f"overlap[{q}][{worker!r}]: must be in [0, 1]")
    return o


def poa_paper(
    latencies: Sequence[float],
    load: Mapping[str, float],
    overlap: Sequence[Mapping[str, float]] | None = None,
    cost: PaperCost | None = None,
) -> PoaResult:
    """Eq. 12 over a window: `latencies` observed (seconds), `load` the frozen n_j of every
    worker (the columns), `overlap[q][j]` the request's overlap fraction on j (missing: 0)."""
    model = cost or PaperCost()
    workers = list(load)
    if not latencies or not workers:
        raise ValueError("poa_paper: needs at least one request and one worker")
    if overlap is not None and len(overlap) != len(latencies):
        raise ValueError("overlap: one mapping per request")
    copies = max(model.capacity, -(-len(latencies) // len(workers)))
    base = [model.latency(load[w]) for w in workers]
    per_worker = [
        [base[j] - model.w_c * _overlap(overlap, q, w) for j, w in enumerate(workers)]
        for q in range(len(latencies))
    ]
    # the assignment to `copies` identical copies of each worker: solved as the
    # transportation problem it is for a few workers (the copied matrix's Hungarian gives
    # the same value; bench/poa_hooks.py: 7.6 against 33 ms at 512 requests over 4
    # workers), by the Hungarian beyond TRANSPORT_MAX_WORKERS (O(|W|·m³) loses there)
    if len(workers) <= TRANSPORT_MAX_WORKERS:
        opt = _transport(per_worker, [copies] * len(workers))
    else:
        import numpy as np

        opt = _assign(np.repeat(np.array(per_worker), copies, axis=1))
    return PoaResult(math.fsum(latencies), opt, len(latencies))


@dataclass(frozen=True, slots=True)
class FittedLatency:
    """f(n) = b + a·n + d/(C − n)^β, seconds per request at concurrency n < C."""

    a: float
    b: float
    d: float
    capacity: float
    beta: float = 2.0

    def latency(self, n: float) -> float:
        if n >= self.capacity:
            return math.inf
        return self.b + self.a * n + self.d / math.pow(self.capacity - n, self.beta)


def fit_latency(
    samples: Sequence[tuple[float, float]], capacity: float, beta: float = 2.0
) -> FittedLatency:
    """Fit f to (concurrency at dispatch, observed latency) pairs by non-negative least
    squares (a, b, d ≥ 0: f convex and increasing below `capacity`)."""
    import numpy as np
    from scipy.optimize import nnls

    if len(samples) < 3:
        raise ValueError("fit_latency: needs at least 3 samples")
    n = np.array([s[0] for s in samples], dtype=float)
    y = np.array([s[1] for s in samples], dtype=float)
    if (n >= capacity).any() or (n < 0).any():
        raise ValueError("fit_latency: every concurrency must be in [0, capacity)")
    columns = np.column_stack([n, np.ones_like(n), (capacity - n) ** -beta])
    (a, b, d), _ = nnls(columns, y)
    return FittedLatency(float(a), float(b), float(d), capacity, beta)


def poa_calibrated(
    latencies: Sequence[float],
    assigned: Sequence[str],
    models: Mapping[str, FittedLatency],
    concurrency: float | None = None,
    overlap: Sequence[Mapping[str, float]] | None = None,
    w_c: float = 0.0,
) -> PoaResult:
    """PoA against the fitted model's exact many-to-one optimum. `assigned[q]` is the
    worker request q ran on (only checked to be known); `models` one fitted f per worker
    (the columns); `concurrency` the window's mean total in-flight requests (default |W|:
    the window as one batch); `overlap`/`w_c` an optional per-request cache credit."""
    import numpy as np

    size = len(latencies)
    workers = list(models)
    if not size or not workers:
        raise ValueError("poa_calibrated: needs at least one request and one worker")
    if len(assigned) != size or (overlap is not None and len(overlap) != size):
        raise ValueError("assigned, overlap: one entry per request")
    unknown = sorted(set(assigned) - set(workers))
    if unknown:
        raise ValueError(f"assigned: workers without a model: {', '.join(unknown)}")
    s = (concurrency if concurrency is not None else size) / size
    if not s > 0:
        raise ValueError("concurrency: must be positive")
    columns: list[float] = []
    owner: list[int] = []
    for j, w in enumerate(workers):
        f = models[w]
        prev = 0.0
        for k in range(1, size + 1):
            total = k * f.latency(k * s)
            if not math.isfinite(total):
                break  # the worker's capacity at this concurrency
            columns.append(total - prev)
            owner.append(j)
            prev = total
    if len(columns) < size:
        raise ValueError("poa_calibrated: the window exceeds the fitted capacity of the fleet")
    marginal = np.array(columns)
    if overlap is None or w_c == 0.0:
        # every row is the same: any `size` distinct copies serve the window, so the
        # optimum is the sum of the `size` cheapest marginals — the Hungarian's value
        # without its O(|W|³) solve (the gateway's estimate every interval is this one)
        cheapest = np.partition(marginal, size - 1)[:size]
        return PoaResult(math.fsum(latencies), math.fsum(cheapest.tolist()), size)
    owners = np.array(owner)
    credit = np.array([[w_c * _overlap(overlap, q, w) for w in workers] for q in range(size)])
    matrix = marginal[None, :] - credit[:, owners]
    return PoaResult(math.fsum(latencies), _assign(matrix), size)
