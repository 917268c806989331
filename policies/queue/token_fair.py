"""Token-fair admission, the QUARTZ paper's TokenFair baseline (its
§5.3), in the manner of the Virtual Token Counter (Sheng et al. 2024): when room frees in
a pool, serve the client with the least recent service (counters.py: decayed prompt
tokens served, counted at first token), its requests first come first served; ties go to
the client whose oldest waiter arrived first. Size-oblivious: it knows nothing of
predicted prefill.

Cost: wake scans the clients with a waiter (O(active clients)), which is small next to the
requests they send.

Bounds: `max_waiting` (full: refused at once, 429) and `timeout_s` (503 queue_timeout).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.protocols.dispatch import DISPATCHERS, Dispatcher, Waiter
from policies.queue.counters import ClientCounters
from policies.queue.waiters import Waiters
from policies.registry import config_from
from policies.types import RequestInfo


@dataclass(frozen=True)
class TokenFairConfig:
    max_waiting: int = 1024
    timeout_s: float = 30.0
    half_life_s: float = 10.0
    unit_tokens: float = 1000.0
    idle_s: float = 60.0
    max_clients: int = 10_000

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError("max_waiting: must not be negative")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s: must be positive")


@dataclass(slots=True)
class TokenFairDispatcher:
    config: TokenFairConfig = field(default_factory=TokenFairConfig)
    counters: ClientCounters = field(init=False)
    _clients: dict[str, deque[Waiter]] = field(default_factory=dict)  # arrival order each
    _waiters: Waiters = field(init=False)
    _now: float = 0.0

    def __post_init__(self) -> None:
        c = self.config
        self.counters = ClientCounters(c.half_life_s, c.unit_tokens, c.idle_s, c.max_clients)
        self._waiters = Waiters(c.max_waiting, c.timeout_s, self._forget)

    def wait(self, request: RequestInfo, pools: tuple[str, ...], now: float) -> Waiter | None:
        waiter = self._waiters.add(request, pools, now)
        if waiter is None:
            return None
        self._now = max(self._now, now)
        self._clients.setdefault(request.entitlement, deque()).append(waiter)
        return waiter

    def served(self, request: RequestInfo, now: float) -> None:
        self._now = max(self._now, now)
        self.counters.add(request.entitlement, request.prompt_tokens, now)

    def wake(self, pool: str) -> Waiter | None:
        if not self._waiters.waiting(pool):
            return None
        best: Waiter | None = None
        best_key = (0.0, 0.0)
        for client, queue in list(self._clients.items()):
            while queue and queue[0].done:
                queue.popleft()
            if not queue:
                del self._clients[client]
                continue
            first = next((w for w in queue if not w.done and pool in w.pools), None)
            if first is None:
                continue
            key = (self.counters.value(client, self._now), first.since)
            if best is None or key < best_key:
                best, best_key = first, key
        if best is not None:
            self._waiters.leave(best)
        return best

    def cancel(self, waiter: Waiter) -> None:
        self._waiters.cancel(waiter)

    def waiting(self, pool: str) -> int:
        return self._waiters.waiting(pool)

    def _forget(self, waiter: Waiter) -> None:
        """A waiter left: compact its client's queue once the dead outnumber the live."""
        client = waiter.request.entitlement if waiter.request is not None else ""
        queue = self._clients.get(client)
        if queue is not None and len(queue) > 4 * max(self._waiters.live, 16):
            self._clients[client] = deque(w for w in queue if not w.done)

    def __len__(self) -> int:
        return self._waiters.live


@DISPATCHERS.register("token_fair")
def _factory(params: Mapping[str, Any]) -> Dispatcher:
    return TokenFairDispatcher(config_from(TokenFairConfig, params))
