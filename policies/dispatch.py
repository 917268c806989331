"""Step 6: a request that finds no worker with room waits in the gateway, first come first
served, until a completion frees a slot in one of its pools or its deadline passes.

Why in the gateway: a worker's engine would queue the request itself, but then it is
committed to that worker; waiting here keeps the choice open until a slot frees anywhere
in the pool, and gives the queue an order the gateway controls (the fair, size-aware
QUARTZ queue replaces this FIFO behind the same `Dispatcher` protocol).

A worker's room is its capacity (`WorkerView.capacity`: the engine's `max_num_seqs` from
configuration, None = unbounded) less the gateway's own in-flight count; routing's
`has_room` filter keeps only workers with room. The driver asks `wait` when routing
found no worker *with room* while some are healthy (none healthy is still a 503), then
calls `wake(pool)` whenever a slot in `pool` is released; `cancel` removes a waiter whose
client left or whose deadline passed (the driver's timer: `Deadline`). Each waiter leaves
the queue exactly once: woken or cancelled.

The order is the dispatcher's (the protocol: policies/protocols/dispatch.py; the built-ins,
one per file, in policies/queue/, sharing their waiter bookkeeping, queue/waiters.py):
`fifo` (queue/fifo.py) serves first come first served;
`quartz` (policies/queue/quartz.py) orders by predicted tail prefill with aging and
per-client fairness; `token_fair` (policies/queue/token_fair.py) serves the client with
the least recent service first. `wait` is given the request itself (its size, its
client), and `served` tells the dispatcher a request it ordered had its first token
(the fair dispatchers' service counters).

Room (what makes the order matter, for every dispatcher alike): a worker takes another
request while its in-flight count is below `capacity` (`dispatch.capacity: engine`: the
engine's max_num_seqs), its outstanding tokens below `token_capacity`
(`dispatch.kv_overcommit`), and — with `dispatch.prefill_room` set — its prefill backlog
(prompt tokens dispatched without a first token yet, `WorkerView.prefill_tokens`) below
that many tokens. The last keeps a long prompt from being pushed into an engine already
busy prefilling: the request stays here, where the order is ours, and a first token
frees room as a completion does.

Failure posture: a full queue (`max_waiting`) refuses at once (the driver answers 429
with Retry-After); a waiter still queued `timeout_s` after it came is refused by the core on the driver's
`Deadline` (503 `queue_timeout`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from policies.clock import Clock
from policies.leases import Releasing
from policies.protocols.dispatch import DISPATCHERS, Dispatcher, Waiter
from policies.queue.fifo import FifoConfig, FifoDispatcher


def attach_clock(dispatcher: object, clock: Clock) -> bool:
    """Give a dispatcher that reads the time between events (QUARTZ's wait bound: it has
    `bind_clock`) the driver's clock; False when it does not. `wake` carries no time
    (a slot freed by a lease's release), so such a dispatcher asks the clock."""
    bind = getattr(dispatcher, "bind_clock", None)
    if bind is None:
        return False
    bind(clock)
    return True


@dataclass(slots=True, eq=False)
class QueuePosition(Releasing):
    """A waiter's place in the queue as a lease: released (cancelled) exactly once, by
    whoever ends the request first — woken, its deadline, or the client gone."""

    dispatcher: Dispatcher
    waiter: Waiter

    def release(self) -> None:
        self.dispatcher.cancel(self.waiter)  # a no-op once woken or cancelled


def make_dispatcher(name: str, params: Mapping[str, Any] | None = None) -> Dispatcher:
    return DISPATCHERS.make(name, params)


__all__ = [
    "DISPATCHERS",
    "Dispatcher",
    "FifoConfig",
    "FifoDispatcher",
    "QueuePosition",
    "Waiter",
    "attach_clock",
    "make_dispatcher",
]
