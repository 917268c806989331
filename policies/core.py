"""The request pipeline's core: a sans-I/O state machine per request, the same in both drivers.

A driver hands the core a request (`start`) and then only reports what it observed
(`on(ticket, event)`, events in policies/events.py); the core answers each time with the
one thing to do next (an action, policies/actions.py). Every decision is the core's; the
drivers only carry actions out — the gateway (gateway/proxy.py) over HTTP in real time,
the simulator (simulator/driver.py) over its kernel and engine model in virtual time.

    start(request)                 estimate + place (policies/intake.py)
                                     → Refuse(404/413)          policies never hear of it
                                   … hooks.on_arrival
                                     → Fit(target)              count exactly / compress first
    on Fitted(result)                → Refuse(413) | admission
    admission                      the admitter's reservation (a lease); with a shared
                                   store → Admit, answered by on Admitted(verdict)
                                     → Refuse(429; 403 inactive entitlement)
                                     (a grant that names preemptible holds → Evict for
                                     those requests, through `on_action`)
    place                          route (one router per pool, over the driver's `views`)
                                     → Send(worker, slot)       … hooks.on_dispatch
                                   none with room, some healthy → Wait(deadline); FIFO:
                                   behind others already waiting → Wait
                                   none healthy → Refuse(503 no_healthy_worker)
                                   queue full → Refuse(429 queue_full)
    wake (a slot freed)            place again → Send | Wait (no room after all: again),
                                   given through `on_action`
    on DEADLINE                      → Refuse(503 queue_timeout)
    on FIRST_TOKEN                 the prefill lease goes back; the dispatcher hears
                                   `served`                    … hooks.on_first_token
    on WHOLE_ANSWER                the same for a whole answer (no hook: its time is
                                   not a prefill)
    on ANSWERED                    the worker's breaker hears a success (log: close, when
                                   it closes a circuit that had opened)
    on UpstreamFailed              the breaker hears a failure (log: open, when it opens
                                   the circuit: out of routing for `open_s`); the retry policy
                                   (policies/retry.py) → Send to another worker (log:
                                   retry) | Fail
    on HANDED_OFF (a `pd` pool)    the prefill slot goes back (the prefill's breaker hears a
                                   success) → SendDecode (vLLM) | PROCEED (SGLang: the decode
                                   call is out already)
    on ContextRefused              once: re-placed through the placement policy on the
                                   longer pools (log: replace) → Send | Wait | Refuse;
                                   else PROCEED (the engine's 400 goes to the client)
    on Finished(outcome)           settle: ĉ_k learns, the admitter settles, every lease is
                                   released once               … hooks.on_complete

A `dp_group` pool (policies/dp_group.py: G data-parallel ranks stepping in lockstep) is
decided differently after admission: the request waits in the group's holding pool, and
the group's assignment policy (policies/assign/) chooses which pooled requests fill which
free slots, on every arrival and every completion (a seat given back):

    admitted, dp_group pool        into the holding pool; the policy decides
                                     → Send(worker, rank=g)     it was assigned now (log:
                                                                 send pool/worker#g)
                                     → Wait(deadline)           still pooled
                                   other requests it assigned → Send, through `on_action`
                                   pool full → Refuse(429 queue_full)
    a seat given back (Finished)   the policy decides again → Send through `on_action`
    on Streamed(generated)         the rank's load L_g follows the streamed tokens (exact: the
                                   engine's usage at the end, which also teaches the
                                   group's decode rate for whole answers)
    on DEADLINE (still pooled)       → Refuse(503 queue_timeout)
    on UpstreamFailed              → Fail (a rank is never retried elsewhere: the
                                   decision was the group's)

A `pd` pool (policies/pd/) is routed by its pair selector instead of a router: `place`
answers `SendPair` with two slots taken, a prefill and a decode one. A failure names its
side: before the client saw a byte, the retry policy may send the whole pair again (the
failed worker excluded, both slots of the failed attempt given back first) → SendPair |
Fail; after it (a decode that failed mid-answer) → Fail. A prefill failure after the
hand-off changes nothing (the decode's answer stands).

Nobody counts a worker's load, a queue position or a reservation by hand: everything a
request takes is a lease in `Ticket.leases`, and `Finished` releases them all, exactly once,
on every path (an answer, an engine error, a client gone, a retry, a timeout, an eviction).

Each step is a registered policy chosen by configuration (`placement.policy`,
`admission.policy`, `dispatch.policy`, `routing.policy`); one router instance per pool, so
a router's state (a round-robin turn, a seeded RNG) is the pool's own in both drivers.
The core is built once for both drivers by `policies.build.build_core`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from compressor.compress import Compression
from policies.actions import (
    PROCEED,
    Action,
    Admit,
    Evict,
    Fail,
    Fit,
    Refuse,
    Send,
    SendDecode,
    SendPair,
    Wait,
)
from policies.admission import AdmissionRefused, AdmitAll, Admitter, Reservation
from policies.assign import PooledRequest
from policies.clock import Clock, ManualClock
from policies.dispatch import Dispatcher, FifoDispatcher, QueuePosition, Waiter
from policies.dp_group import DpGroup, Pooled, Seat
from policies.events import (
    ANSWERED,
    FIRST_TOKEN,
    HANDED_OFF,
    WHOLE_ANSWER,
    Admitted,
    ContextRefused,
    Deadline,
    Event,
    Finished,
    Fitted,
    Request,
    Streamed,
    UpstreamFailed,
)
from policies.health import Breaker
from policies.hooks import Hook
from policies.intake import Intake, Placed, Refusal
from policies.leases import Load, PrefillLoad, PrefillWork, WorkerSlot
from policies.pd import PdLeg, PdPool
from policies.retry import RetryPolicy
from policies.routing import Router
from policies.ticket import Ticket
from policies.types import Outcome, Status, WorkerView

Views = Callable[[str], Sequence[WorkerView]]  # a pool's workers as routing sees them now
ActionRecorder = Callable[[str, str, str], object]  # (request id, what, detail)
A = TypeVar("A")

# admission refusals a retry cannot cure (the entitlement is not bound, or there is none):
# 403 with these codes; every other admission refusal is a 429 with Retry-After
INACTIVE = {
    "entitlement_state": "entitlement_inactive",
    "unknown_entitlement": "unknown_entitlement",
}


def _nobody(load: Load) -> None:
    pass


def _no_action(action: Action) -> None:
    pass


def _no_views(pool: str) -> Sequence[WorkerView]:
    return ()


def _no_load(worker: str) -> Load:
    raise LookupError(f"no driver bound to the core: worker {worker!r}")


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
    # an action for a request other than the one reported on: a wake (Send, or Wait
    # again), an eviction (Evict). The driver carries it out for that request.
    on_action: Callable[[Action], object] = _no_action
    views: Views = _no_views  # the driver's workers of a pool, as routing sees them now
    load_of: Callable[[str], Load] = _no_load  # the driver's object a worker slot counts on
    clock: Clock = field(default_factory=ManualClock)  # the time of a wake
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    breaker: Breaker | None = None  # None: the driver's workers keep no breaker state
    log: ActionRecorder | None = None  # what the core decided (policies.actions.ActionLog)
    routers: dict[str, Router] = field(default_factory=dict)
    # count each dispatched prompt in its worker's prefill backlog until its first token
    # (`WorkerView.prefill_tokens`): on when a prefill room is configured or QUARTZ's
    # features are wanted; off, the default path takes no extra lease
    track_prefill: bool = False
    # a first token frees room (`dispatch.prefill_room`): wake a waiter of the pool then
    prefill_room: bool = False
    # dp_group pools by name (policies/dp_group.py): their requests are assigned to ranks
    groups: dict[str, DpGroup] = field(default_factory=dict)
    pd_pools: dict[str, PdPool] = field(default_factory=dict)  # the `pd` pools, by name
    _evictable: dict[str, Ticket] = field(default_factory=dict)  # by hold

    # === the state machine ===========================================================
    def start(self, request: Request, now: float) -> Action:
        """A new request: placed, then Fit, Admit, Send, Wait or Refuse."""
        placed = self.intake.take(request.prompt, request.id, now, request.pools, request.healthy)
        if isinstance(placed, Refusal):
            if placed.kind == "no_model":
                refused = Refuse(None, 404, "model_not_found", placed.reason, param="model")
            else:
                refused = Refuse(
                    None, 413, "too_long", placed.reason, param=placed.param, limit=placed.limit
                )
            refused.info = placed.info
            return self._emit(request.id, refused)
        ticket = self._placed(placed, request, now)
        if placed.fit_target is not None:
            return self._emit(request.id, Fit(ticket, placed.fit_target))
        return self._admission(ticket, now)

    def on(self, ticket: Ticket, event: Event, now: float) -> Action:
        """What the driver observed; the next thing to do."""
        # every request's events first (identity tests are the cheapest): the hot path
        if event is FIRST_TOKEN:
            self.first_token(ticket, now)
            return PROCEED
        if event is WHOLE_ANSWER:
            self.answered(ticket, now)
            return PROCEED
        if event is ANSWERED:
            slot = ticket.slot
            if self.breaker is not None and slot is not None:
                # the load is the driver's worker state (BreakerState): WorkerState, SimWorkerView
                closed = self.breaker.succeeded(slot.load)  # type: ignore[arg-type]
                if closed and self.log is not None:
                    self.log(ticket.info.id, "close", ticket.worker)
            return PROCEED
        if event is HANDED_OFF:
            return self._handed_off(ticket, now)
        if isinstance(event, Finished):
            if not ticket.completed and self.log is not None:
                self.log(ticket.info.id, "done", event.outcome.status.value)
            self.complete(ticket, event.outcome, now)
            return PROCEED
        if isinstance(event, Streamed):
            seat = ticket.dp
            if isinstance(seat, Seat):
                group = seat.group
                if event.exact:
                    group.reconcile(seat.key, seat.rank, event.generated, event.prompt_tokens, now)
                else:
                    group.progress(seat.key, seat.rank, event.generated, event.prompt_tokens)
            return PROCEED
        if isinstance(event, Fitted):
            refusal = self.fitted(ticket, event.result, event.param)
            if refusal is not None:
                return self._refuse(ticket, 413, "too_long", refusal.reason, param=refusal.param)
            return self._admission(ticket, now)
        if isinstance(event, Admitted):
            return self._admitted(ticket, event.verdict, now)
        if isinstance(event, UpstreamFailed):
            return self._failed(ticket, event, now)
        if isinstance(event, ContextRefused):
            return self._context_refused(ticket, event.max_model_len, now)
        if isinstance(event, Deadline):
            waiter = ticket.waiter
            if waiter is None or waiter.done:
                return PROCEED  # woken just before: the wake's action stands
            self._unqueue(ticket, waiter)
            return self._refuse(
                ticket,
                503,
                "queue_timeout",
                "no worker had room in time",
                retry_after=waiter.deadline - waiter.since,
            )
        raise TypeError(f"not an event: {event!r}")

    def evict(self, holds: Collection[str]) -> None:
        """Cancel the requests holding `holds` (a grant here, or through the shared
        store's notices on another replica, gave their capacity to a protected class):
        each gets `Evict` through `on_action`; a hold whose request has ended is skipped."""
        for hold in holds:
            ticket = self._evictable.pop(hold, None)
            if ticket is None or ticket.completed:
                continue
            waiter = ticket.waiter
            if waiter is not None and not waiter.done:
                self._unqueue(ticket, waiter)
            self.on_action(self._emit(ticket.info.id, Evict(ticket)))

    def prompt_sent(self, ticket: Ticket) -> int:
        """The prompt tokens the engine is sent: the compressed count, or the original."""
        known = ticket.request.known_prompt_tokens if ticket.request is not None else None
        if known is None:
            return ticket.info.prompt_tokens
        c = ticket.placed.compression
        return known if c is None or ticket.context_retried else c.tokens_after

    # --- the machine's steps ----------------------------------------------------------
    def _placed(self, placed: Placed, request: Request, now: float) -> Ticket:
        info = placed.info
        if request.entitlement is not None:
            info.entitlement = request.entitlement
        if request.prefix_hashes:
            info.prefix_hashes = request.prefix_hashes
        if request.slo_class is not None:
            info.slo_class = request.slo_class
        if request.temperature != 1.0 or request.top_p != 1.0:
            info.temperature, info.top_p = request.temperature, request.top_p
        if request.session:
            info.session = request.session
        if request.router_temperature is not None or request.overlap_weight is not None:
            info.router_temperature = request.router_temperature
            info.overlap_weight = request.overlap_weight
        ticket = Ticket(placed, request)
        for h in self.hooks:
            h.on_arrival(info, now)
        return ticket

    def _admission(self, ticket: Ticket, now: float) -> Action:
        if self.admitter.store is not None and hasattr(self.admitter, "admit_async"):
            return self._emit(ticket.info.id, Admit(ticket))
        # (`ticket.placed.info`, not the `info` property, on the per-request path: one call less)
        return self._admitted(ticket, self.admitter.admit(ticket.placed.info, now), now)

    def _admitted(
        self, ticket: Ticket, verdict: Reservation | AdmissionRefused | None, now: float
    ) -> Action:
        if isinstance(verdict, AdmissionRefused):
            ticket.admission = verdict.code
            inactive = INACTIVE.get(verdict.code)
            if inactive is not None:
                return self._refuse(ticket, 403, inactive, verdict.reason)
            return self._refuse(
                ticket, 429, verdict.code, verdict.reason, retry_after=verdict.retry_after
            )
        ticket.admission = "admitted"
        if verdict is not None:
            ticket.reservation = ticket.leases.take(verdict)
            # token pools: a grant may name preemptible holds to evict for it, and a
            # preemptible grant may itself be evicted later
            evict = getattr(verdict, "evict", ())
            if getattr(verdict, "evictable", False):
                ticket.hold = hold = verdict.hold  # type: ignore[attr-defined]
                self._evictable[hold] = ticket
            if evict:
                self.evict(evict)
        if self.groups:
            group = self.groups.get(ticket.pools[0])
            if group is not None:
                return self._pool(ticket, group, now)
        # (`queued_behind`'s first test here: an empty queue, the common case, calls nothing)
        if len(self.dispatcher) > 0 and self.queued_behind(ticket):
            return self._wait(ticket, now)  # first come, first served
        return self._place(ticket, now)

    # --- dp_group pools ---------------------------------------------------------------
    def _pool(self, ticket: Ticket, group: DpGroup, now: float) -> Action:
        """Into the group's holding pool; the policy decides at once (this request, and
        any others it assigns now: those through `on_action`)."""
        info = ticket.info
        pooled = PooledRequest(info.id, self.prompt_sent(ticket), now, info.max_tokens)
        if not group.hold(pooled, ticket, whole=not info.stream):
            return self._refuse(
                ticket,
                429,
                "queue_full",
                "the data-parallel group's holding pool is full",
                retry_after=1.0,
            )
        ticket.dp = ticket.leases.take(Pooled(group, info.id))
        ticket.waiter = Waiter(
            info.id, (group.pool,), now, now + group.spec.timeout_s, token=ticket, request=info
        )
        mine: Action | None = None
        for action in self._assign(group, now):
            if action.ticket is ticket:
                mine = action
            else:
                self.on_action(action)
        if mine is not None:
            return mine
        return self._emit(info.id, Wait(ticket, ticket.waiter))

    def _seat_freed(self, group: DpGroup) -> None:
        """A request left its rank: the policy decides again, for requests that wait."""
        if group.pooled:
            for action in self._assign(group, self.clock.now()):
                self.on_action(action)

    def _assign(self, group: DpGroup, now: float) -> list[Send | Refuse]:
        """The policy's decision as actions: each assigned request's slot is taken on
        the worker serving its rank (the rank's own endpoint when the pool lists one per
        rank, else the one endpoint with the engine's rank selector)."""
        decided = group.decide(now)
        if not decided:
            return []
        workers = self.views(group.pool)
        per_rank = len(workers) == group.spec.ranks
        out: list[Send | Refuse] = []
        for a in decided:
            ticket = a.token
            assert isinstance(ticket, Ticket)
            info = ticket.info
            waiter = ticket.waiter
            if waiter is not None:
                waiter.done = True
            pooled = ticket.dp
            if isinstance(pooled, Pooled):
                pooled.released = True  # the group took it out of the pool itself
            if not workers:
                group.leave(info.id, a.rank)
                out.append(
                    self._refuse(ticket, 503, "no_healthy_worker", "the group has no endpoint")
                )
                continue
            worker = (workers[a.rank] if per_rank else workers[0]).id
            load = self.load_of(worker)
            tokens = self.prompt_sent(ticket) + info.max_tokens
            slot = self.dispatch(ticket, worker, load, now, tokens)
            ticket.slot, ticket.worker, ticket.pool, ticket.rank = slot, worker, group.pool, a.rank
            ticket.dp = ticket.leases.take(Seat(group, info.id, a.rank, self._seat_freed))
            if self.log is not None:
                self.log(info.id, "send", f"{group.pool}/{worker}#{a.rank}")
            out.append(Send(ticket, worker, group.pool, load, slot, rank=a.rank))
        return out

    def _unqueue(self, ticket: Ticket, waiter: Waiter) -> None:
        """Out of the wait queue, or out of a dp_group's holding pool."""
        pooled = ticket.dp
        if isinstance(pooled, Pooled):
            waiter.done = True
            pooled.release()
        else:
            self.dispatcher.cancel(waiter)

    def _place(self, ticket: Ticket, now: float) -> Action:
        """Route; or wait for room when every healthy worker is full; or refuse."""
        send = self._send(ticket, now)
        if send is not None:
            return send
        if not self._routable(ticket):
            return self._refuse(ticket, 503, "no_healthy_worker", "no healthy worker in its pools")
        return self._wait(ticket, now)

    def _routable(self, ticket: Ticket) -> bool:
        """A healthy worker not tried yet in one of its pools (a `pd` pool: one of each
        role), so waiting for room may end in a send."""
        tried = ticket.tried
        views = self.views
        for pool in ticket.pools:
            pd = self.pd_pools.get(pool)
            if pd is not None:
                if pd.routable(views(pool), tried):
                    return True
            elif any(v.healthy and v.id not in tried for v in views(pool)):
                return True
        return False

    def _send(self, ticket: Ticket, now: float) -> Send | SendPair | None:
        """The first of its pools (in placement's order) whose router finds a worker:
        its slot taken now; None when no worker of any can take it."""
        info = ticket.placed.info
        tried = ticket.tried
        views = self.views
        routers = self.routers
        pools = ticket.placed.pools
        pd_pools = self.pd_pools
        for pool in pools:
            if pd_pools:
                pd = pd_pools.get(pool)
                if pd is not None:
                    pair = self._send_pair(ticket, pd, now)
                    if pair is not None:
                        return pair
                    continue
            router = routers.get(pool)
            if router is None:
                router = routers[pool] = self.router_for(pool)
            candidates = views(pool)
            if tried:
                candidates = [v for v in candidates if v.id not in tried]
            chosen = router.choose(info, candidates)
            if chosen is not None:
                break
        else:
            return None
        worker = chosen.id
        load = self.load_of(worker)
        request = ticket.request
        if request is None or request.known_prompt_tokens is None:
            tokens = info.prompt_tokens + info.max_tokens
        else:
            tokens = self.prompt_sent(ticket) + info.max_tokens
        slot = self.dispatch(ticket, worker, load, now, tokens)
        ticket.slot, ticket.worker, ticket.pool = slot, worker, pool
        spilled = pool != pools[0]  # not the placement's first choice
        attempt = ticket.retries + ticket.context_retried
        send = Send(ticket, worker, pool, load, slot, spilled, attempt)
        if self.log is not None:
            self.log(info.id, "send", f"{pool}/{worker}")
        return send

    def _send_pair(self, ticket: Ticket, pd: PdPool, now: float) -> SendPair | None:
        """A `pd` pool: its selector's pair, both slots taken now (the prefill's: the
        prompt and the one token it samples; the decode's: the prompt's KV and every token
        it may generate); None when no pair can take it."""
        info = ticket.info
        tried = ticket.tried
        candidates = self.views(pd.name)
        if tried:
            candidates = [v for v in candidates if v.id not in tried]
        prefill, decode = pd.split(candidates)
        pair = pd.selector.select(info, prefill, decode)
        if pair is None:
            return None
        p, d = pair[0].id, pair[1].id
        request = ticket.request
        if request is None or request.known_prompt_tokens is None:
            prompt = info.prompt_tokens
        else:
            prompt = self.prompt_sent(ticket)
        p_load, d_load = self.load_of(p), self.load_of(d)
        leases = ticket.leases
        p_slot = leases.take(WorkerSlot(p_load, prompt + 1, self._released))
        d_slot = leases.take(WorkerSlot(d_load, prompt + info.max_tokens, self._released))
        work = None
        if self.track_prefill:
            on = self._prefilled if self.prefill_room else None
            work = leases.take(PrefillWork(p_load, prompt, on))  # type: ignore[arg-type]
        ticket.pd = PdLeg(p, d, p_slot, d_slot, work, pd.concurrent)
        ticket.slot, ticket.worker, ticket.pool = d_slot, d, pd.name
        for h in self.hooks:
            h.on_dispatch(info, p, now)  # the prompt's KV is computed (and cached) there
        for ph in pd.hooks:
            ph.on_pair(info, p, d, now)
        if self.log is not None:
            self.log(info.id, "send_pair", f"{pd.name}/{p}+{d}")
        attempt = ticket.retries + ticket.context_retried
        return SendPair(ticket, pd.name, pd.protocol, p, d, p_load, d_load, attempt)

    def _handed_off(self, ticket: Ticket, now: float) -> Action:
        """The prefill is done and its KV left: its slot goes back (the pool's pair hooks
        hear it); vLLM's decode call goes out now (SGLang's is out already)."""
        leg = ticket.pd
        if leg is None or leg.handed_off or ticket.completed:
            return PROCEED
        leg.hand_off()
        pd = self.pd_pools.get(ticket.pool)
        if pd is not None:
            for ph in pd.hooks:
                ph.on_handoff(ticket.info, leg.prefill, leg.decode, now)
        if self.breaker is not None:
            self.breaker.succeeded(leg.prefill_slot.load)  # type: ignore[arg-type]
        if self.log is not None:
            self.log(ticket.info.id, "handoff", leg.prefill)
        if leg.concurrent:
            return PROCEED
        return SendDecode(ticket, leg.decode, leg.decode_slot.load)

    def _pd_failed(self, ticket: Ticket, leg: PdLeg, event: UpstreamFailed, now: float) -> Action:
        """One call of a pair failed. Before the client saw a byte, the whole pair may go
        again (a new pair without the failed worker: the prefill's KV is lost with its
        attempt, and SGLang's room cannot be reused); after it, the answer fails."""
        prefill_side = event.side == "prefill"
        slot = leg.prefill_slot if prefill_side else leg.decode_slot
        if event.blames_worker and self.breaker is not None:
            self.breaker.failed(slot.load, now)  # type: ignore[arg-type]
        if prefill_side and leg.handed_off:
            return PROCEED  # the KV is on the decode already: its answer stands
        if not self.retry.again(ticket.retries, event.retryable, event.before_response):
            return self._emit(ticket.info.id, Fail(ticket))
        failed = leg.prefill if prefill_side else leg.decode
        ticket.retries += 1
        ticket.tried = (*ticket.tried, failed)
        if self.log is not None:
            self.log(
                ticket.info.id,
                "retry",
                f"{event.side} {event.kind} exclude={','.join(ticket.tried)}",
            )
        ticket.pd = None
        ticket.slot = None
        leg.release()  # the failed attempt's pair is given back first
        send = self._send(ticket, now)
        return send if send is not None else self._emit(ticket.info.id, Fail(ticket))

    def _wait(self, ticket: Ticket, now: float) -> Action:
        waiter = self.wait(ticket, now)
        if waiter is None:
            return self._refuse(
                ticket,
                429,
                "queue_full",
                "every worker is at capacity and the wait queue is full",
                retry_after=1.0,
            )
        return self._emit(ticket.info.id, Wait(ticket, waiter))

    def _failed(self, ticket: Ticket, event: UpstreamFailed, now: float) -> Action:
        leg = ticket.pd
        if leg is not None:
            return self._pd_failed(ticket, leg, event, now)
        slot = ticket.slot
        if slot is not None and event.blames_worker and self.breaker is not None:
            opened = self.breaker.failed(slot.load, now)  # type: ignore[arg-type]
            if opened and self.log is not None:
                self.log(ticket.info.id, "open", ticket.worker)
        if (
            slot is None
            or ticket.rank is not None
            or not self.retry.again(ticket.retries, event.retryable, event.before_response)
        ):
            return self._emit(ticket.info.id, Fail(ticket))
        ticket.retries += 1
        ticket.tried = (*ticket.tried, ticket.worker)
        if self.log is not None:
            self.log(ticket.info.id, "retry", f"{event.kind} exclude={','.join(ticket.tried)}")
        ticket.slot = None
        slot.release()  # the failed attempt's worker is given back first
        send = self._send(ticket, now)
        return send if send is not None else self._emit(ticket.info.id, Fail(ticket))

    def _context_refused(self, ticket: Ticket, max_model_len: int, now: float) -> Action:
        """The engine refused the prompt as too long for its context though placement had
        it fit (a compressed or short-pool request whose count was off for this engine):
        the first time, place it again — the original text, on the pools serving its
        model with a longer context — instead of passing the refusal on."""
        if (
            ticket.context_retried
            or ticket.request is None
            or ticket.rank is not None
            or ticket.pd is not None
        ):
            return PROCEED  # (a `pd` pool's refusal goes to the client as it is)
        replaced = self.intake.replace(ticket.placed, ticket.request.pools, max_model_len)
        if replaced is None:
            return PROCEED
        ticket.placed = replaced
        ticket.context_retried = True
        if self.log is not None:
            self.log(ticket.info.id, "replace", ",".join(replaced.pools))
        slot = ticket.slot
        if slot is not None:
            ticket.slot = None
            slot.release()
        return self._place(ticket, now)

    def _refuse(
        self,
        ticket: Ticket,
        status: int,
        code: str,
        reason: str,
        retry_after: float | None = None,
        param: str | None = None,
    ) -> Refuse:
        return self._emit(ticket.info.id, Refuse(ticket, status, code, reason, retry_after, param))

    def _emit(self, rid: str, action: A) -> A:
        log = self.log
        if log is not None:
            log(rid, *_described(action))
        return action

    # === the steps, one at a time (the machine composes these) =======================
    def fitted(
        self, ticket: Ticket, result: Compression, param: str = "messages"
    ) -> Refusal | None:
        """The exact count (and compression) the driver ran for `placed.fit_target`."""
        return self.intake.fitted(ticket.placed, result, param)

    def queued_behind(self, ticket: Ticket) -> bool:
        """Others already wait for one of its pools: it waits behind them (FIFO)."""
        d = self.dispatcher
        return len(d) > 0 and any(d.waiting(p) for p in ticket.pools)

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
        until the slot is released: when this attempt ends (a retry gives it back first),
        or by `complete`."""
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
        """Room freed in `pool`: the dispatcher's next waiter for it is placed again now,
        inside the release that freed the room (binding later left the room showing as
        free in between: a first token woke a second waiter for the same slot)."""
        if len(self.dispatcher):
            waiter = self.dispatcher.wake(pool)
            if waiter is not None:
                ticket = waiter.token
                if isinstance(ticket, Ticket) and not ticket.completed:
                    self.on_action(self._place(ticket, self.clock.now()))

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
        self.dispatcher.served(ticket.placed.info, now)

    def complete(self, ticket: Ticket, outcome: Outcome, now: float) -> None:
        """Settle once: learn from the engine's count, settle the reservation, release
        every lease, tell the hooks. A second call does nothing."""
        if ticket.completed:
            return
        ticket.completed = True
        if ticket.hold is not None:
            self._evictable.pop(ticket.hold, None)
        try:
            if outcome.status is Status.OK and outcome.prompt_tokens:
                self.intake.learn(ticket.placed, outcome.prompt_tokens)
            if ticket.reservation is not None:
                ticket.reservation.settle(outcome, now)
        finally:
            ticket.slot = None
            ticket.leases.release()
        for h in self.hooks:
            h.on_complete(ticket.info, outcome, now)


def _described(action: object) -> tuple[str, str]:
    """An action as the log's (what, detail): what both drivers must agree on."""
    if isinstance(action, Send):
        if action.rank is not None:
            return "send", f"{action.pool}/{action.worker}#{action.rank}"
        return "send", f"{action.pool}/{action.worker}"
    if isinstance(action, SendPair):
        return "send_pair", f"{action.pool}/{action.prefill}+{action.decode}"
    if isinstance(action, SendDecode):
        return "send_decode", action.worker
    if isinstance(action, Wait):
        return "wait", ""
    if isinstance(action, Refuse):
        return "refuse", f"{action.status} {action.code}"
    if isinstance(action, Fit):
        return "fit", str(action.target)
    return type(action).__name__.lower(), ""
