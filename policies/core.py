"""The request pipeline's core: steps 3–7 and 9 of ARCHITECTURE.md for one request, pure.

    arrive       estimate + place (policies/intake.py)     → Ticket | Refusal
                   … hooks.on_arrival
    fitted       apply the driver's exact count / compression (it ran the compressor, or
                 a compression model) to the ticket        → Refusal | None
    admit        step 5: the admitter's reservation, a lease → AdmissionRefused | None
    route        step 7: the pool's router over the views the driver gives → Route | None
                 (`queued_behind`: first come, first served — others already wait)
    wait         step 6: a queue position (a lease), woken when a slot of its pools frees
    dispatch     a WorkerSlot lease on the chosen worker (and, with `track_prefill`, a
                 PrefillWork lease: its prompt in the worker's prefill backlog)
                                                           … hooks.on_dispatch
    first_token  the PrefillWork lease goes back; the dispatcher hears `served`
                                                           … hooks.on_first_token
    answered     the same for a whole answer with no first token seen (no hook: its
                 time is not a prefill)
    complete     settle: ĉ_k learns, the admitter settles, every lease is released
                                                           … hooks.on_complete

There are two drivers of this one core. The gateway (gateway/proxy.py) drives it in real
time over HTTP: it reads and parses the body, runs the compressor on a thread, forwards and
relays. The simulator (simulator/driver.py) drives it in virtual time over the engine model:
it draws compression from a model and submits to simulated engines. Neither counts a
worker's load, a queue position or a reservation by hand: everything a request takes is a
lease in `Ticket.leases`, and `complete` releases them all, exactly once, on every path
(an answer, an engine error, a client gone, a retry on another worker, a timeout).

Each step is a registered policy chosen by configuration (`placement.policy`,
`admission.policy`, `dispatch.policy`, `routing.policy`); one router instance per pool, so
a router's state (a round-robin turn, a seeded RNG) is the pool's own in both drivers.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from compressor.compress import Compression
from policies.admission import AdmissionRefused, AdmitAll, Admitter, Reservation
from policies.dispatch import Dispatcher, FifoDispatcher, QueuePosition, Waiter
from policies.hooks import Hook
from policies.intake import Intake, Intaken, Prompt, Refusal
from policies.leases import Leases, Load, PrefillLoad, PrefillWork, WorkerSlot
from policies.routing import Router
from policies.types import Outcome, PoolSpec, RequestInfo, Status, WorkerView

Views = Callable[[str], Sequence[WorkerView]]  # a pool's workers as routing sees them now


@dataclass(slots=True, eq=False)
class Ticket:
    """One request inside the core, from arrival to completion."""

    taken: Intaken
    leases: Leases = field(default_factory=Leases)
    reservation: Reservation | None = None
    waiter: Waiter | None = None
    prefill: PrefillWork | None = None  # its prompt in the worker's prefill backlog
    completed: bool = False
    token: object = None  # the driver's handle (the gateway: a future its waiter awaits)

    @property
    def info(self) -> RequestInfo:
        return self.taken.info

    @property
    def pools(self) -> tuple[str, ...]:
        return self.taken.pools


@dataclass(frozen=True, slots=True)
class Route:
    """Where routing sent a request: the worker's view, its pool, and whether that pool
    is not the placement's first choice (a spill)."""

    worker: WorkerView
    pool: str
    spilled: bool


def _nobody(load: Load) -> None:
    pass


def _nobody_woken(ticket: Ticket) -> None:
    pass


def _has_room(load: object) -> bool:
    """Room on a worker by this gateway's own counts (with a prefill room configured, the
    load is a `WorkerView` or the gateway's `WorkerState`: both carry these). Waking a
    waiter for a worker still full would send it back to the end of the queue."""
    w: Any = load
    if w.capacity is not None and w.in_flight >= w.capacity:
        return False
    return w.prefill_capacity is None or w.prefill_tokens < w.prefill_capacity


