"""The pipeline core (policies/core.py): whatever happens to requests, in whatever order —
arrive, admit, dispatch, wait for room, be woken, first token, complete, disconnect, retry
on another worker, time out in the queue — every count a request took comes back to zero
(worker slots, outstanding tokens, admission seats, queue positions), and each placed
request's hooks hear exactly one on_complete, after its on_arrival."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.admission import ConcurrencyAdmitter, ConcurrencyConfig
from policies.budget import BudgetConfig, ChatSize, TokenBudget
from policies.clock import ManualClock
from policies.core import Core, Ticket
from policies.dispatch import attach_clock, make_dispatcher
from policies.intake import CHAT, Intake, Prompt
from policies.leases import WorkerSlot
from policies.pools import make_placement
from policies.quantile.config import QuartzSettings, build_predictor
from policies.quantile.predictor import attach
from policies.routing import Router, make_router
from policies.types import Outcome, PoolSpec, Status, WorkerView
from tests.hook_events import Events

POOLS = [PoolSpec("short", 8192, frozenset({"m"})), PoolSpec("long", 65536, frozenset({"m"}))]


class World:
    """A driver in miniature: two pools of two workers with room for two each (and, with
    `quartz`, a prefill room of 30,000 tokens, QUARTZ's router, queue and predictor)."""

    def __init__(
        self, dispatcher: str = "fifo", quartz: bool = False, params: dict | None = None
    ) -> None:
        room = 30_000 if quartz else None
        self.views = {
            p.name: [
                WorkerView(
                    f"{p.name}{i}", p.name, p.max_model_len, capacity=2, prefill_capacity=room
                )
                for i in range(2)
            ]
            for p in POOLS
        }
        self.by_id = {v.id: v for vs in self.views.values() for v in vs}
        self.events = Events()
        self.admitter = ConcurrencyAdmitter(ConcurrencyConfig(limit=5))
        self.predictor = build_predictor(QuartzSettings(min_samples=2), None)
        self.predictor.view_of = self.by_id.get

        def router(pool: str) -> Router:
            r = make_router("quartz" if quartz else "least_loaded")
            attach(r, self.predictor)
            return r

        queue = make_dispatcher(dispatcher, {"max_waiting": 4, "timeout_s": 10.0, **(params or {})})
        attach(queue, self.predictor)
        self.clock = ManualClock()  # moved by the test: QUARTZ's wait bound reads it
        attach_clock(queue, self.clock)
        self.core = Core(
            Intake(make_placement("short_long", "short", 8192), TokenBudget(BudgetConfig())),
            router,
            self.admitter,
            queue,
            (self.events, self.predictor) if quartz else (self.events,),
            on_woken=self.woken,
            track_prefill=quartz,
            prefill_room=quartz,
        )
        self.slots: dict[str, WorkerSlot] = {}  # the current attempt's, by request
        self.tickets: dict[str, Ticket] = {}
        self.waiting: dict[str, Ticket] = {}
        self.first: set[str] = set()  # had a first token

    def dispatch(self, ticket: Ticket, exclude: frozenset[str] = frozenset()) -> bool:
        route = self.core.route(ticket, lambda p: self.views[p], exclude)
        if route is None:
            return False
        v = self.by_id[route.worker.id]
        self.first.discard(ticket.info.id)  # a new attempt prefills again
        self.slots[ticket.info.id] = self.core.dispatch(
            ticket, v.id, v, 0.0, ticket.info.total_tokens
        )
        return True

    def woken(self, ticket: Ticket) -> None:
        self.waiting.pop(ticket.info.id, None)
        if not self.dispatch(ticket):
            self.wait(ticket)

    def wait(self, ticket: Ticket) -> None:
        if self.core.wait(ticket, 0.0) is None:
            self.end(ticket, Status.ERROR)  # queue full: refused
        else:
            self.waiting[ticket.info.id] = ticket

    def end(self, ticket: Ticket, status: Status) -> None:
        rid = ticket.info.id
        self.waiting.pop(rid, None)
        self.slots.pop(rid, None)
        self.tickets.pop(rid, None)
        self.core.complete(ticket, Outcome(status, prompt_tokens=100), 0.0)


OPS = ("arrive", "first_token", "complete", "error", "disconnect", "retry", "timeout")
op = st.tuples(st.sampled_from(OPS), st.integers(0, 1_000), st.integers(100, 20_000))


SETUPS = [
    ("fifo", False, None),
    ("quartz", True, None),
    ("token_fair", True, None),
    ("fifo", True, None),
    # the wait bound: the clock moves 0.3 s an operation, so waiters age within a few
    ("quartz", True, {"wait_bound_s": 1.0}),
]


@pytest.mark.parametrize(("dispatcher", "quartz", "params"), SETUPS)
@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op, max_size=120))
def test_any_interleaving_leaves_every_count_at_zero(dispatcher, quartz, params, ops):
    w = World(dispatcher, quartz, params)
    core = w.core
    n = 0
    for kind, pick, size in ops:
        w.clock.advance(0.3)
        live = sorted(w.tickets)
        if kind == "arrive":
            n += 1
            prompt = Prompt(CHAT, "m", ChatSize(size * 4, 1), 64, exact_tokens=size)
            ticket = core.arrive(prompt, f"r{n}", 0.0, POOLS, entitlement=f"e{pick % 2}")
            assert isinstance(ticket, Ticket)
            if core.admit(ticket, 0.0) is not None:
                w.end(ticket, Status.ERROR)  # 429: still one on_complete
                continue
            w.tickets[ticket.info.id] = ticket
            if core.queued_behind(ticket) or not w.dispatch(ticket):
                w.wait(ticket)
        elif not live:
            continue
        else:
            ticket = w.tickets[live[pick % len(live)]]
            rid = ticket.info.id
            if kind == "first_token" and rid in w.slots:
                core.first_token(ticket, 0.0)
                w.first.add(rid)
            elif kind == "retry" and rid in w.slots:
                old = w.slots.pop(rid)
                old.release()  # the failed attempt's worker is given back first
                if not w.dispatch(ticket, frozenset({old.load.id})):  # type: ignore[attr-defined]
                    w.end(ticket, Status.ERROR)
            elif kind == "timeout" and rid in w.waiting:
                w.end(ticket, Status.ERROR)  # expired in the queue (503)
            elif kind in ("complete", "error", "disconnect"):
                status = {"complete": Status.OK, "error": Status.ERROR}.get(kind, Status.DISCONNECT)
                w.end(ticket, status)
                core.complete(ticket, Outcome(status), 0.0)  # a second exit path: no effect
        # invariants at every step: counts are exactly what live requests hold
        for v in w.by_id.values():
            mine = [s for r, s in w.slots.items() if s.load is v]
            assert v.in_flight == len(mine) <= v.capacity  # type: ignore[operator]
            assert v.outstanding_tokens == sum(s.tokens for s in mine)
            if quartz:  # prompts sent here with no first token yet, and Ŵ(w) their means
                prefilling = [r for r, s in w.slots.items() if s.load is v and r not in w.first]
                assert v.prefill_tokens == sum(w.tickets[r].info.prompt_tokens for r in prefilling)
                assert w.predictor.backlog(v.id) >= 0
        assert len(core.dispatcher) == len(w.waiting)
        assert sum(w.admitter.in_flight.values()) == len(w.tickets)
    for ticket in list(w.tickets.values()):
        w.end(ticket, Status.DISCONNECT)
    assert all(v.in_flight == 0 and v.outstanding_tokens == 0 for v in w.by_id.values())
    assert all(v.prefill_tokens == 0 for v in w.by_id.values())
    assert len(w.predictor) == 0 and not w.predictor._backlog
    assert len(core.dispatcher) == 0 and w.admitter.in_flight == {}
    # hooks: one arrival and one completion per placed request, in that order
    per = Counter(e.split(":")[0] for _, e in w.events.seen)
    assert per["arrival"] == per["complete"] == n
    first: dict[str, str] = {}
    last: dict[str, str] = {}
    for rid, e in w.events.seen:
        first.setdefault(rid, e)
        last[rid] = e.split(":")[0]
    assert set(first.values()) == {"arrival"} or n == 0
    assert set(last.values()) <= {"complete"}
