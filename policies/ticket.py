"""One request inside the core (policies/core.py), from `Core.start` to `Finished`: what
it holds (its leases, reservation, queue place, worker slot) and what the core decided so far.

Its own module so that actions (policies/actions.py), which carry the ticket, and the core,
which makes them, both import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.admission import Reservation
from policies.dispatch import Waiter
from policies.dp_group import Pooled, Seat
from policies.events import Request
from policies.intake import Placed
from policies.leases import Leases, PrefillWork, WorkerSlot
from policies.pd.pool import PdLeg
from policies.types import RequestInfo


@dataclass(slots=True, eq=False)
class Ticket:
    """One request inside the core, from `start` to `Finished`."""

    placed: Placed
    request: Request | None = None
    leases: Leases = field(default_factory=Leases)
    reservation: Reservation | None = None
    waiter: Waiter | None = None  # its last place in the queue
    prefill: PrefillWork | None = None  # its prompt in the worker's prefill backlog
    slot: WorkerSlot | None = None  # the current attempt's (a `pd` pool: its decode slot)
    pd: PdLeg | None = None  # a `pd` pool's current attempt: its pair and their two slots
    worker: str = ""  # the current attempt's worker
    pool: str = ""  # … and its pool
    tried: tuple[str, ...] = ()  # workers a failed attempt went to (a retry avoids them)
    retries: int = 0
    context_retried: bool = False  # re-placed on longer pools after an engine's refusal
    admission: str | None = None  # "admitted" or the refusing check's code
    hold: str | None = None  # its reservation's hold, when it may be evicted
    completed: bool = False
    token: object = None  # the driver's handle for this request
    # a dp_group pool (policies/dp_group.py): its place in the holding pool, then its seat
    # on a rank (also in `leases`); `rank` once assigned
    dp: Pooled | Seat | None = None
    rank: int | None = None

    @property
    def info(self) -> RequestInfo:
        return self.placed.info

    @property
    def pools(self) -> tuple[str, ...]:
        return self.placed.pools
