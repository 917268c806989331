"""A `pd` pool in the core's state machine (policies/core.py, policies/pd/): whatever
happens to requests, in whatever order — arrive, wait for a pair with room, be woken, the
hand-off, a first token, a failure of either side before or after the hand-off (retried
as a whole pair, or failed), a client gone before or after the hand-off, a late hand-off,
a queue timeout — every count comes back to zero and, at every step, each worker holds
exactly the slots of the live requests: a prefill slot only until the hand-off. The test
drives the real machine and carries out nothing but what the core says."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.actions import PROCEED, Action, Fail, Refuse, SendDecode, SendPair, Wait
from policies.budget import BudgetConfig, BudgetEstimator, ChatSize
from policies.clock import ManualClock
from policies.core import Core
from policies.dispatch import make_dispatcher
from policies.events import DEADLINE, FIRST_TOKEN, HANDED_OFF, Finished, Request, UpstreamFailed
from policies.intake import CHAT, Intake, Prompt
from policies.pd import PdPool, make_pair_selector
from policies.pools import make_placement
from policies.routing import make_router
from policies.ticket import Ticket
from policies.types import Outcome, PoolSpec, Status, WorkerView

POOLS = [PoolSpec("short", 8192, frozenset({"m"}))]


class World:
    def __init__(self, protocol: str, selector: str, track: bool) -> None:
        self.views = [
            WorkerView(w, "short", 8192, capacity=2, role=role)
            for w, role in (
                ("p0", "prefill"),
                ("p1", "prefill"),
                ("d0", "decode"),
                ("d1", "decode"),
            )
        ]
        self.by_id = {v.id: v for v in self.views}
        self.clock = ManualClock()
        self.core = Core(
            Intake(make_placement("short_long", "short", 8192), BudgetEstimator(BudgetConfig())),
            lambda pool: make_router("least_loaded"),
            dispatcher=make_dispatcher("fifo", {"max_waiting": 4, "timeout_s": 10.0}),
            on_action=self.carry_out,
            views=lambda pool: self.views,
            load_of=self.by_id.__getitem__,
            clock=self.clock,
            track_prefill=track,
            prefill_room=track,
        )
        self.core.pd_pools["short"] = PdPool("short", protocol, make_pair_selector(selector))
        self.tickets: dict[str, Ticket] = {}
        self.pairs: dict[str, SendPair] = {}  # the current attempt's pair
        self.handed: set[str] = set()  # handed off in the current attempt
        self.waiting: set[str] = set()

    def carry_out(self, action: Action) -> None:
        if action is PROCEED:
            return
        ticket = action.ticket  # type: ignore[union-attr]
        assert ticket is not None
        rid = ticket.info.id
        if isinstance(action, SendDecode):
            assert rid in self.pairs and action.worker == self.pairs[rid].decode
            return
        self.waiting.discard(rid)
        if isinstance(action, SendPair):
            self.pairs[rid] = action
            self.handed.discard(rid)
        elif isinstance(action, Wait):
            self.pairs.pop(rid, None)
            self.waiting.add(rid)
        else:
            assert isinstance(action, Refuse | Fail), action
            self.finish(ticket, Status.ERROR)

    def finish(self, ticket: Ticket, status: Status) -> None:
        rid = ticket.info.id
        self.pairs.pop(rid, None)
        self.handed.discard(rid)
        self.waiting.discard(rid)
        self.tickets.pop(rid, None)
        self.core.on(ticket, Finished(Outcome(status, prompt_tokens=100)), self.clock.now())


OPS = (
    "arrive",
    "handoff",
    "first_token",
    "complete",
    "disconnect",
    "prefill_fails",
    "prefill_refused",
    "decode_fails",
    "decode_dies",
    "timeout",
    "late_handoff",
)
op = st.tuples(st.sampled_from(OPS), st.integers(0, 1_000), st.integers(50, 4_000))


@pytest.mark.parametrize(
    ("protocol", "selector", "track"),
    [
        ("vllm", "kv_cost_decode_load", False),
        ("sglang", "kv_cost_decode_load", True),
        ("vllm", "round_robin", True),
        ("sglang", "random", False),
    ],
)
@settings(max_examples=120, deadline=None)
@given(ops=st.lists(op, max_size=100))
def test_any_interleaving_leaves_every_count_at_zero(protocol, selector, track, ops):
    w = World(protocol, selector, track)
    core = w.core
    n = 0
    gone: list[Ticket] = []
    for kind, pick, size in ops:
        w.clock.advance(0.3)
        now = w.clock.now()
        live = sorted(w.tickets)
        if kind == "arrive":
            n += 1
            prompt = Prompt(CHAT, "m", ChatSize(size * 4, 1), 64, exact_tokens=size)
            action = core.start(Request(prompt, f"r{n}", POOLS), now)
            ticket = action.ticket  # type: ignore[union-attr]
            assert ticket is not None
            w.tickets[ticket.info.id] = ticket
            w.carry_out(action)
        elif kind == "late_handoff" and gone:
            assert core.on(gone[pick % len(gone)], HANDED_OFF, now) is PROCEED
        elif not live:
            continue
        else:
            ticket = w.tickets[live[pick % len(live)]]
            rid = ticket.info.id
            sent = rid in w.pairs
            handed = rid in w.handed
            if kind == "handoff" and sent and not handed:
                w.handed.add(rid)
                w.carry_out(core.on(ticket, HANDED_OFF, now))
            elif kind == "first_token" and handed:
                core.on(ticket, FIRST_TOKEN, now)
            elif kind == "prefill_fails" and sent and not handed:
                event = UpstreamFailed("connect", retryable=True, side="prefill")
                w.carry_out(core.on(ticket, event, now))
            elif kind == "prefill_refused" and sent and not handed:
                event = UpstreamFailed("http_500", retryable=False, side="prefill")
                w.carry_out(core.on(ticket, event, now))
            elif kind == "decode_fails" and sent:
                event = UpstreamFailed("connect", retryable=True, side="decode")
                w.carry_out(core.on(ticket, event, now))
            elif kind == "decode_dies" and handed:
                event = UpstreamFailed("reset", before_response=False, side="decode")
                w.carry_out(core.on(ticket, event, now))
            elif kind == "timeout" and rid in w.waiting:
                w.carry_out(core.on(ticket, DEADLINE, now))
            elif kind in ("complete", "disconnect"):
                w.finish(ticket, Status.OK if kind == "complete" else Status.DISCONNECT)
                gone.append(ticket)
        # invariants: each worker holds exactly the live requests' slots
        for v in w.views:
            if v.role == "prefill":
                mine = [p for r, p in w.pairs.items() if p.prefill == v.id and r not in w.handed]
                assert v.in_flight == len(mine) <= 2
                assert v.outstanding_tokens == sum(
                    w.tickets[p.ticket.info.id].info.prompt_tokens + 1 for p in mine
                )
                if track:
                    assert v.prefill_tokens == sum(p.ticket.info.prompt_tokens for p in mine)
            else:
                mine = [p for p in w.pairs.values() if p.decode == v.id]
                assert v.in_flight == len(mine) <= 2
                assert v.outstanding_tokens == sum(p.ticket.info.total_tokens for p in mine)
        assert len(core.dispatcher) == len(w.waiting)
    for ticket in list(w.tickets.values()):
        w.finish(ticket, Status.DISCONNECT)
    assert all(v.in_flight == 0 and v.outstanding_tokens == 0 for v in w.views)
    assert all(v.prefill_tokens == 0 for v in w.views)
    assert len(core.dispatcher) == 0
