"""A dp_group pool in the core's state machine (policies/core.py, policies/dp_group.py):
whatever happens to its requests, in whatever order — arrive, wait in the holding pool, be
assigned on another's completion, stream tokens, fail, disconnect, time out, be evicted of
the pool by its client — no rank ever runs more than B of them, a request is never both
pooled and on a rank, every fillable slot is filled (no request waits while a rank has
room), and once every request is over every count is back at zero. The test drives the
real machine and carries out nothing but what the core says."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.actions import Action, Refuse, Send, Wait
from policies.budget import BudgetConfig, BudgetEstimator, ChatSize
from policies.clock import ManualClock
from policies.core import Core
from policies.dp_group import DpGroup, DpGroupSpec
from policies.events import DEADLINE, Finished, Request, Streamed, UpstreamFailed
from policies.intake import CHAT, Intake, Prompt
from policies.pools import make_placement
from policies.routing import make_router
from policies.ticket import Ticket
from policies.types import Outcome, PoolSpec, Status, WorkerView

POOLS = [PoolSpec("dp", 8192, frozenset({"m"}))]
G, B = 3, 2

steps = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "arrive", "finish", "stream", "fail", "gone", "deadline"]),
        st.integers(0, 40),  # which request (modulo those there are)
        st.integers(1, 3000),  # a prompt's tokens, or tokens streamed
    ),
    max_size=60,
)


class World:
    def __init__(self, policy: str) -> None:
        self.clock = ManualClock()
        self.core = Core(
            Intake(make_placement("short_long", "dp", 8192), BudgetEstimator(BudgetConfig())),
            lambda pool: make_router("least_loaded"),
            clock=self.clock,
        )
        spec = DpGroupSpec(G, B, policy, {}, timeout_s=5.0, max_pooled=6)
        self.group = self.core.groups["dp"] = DpGroup("dp", spec)
        self.view = WorkerView("e0", "dp", 8192)
        self.core.views = lambda pool: [self.view]
        self.core.load_of = lambda worker: self.view
        self.core.on_action = self.act
        self.state: dict[str, str] = {}  # request id → sent | waiting | over
        self.tickets: dict[str, Ticket] = {}
        self.n = 0

    def act(self, action: Action) -> None:
        t = getattr(action, "ticket", None)
        if t is None:
            return
        rid = t.info.id
        self.tickets[rid] = t
        if isinstance(action, Send):
            assert self.state.get(rid) in (None, "waiting"), (rid, self.state.get(rid))
            self.state[rid] = "sent"
        elif isinstance(action, Wait):
            self.state[rid] = "waiting"
        elif isinstance(action, Refuse):
            self.state[rid] = "refused"
        else:
            self.state[rid] = "failed"

    def end(self, rid: str, status: Status) -> None:
        self.core.on(self.tickets[rid], Finished(Outcome(status)), self.clock.t)
        self.state[rid] = "over"

    def check(self) -> None:
        g = self.group
        counts = g.counts()
        assert all(c <= B for c in counts)
        running = {k for r in g.running for k in r}
        assert not running & set(g.pooled)
        assert running == {r for r, s in self.state.items() if s == "sent"}
        assert set(g.pooled) == {r for r, s in self.state.items() if s == "waiting"}
        if g.pooled:  # nobody waits while a rank has room
            assert all(c == B for c in counts)
        assert self.view.in_flight == len(running)


@settings(max_examples=150, deadline=None)
@given(steps, st.sampled_from(["fcfs_maxfree", "least_token_load", "bfio", "jsq_count"]))
def test_any_interleaving_keeps_the_group_consistent(script, policy):
    w = World(policy)
    for what, k, n in script:
        w.clock.t += 0.5
        live = [r for r, s in w.state.items() if s in ("sent", "waiting")]
        if what == "arrive":
            rid = f"r{w.n}"
            w.n += 1
            prompt = Prompt(CHAT, "m", ChatSize(n * 4, 1), 100, exact_tokens=n)
            w.act(w.core.start(Request(prompt, rid, POOLS), w.clock.t))
        elif live:
            rid = live[k % len(live)]
            t, s = w.tickets[rid], w.state[rid]
            if what == "finish" and s == "sent":
                w.end(rid, Status.OK)
            elif what == "stream" and s == "sent":
                w.core.on(t, Streamed(n % 500), w.clock.t)
            elif what == "fail" and s == "sent":
                w.act(w.core.on(t, UpstreamFailed("reset", retryable=True), w.clock.t))
                w.end(rid, Status.ERROR)
            elif what == "gone":
                w.end(rid, Status.DISCONNECT)
            elif what == "deadline" and s == "waiting" and w.clock.t >= t.waiter.deadline:  # type: ignore[union-attr]
                w.act(w.core.on(t, DEADLINE, w.clock.t))
                w.end(rid, Status.ERROR)
        for rid, s in list(w.state.items()):
            if s == "refused":
                w.end(rid, Status.ERROR)
        w.check()
    # the rest end, running ones first (each end may assign a pooled one)
    while live := [r for r, s in w.state.items() if s in ("sent", "waiting")]:
        sent = [r for r in live if w.state[r] == "sent"]
        w.end((sent or live)[0], Status.OK)
        w.check()
    assert w.group.loads() == [0] * G and not w.group.pooled
    assert w.view.in_flight == w.view.outstanding_tokens == 0