@dataclass(slots=True, eq=False)
class Core:
    intake: Intake
    router_for: Callable[[str], Router]  # builds the router of a pool seen first
    admitter: Admitter = field(default_factory=AdmitAll)
    dispatcher: Dispatcher = field(default_factory=FifoDispatcher)
    hooks: tuple[Hook, ...] = ()
    # the driver's side of a slot coming back (the gateway: a draining worker may leave)
    on_released: Callable[[Load], object] = _nobody
    # a waiting request was given a freed slot: the driver routes it again
    on_woken: Callable[[Ticket], object] = _nobody_woken
    routers: dict[str, Router] = field(default_factory=dict)
    # count each dispatched prompt in its worker's prefill backlog until its first token
    # (`WorkerView.prefill_tokens`): on when a prefill room is configured or QUARTZ's
    # features are wanted; off, the default path takes no extra lease
    track_prefill: bool = False
    # a first token frees room (`dispatch.prefill_room`): wake a waiter of the pool then
    prefill_room: bool = False

    # --- steps 3–4 ------------------------------------------------------------------
    def arrive(
        self,
        prompt: Prompt,
        key: str,
        now: float,
        pools: Sequence[PoolSpec],
        healthy: Collection[str] | None = None,
        entitlement: str | None = None,
        prefix_hashes: tuple[int, ...] = (),
        slo_class: str | None = None,
    ) -> Ticket | Refusal:
        """Estimate and place; the hooks hear of the request only once it is placed."""
        taken = self.intake.take(prompt, key, now, pools, healthy)
        if isinstance(taken, Refusal):
            return taken
        info = taken.info
        if entitlement is not None:
            info.entitlement = entitlement
        if prefix_hashes:
            info.prefix_hashes = prefix_hashes
        if slo_class is not None:
            info.slo_class = slo_class
        ticket = Ticket(taken)
        for h in self.hooks:
            h.on_arrival(taken.info, now)
        return ticket

    def fitted(
        self, ticket: Ticket, result: Compression, param: str = "messages"
    ) -> Refusal | None:
        """The exact count (and compression) the driver ran for `taken.fit_target`."""
        return self.intake.fitted(ticket.taken, result, param)

    # --- step 5 ---------------------------------------------------------------------
    def admit(self, ticket: Ticket, now: float) -> AdmissionRefused | None:
        return self._admitted(ticket, self.admitter.admit(ticket.info, now))

    @property
    def admission_awaits(self) -> bool:
        """The admitter keeps its state in a shared store (Redis, across replicas): the
        gateway awaits `admit_async` (one round trip) instead of calling `admit`."""
        return self.admitter.store is not None

    async def admit_async(self, ticket: Ticket, now: float) -> AdmissionRefused | None:
        """Step 5 against a shared store; an admitter without `admit_async` answers
        synchronously (the simulator always calls `admit`)."""
        admit_async = getattr(self.admitter, "admit_async", None)
        if admit_async is None:
            return self.admit(ticket, now)
        return self._admitted(ticket, await admit_async(ticket.info, now))

    def _admitted(
        self, ticket: Ticket, verdict: Reservation | AdmissionRefused | None
    ) -> AdmissionRefused | None:
        if verdict is None:
            return None  # admitted, nothing held
        if isinstance(verdict, AdmissionRefused):
            return verdict
        ticket.reservation = ticket.leases.take(verdict)
        return None

    # --- steps 6–7 ------------------------------------------------------------------
    def queued_behind(self, ticket: Ticket) -> bool:
        """Others already wait for one of its pools: it waits behind them (FIFO)."""
        d = self.dispatcher
        return len(d) > 0 and any(d.waiting(p) for p in ticket.pools)

    def route(self, ticket: Ticket, views: Views, exclude: Collection[str] = ()) -> Route | None:
        """The first of its pools (in placement's order) whose router finds a worker;
        None when no worker of any can take it now (none with room, or none healthy)."""
        info = ticket.info
        for i, pool in enumerate(ticket.pools):
            router = self.routers.get(pool)
            if router is None:
                router = self.routers[pool] = self.router_for(pool)
            candidates = views(pool)
            if exclude:
                candidates = [v for v in candidates if v.id not in exclude]
            chosen = router.choose(info, candidates)
            if chosen is not None:
                return Route(chosen, pool, i > 0)
        return None

    def wait(self, ticket: Ticket, now: float) -> Waiter | None:
        """Queue for room in any of its pools; None when the queue is full (refuse)."""
        waiter = self.dispatcher.wait(ticket.info, ticket.pools, now)
        if waiter is None:
            return None
        waiter.token = ticket
        ticket.waiter = waiter
        ticket.leases.take(QueuePosition(self.dispatcher, waiter))
        return waiter

    def dispatch(
        self, ticket: Ticket, worker: str, load: Load, now: float, tokens: int
    ) -> WorkerSlot:
        """Hold a slot on `worker` (its in-flight count and `tokens` of outstanding work)
        until the slot is released: by the driver when this attempt ends (a retry gives it
        back first), or by `complete`."""
        slot = ticket.leases.take(WorkerSlot(load, tokens, self._released))
        if self.track_prefill:
            # the load carries `prefill_tokens` whenever the driver turned tracking on
            on = self._prefilled if self.prefill_room else None
            if ticket.prefill is not None:
                ticket.prefill.release()  # a retry's earlier attempt
            ticket.prefill = ticket.leases.take(
                PrefillWork(load, ticket.info.prompt_tokens, on)  # type: ignore[arg-type]
            )
        for h in self.hooks:
            h.on_dispatch(ticket.info, worker, now)
        return slot

    def _released(self, load: Load) -> None:
        self.on_released(load)
        if self.prefill_room and not _has_room(load):
            return  # still full (its prefill backlog): its first tokens will wake
        self._wake(load.pool)

    def _prefilled(self, load: PrefillLoad) -> None:
        if _has_room(load):  # not still at max_num_seqs: a waiter can go now
            self._wake(load.pool)

    def _wake(self, pool: str) -> None:
        if len(self.dispatcher):
            waiter = self.dispatcher.wake(pool)
            if waiter is not None and isinstance(waiter.token, Ticket):
                self.on_woken(waiter.token)

    # --- step 9 ---------------------------------------------------------------------
    def first_token(self, ticket: Ticket, now: float) -> None:
        self.answered(ticket, now)
        for h in self.hooks:
            h.on_first_token(ticket.info, now)

    def answered(self, ticket: Ticket, now: float) -> None:
        """The engine answered but no first token was seen: a whole (non-streamed) answer,
        which arrives with its last token. Its prompt leaves the backlog and the
        dispatcher counts the service, but hooks hear no first token: the time to it is
        the whole answer's, not a prefill, and QUARTZ's calibration must not learn it."""
        prefill = ticket.prefill
        if prefill is not None:
            ticket.prefill = None
            prefill.release()  # out of the backlog (and, with a prefill room, room frees)
        self.dispatcher.served(ticket.info, now)

    def complete(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        """Settle once: learn from the engine's count, settle the reservation, release
        every lease, tell the hooks. A second call does nothing."""
        if ticket.completed:
            return
        ticket.completed = True
        try:
            if outcome.status is Status.OK and outcome.prompt_tokens:
                self.intake.learn(ticket.taken, outcome.prompt_tokens)
            if ticket.reservation is not None:
                ticket.reservation.settle(outcome, now)
        finally:
            ticket.leases.release()
        for h in self.hooks:
            h.on_complete(ticket.info, outcome, now)

    def abandon(self, ticket: Ticket) -> None:
        """Release what a request holds without an outcome (it never reached the hooks'
        knowledge, or the driver is being torn down)."""
        ticket.completed = True
        ticket.leases.release()
