"""QUARTZ's admission queue (the QUARTZ paper, §3.4, §4.3, Eq. 6–8, Algorithm 1 lines
9–12): a heap per pool keyed by

    k_fair(r) = ŝα(r) + λ · a_r + β · u(c(r))                                 (Eq. 6–8)

ŝα(r) the request's predicted α-quantile prefill (the predictor's `size`: r alone on an
idle worker holding its best prefix — see policies/quantile/predictor.py for why not on
w(r)); a_r its arrival at the gateway (`RequestInfo.arrival`, seconds, kept when a woken
request finds no room and queues again); u(c) its client's share of recent service at
arrival (counters.py: decayed prompt tokens served relative to the average active client,
dimensionless — see there why not raw tokens), updated when a request of the client has
its first token (`served`).
Lower keys go first. Aging without priority updates (Eq. 7): a request arriving Δ seconds
later carries λ·Δ more, so r is served before any request arriving more than
(ŝα(r) + β·u(c)) / λ seconds after it — no request waits forever while room keeps freeing.

A request that can use several pools is in each of their heaps; each waiter leaves the
queue exactly once (woken or cancelled: the bookkeeping shared by every
dispatcher, waiters.py) and stale heap entries are skipped when popped (compacted when
they outnumber live ones).

Fallback (§3.5): while the predictor's calibration reports degraded coverage — or no
predictor is bound — wake takes the oldest waiter (FIFO), and new keys carry ŝα = 0.
`point` keys by the predicted mean instead of the quantile (PointPred);
`fairness: false` drops β·u (the "no fairness" ablation).

Wait bound (`wait_bound_s` θ; not the paper's, off by default — the paper-literal key
alone): a request that has waited θ since its arrival at the gateway is served ahead of
the size-ordered heap, the longest-waiting first. Why: the key's aging term bounds how
long a request is *overtaken* only relative to later arrivals ((ŝα + β·u)/λ seconds of
them), not its wait, so at the saturation knee long prompts wait many times their SLO and
set the P99 (docs/QUARTZ_PAPER.md). With θ the bulk is still served size-first and the
tail is cut at θ plus the time to serve the aged requests ahead. No priority is ever
updated: each waiter also sits in a second heap per pool keyed by the instant it ages,
a_r + θ (arrival order: θ is one number), and wake checks that heap's head against the
clock first. `wait_bound_slo` (a fraction f) sets θ per request as f × its class's TTFT
SLO (`slo_s`, keyed by `RequestInfo.slo_class`; a class not listed uses `wait_bound_s`),
so an interactive prompt ages sooner than a long one; the aged heap is then ordered by
that instant, earliest first. The time is the bound clock (`bind_clock`, done by the
drivers), else the latest time the queue was told of (wait, served).

Bounds: `max_waiting` (full: refused at once, 429) and `timeout_s` (503 queue_timeout).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.clock import Clock
from policies.protocols.dispatch import DISPATCHERS, Dispatcher, Waiter
from policies.quantile.features import at_index
from policies.quantile.predictor import Predictor
from policies.queue.counters import ClientCounters
from policies.queue.waiters import Waiters
from policies.registry import ParamError, config_from
from policies.types import RequestInfo


@dataclass(frozen=True)
class QuartzQueueConfig:
    max_waiting: int = 1024
    timeout_s: float = 30.0
    alpha: float | None = None  # the quantile keyed by; None: the predictor's
    lam: float = 0.02  # λ: aging, key seconds per second of arrival
    beta: float = 0.10  # β: fairness weight, key seconds per unit of client service
    point: bool = False  # ŝ = the predicted mean (PointPred)
    fairness: bool = True
    half_life_s: float = 10.0  # client counters (counters.py)
    unit_tokens: float = 1000.0
    idle_s: float = 60.0
    max_clients: int = 10_000
    # θ, seconds since arrival after which a request goes ahead of the size order (module
    # docstring); None: the paper's key alone
    wait_bound_s: float | None = None
    # θ as this fraction of the request's class TTFT SLO (`slo_s`); None: `wait_bound_s`
    wait_bound_slo: float | None = None
    slo_s: Mapping[str, float] = field(default_factory=dict)  # TTFT SLO per slo_class, s

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError("max_waiting: must not be negative")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")
        if self.alpha not in (None, 0.9, 0.95):
            raise ValueError("alpha: must be 0.9 or 0.95")
        if self.lam < 0 or self.beta < 0:
            raise ValueError("lam, beta: must not be negative")
        if self.wait_bound_s is not None and not self.wait_bound_s > 0:
            raise ParamError("wait_bound_s", "must be positive (seconds) or absent")
        if self.wait_bound_slo is not None and not self.wait_bound_slo > 0:
            raise ParamError("wait_bound_slo", "must be positive (a fraction of the SLO)")
        if not isinstance(self.slo_s, Mapping):
            raise ParamError("slo_s", "must map an SLO class to seconds")
        for cls, slo in self.slo_s.items():
            if not isinstance(slo, (int, float)) or isinstance(slo, bool) or not slo > 0:
                raise ParamError(f"slo_s.{cls}", "must be positive seconds")
        if self.wait_bound_slo is not None and not self.slo_s:
            raise ParamError("slo_s", "wait_bound_slo needs each class's TTFT SLO here")

    def wait_bound(self, request: RequestInfo) -> float | None:
        """θ for `request`: f × its class's SLO when both are known, else wait_bound_s."""
        if self.wait_bound_slo is not None:
            slo = self.slo_s.get(request.slo_class)
            if slo is not None:
                return self.wait_bound_slo * slo
        return self.wait_bound_s


