"""The pipeline core's state machine (policies/core.py): whatever happens to requests, in
whatever order — arrive, be admitted or refused, sent, wait for room, be woken, first
token, complete, disconnect, fail and be retried on another worker, be refused by an engine
for its context and placed again, time out in the queue — every count a request took
comes back to zero (worker slots, outstanding tokens, prefill backlogs, admission seats,
queue positions), and each placed request's hooks hear exactly one on_complete, after its
on_arrival. The test drives the real machine: it reports events (`Core.on`) and carries
out nothing but what the core says."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.actions import PROCEED, Action, Fail, Refuse, Send, Wait
from policies.admission import ConcurrencyAdmitter, ConcurrencyConfig
from policies.budget import BudgetConfig, BudgetEstimator, ChatSize
from policies.clock import ManualClock
from policies.core import Core
from policies.dispatch import attach_clock, make_dispatcher
from policies.events import DEADLINE, FIRST_TOKEN, ContextRefused, Finished, Request, UpstreamFailed
from policies.intake import CHAT, Intake, Prompt
from policies.pools import make_placement
from policies.quantile.config import QuartzSettings, build_predictor
from policies.quantile.predictor import attach
from policies.routing import Router, make_router
from policies.ticket import Ticket
from policies.types import Outcome, PoolSpec, Status, WorkerView
from tests.hook_events import Events

POOLS = [PoolSpec("short", 8192, frozenset({"m"})), PoolSpec("long", 65536, frozenset({"m"}))]


class World:
    """Two pools of two workers with room for two each (and, with `quartz`, a prefill room
    of 30,000 tokens, QUARTZ's router, queue and predictor), bound to the real state
    machine as a driver binds it. The test only reports events and remembers what the
    core last told it of each request (sent, waiting, or over): every decision is the
    core's."""

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
            Intake(make_placement("short_long", "short", 8192), BudgetEstimator(BudgetConfig())),
            router,
            self.admitter,
            queue,
            (self.events, self.predictor) if quartz else (self.events,),
            on_action=self.carry_out,
            views=self.views.__getitem__,
            load_of=self.by_id.__getitem__,
            clock=self.clock,
            track_prefill=quartz,
            prefill_room=quartz,
        )
        self.sent: dict[str, Send] = {}  # the current attempt, by request
        self.waiting: dict[str, Ticket] = {}
        self.tickets: dict[str, Ticket] = {}  # started and not finished
        self.first: set[str] = set()  # had a first token

    def carry_out(self, action: Action) -> None:
        """What the core said of a request: remembered; a refusal or a failure is
        answered, and the driver reports the request over."""
        if action is PROCEED:
            return
        ticket = action.ticket  # type: ignore[union-attr]
        assert ticket is not None
        rid = ticket.info.id
        self.waiting.pop(rid, None)
        self.sent.pop(rid, None)
        if isinstance(action, Send):
            self.sent[rid] = action
            self.first.discard(rid)  # a new attempt prefills again
        elif isinstance(action, Wait):
            self.waiting[rid] = ticket
        else:
            assert isinstance(action, Refuse | Fail), action
            self.finish(ticket, Status.ERROR)

    def finish(self, ticket: Ticket, status: Status) -> None:
        rid = ticket.info.id
        self.waiting.pop(rid, None)
        self.sent.pop(rid, None)
        self.tickets.pop(rid, None)
        self.core.on(ticket, Finished(Outcome(status, prompt_tokens=100)), self.clock.now())


OPS = ("arrive", "first_token", "complete", "error", "disconnect", "retry", "timeout", "context")
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
        now = w.clock.now()
        live = sorted(w.tickets)
        if kind == "arrive":
            n += 1
            prompt = Prompt(CHAT, "m", ChatSize(size * 4, 1), 64, exact_tokens=size)
            action = core.start(Request(prompt, f"r{n}", POOLS, entitlement=f"e{pick % 2}"), now)
            ticket = action.ticket  # type: ignore[union-attr]
            assert ticket is not None  # every size fits the long pool
            w.tickets[ticket.info.id] = ticket
            w.carry_out(action)  # sent, waiting, or refused (429: still one on_complete)
        elif not live:
            continue
        else:
            ticket = w.tickets[live[pick % len(live)]]
            rid = ticket.info.id
            if kind == "first_token" and rid in w.sent:
                core.on(ticket, FIRST_TOKEN, now)
                w.first.add(rid)
            elif kind == "retry" and rid in w.sent:
                w.carry_out(core.on(ticket, UpstreamFailed("connect", retryable=True), now))
            elif kind == "context" and rid in w.sent:
                sent = w.sent[rid]
                refused = core.on(
                    ticket, ContextRefused(8192 if sent.pool == "short" else 65536), now
                )
                if refused is PROCEED:  # nowhere longer: the engine's 400 is the answer
                    w.finish(ticket, Status.ERROR)
                else:
                    w.carry_out(refused)
            elif kind == "timeout" and rid in w.waiting:
                w.carry_out(core.on(ticket, DEADLINE, now))  # 503 queue_timeout
            elif kind in ("complete", "error", "disconnect"):
                status = {"complete": Status.OK, "error": Status.ERROR}.get(kind, Status.DISCONNECT)
                w.finish(ticket, status)
                core.on(ticket, Finished(Outcome(status)), now)  # a second exit: no effect
        # invariants at every step: counts are exactly what live requests hold
        for v in w.by_id.values():
            mine = [s.slot for s in w.sent.values() if s.load is v]
            assert v.in_flight == len(mine) <= v.capacity  # type: ignore[operator]
            assert v.outstanding_tokens == sum(s.tokens for s in mine)
            if quartz:  # prompts sent here with no first token yet, and Ŵ(w) their means
                prefilling = [r for r, s in w.sent.items() if s.load is v and r not in w.first]
                assert v.prefill_tokens == sum(w.tickets[r].info.prompt_tokens for r in prefilling)
                assert w.predictor.backlog(v.id) >= 0
        assert len(core.dispatcher) == len(w.waiting)
        assert sum(w.admitter.in_flight.values()) == len(w.tickets)
    for ticket in list(w.tickets.values()):
        w.finish(ticket, Status.DISCONNECT)
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