@dataclass(slots=True)
class QuartzDispatcher:
    config: QuartzQueueConfig = field(default_factory=QuartzQueueConfig)
    predictor: Predictor | None = None
    clock: Clock | None = None  # the wait bound's time (None: the latest time seen)
    counters: ClientCounters = field(init=False)
    _heaps: dict[str, list[tuple[float, int, Waiter]]] = field(default_factory=dict)
    # with a wait bound: per pool, (the instant the waiter ages, seq, waiter)
    _aged: dict[str, list[tuple[float, int, Waiter]]] = field(default_factory=dict)
    _seen: float = float("-inf")  # the latest time wait / served were given
    _waiters: Waiters = field(init=False)
    _seq: int = 0

    def __post_init__(self) -> None:
        c = self.config
        self.counters = ClientCounters(c.half_life_s, c.unit_tokens, c.idle_s, c.max_clients)
        self._waiters = Waiters(c.max_waiting, c.timeout_s, self._forget)

    @property
    def max_waiting(self) -> int:
        return self.config.max_waiting

    @property
    def timeout_s(self) -> float:
        return self.config.timeout_s

    def bind_predictor(self, predictor: Predictor) -> None:
        self.predictor = predictor

    def bind_clock(self, clock: Clock) -> None:
        self.clock = clock

    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else self._seen

    def key(self, request: RequestInfo, now: float) -> float:
        """k_fair(r) (Eq. 6–8): a_r is the request's arrival at the gateway, so a request
        queued again (woken, but the room went elsewhere) keeps its age; u(c) is read `now`."""
        c = self.config
        p = self.predictor
        size = 0.0
        if p is not None and not p.calibration.degraded:
            alpha = p.alpha if c.alpha is None else c.alpha
            at = 0 if c.point else at_index(alpha)  # the mean, or ŝα, of (mean, q90, q95)
            size = p.size_tuple(request)[at]
        k = size + c.lam * request.arrival
        if c.fairness and c.beta:
            k += c.beta * self.counters.share(request.entitlement, now)
        return k

    def wait(self, request: RequestInfo, pools: tuple[str, ...], now: float) -> Waiter | None:
        self._seen = max(self._seen, now)
        waiter = self._waiters.add(request, pools, now)
        if waiter is None:
            return None
        k = self.key(request, now)
        self._seq += 1
        entry = (k, self._seq, waiter)
        theta = self.config.wait_bound(request)
        # a_r, not now: a request queued again (woken, the room went elsewhere) keeps its age
        aged = None if theta is None else (request.arrival + theta, self._seq, waiter)
        for pool in pools:
            heapq.heappush(self._heaps.setdefault(pool, []), entry)
            if aged is not None:
                heapq.heappush(self._aged.setdefault(pool, []), aged)
        return waiter

    def served(self, request: RequestInfo, now: float) -> None:
        self._seen = max(self._seen, now)
        self.counters.add(request.entitlement, request.prompt_tokens, now)

    def wake(self, pool: str) -> Waiter | None:
        if not self._waiters.waiting(pool):
            return None
        p = self.predictor
        if p is None or p.calibration.degraded:
            return self._waiters.oldest(pool)
        aged = self._aged.get(pool)
        if aged:
            while aged and aged[0][2].done:
                heapq.heappop(aged)
            if aged and aged[0][0] <= self._now():
                waiter = heapq.heappop(aged)[2]
                self._waiters.leave(waiter)
                return waiter
        heap = self._heaps[pool]
        while heap:
            _, _, waiter = heapq.heappop(heap)
            if not waiter.done:
                self._waiters.leave(waiter)
                return waiter
        return None

    def cancel(self, waiter: Waiter) -> None:
        self._waiters.cancel(waiter)

    def waiting(self, pool: str) -> int:
        return self._waiters.waiting(pool)

    def _forget(self, waiter: Waiter) -> None:
        """A waiter left: compact its pools' heaps once stale entries outnumber live ones."""
        per_pool = self._waiters.per_pool
        for pool in waiter.pools:
            live = 4 * max(per_pool[pool], 16)
            for heaps in (self._heaps, self._aged):
                heap = heaps.get(pool)
                if heap is not None and len(heap) > live:
                    heaps[pool] = [e for e in heap if not e[2].done]
                    heapq.heapify(heaps[pool])

    def __len__(self) -> int:
        return self._waiters.live


@DISPATCHERS.register("quartz")
def _factory(params: Mapping[str, Any]) -> Dispatcher:
    return QuartzDispatcher(config_from(QuartzQueueConfig, params))
