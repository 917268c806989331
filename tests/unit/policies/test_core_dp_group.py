"""A dp_group pool in the core (policies/core.py, policies/dp_group.py): requests wait in
the group's holding pool and the assignment policy sends them to ranks, on arrivals and on
completions; the rank's load follows the streamed tokens; every path gives everything back."""

from __future__ import annotations

from policies.actions import Action, ActionLog, Fail, Refuse, Send, Wait
from policies.budget import BudgetConfig, BudgetEstimator, ChatSize
from policies.core import Core
from policies.dp_group import DpGroup, DpGroupSpec
from policies.events import DEADLINE, Finished, Request, Streamed, UpstreamFailed
from policies.intake import CHAT, Intake, Prompt
from policies.pools import make_placement
from policies.routing import make_router
from policies.types import Outcome, PoolSpec, Status, WorkerView

POOLS = [PoolSpec("dp", 8192, frozenset({"m"}))]


def _core(
    spec: DpGroupSpec, endpoints: int = 1
) -> tuple[Core, list[Action], list[WorkerView], ActionLog]:
    core = Core(
        Intake(make_placement("short_long", "dp", 8192), BudgetEstimator(BudgetConfig())),
        lambda pool: make_router("least_loaded"),
    )
    core.groups["dp"] = DpGroup("dp", spec)
    views = [WorkerView(f"e{i}", "dp", 8192) for i in range(endpoints)]
    by_id = {v.id: v for v in views}
    core.views = lambda pool: views
    core.load_of = by_id.__getitem__
    seen: list[Action] = []
    core.on_action = seen.append
    core.log = log = ActionLog()
    return core, seen, views, log


def _request(rid: str, tokens: int, max_tokens: int = 50) -> Request:
    prompt = Prompt(CHAT, "m", ChatSize(tokens * 4, 1), max_tokens, exact_tokens=tokens)
    return Request(prompt, rid, POOLS)


def _ok() -> Finished:
    return Finished(Outcome(Status.OK, prompt_tokens=1))


def test_fcfs_fills_the_ranks_then_pools_then_assigns_on_completion():
    core, seen, views, log = _core(DpGroupSpec(ranks=2, slots=1, assigner="fcfs_maxfree"))
    a = core.start(_request("a", 100), 0.0)
    b = core.start(_request("b", 200), 0.0)
    assert isinstance(a, Send) and isinstance(b, Send)
    assert (a.worker, a.rank, b.rank) == ("e0", 0, 1)  # one endpoint: the rank selector
    c = core.start(_request("c", 300), 1.0)
    assert isinstance(c, Wait) and c.deadline == 31.0
    group = core.groups["dp"]
    assert group.loads() == [100, 200] and list(group.pooled) == ["c"]
    core.on(a.ticket, Streamed(7), 2.0)
    assert group.loads() == [107, 200]
    core.on(b.ticket, _ok(), 3.0)  # rank 1 frees: c goes there, through on_action
    assert [(type(x), x.ticket.info.id, x.rank) for x in seen] == [(Send, "c", 1)]  # type: ignore[union-attr]
    assert group.loads() == [107, 300] and not group.pooled
    assert log.of("c") == ["wait", "send dp/e0#1"]
    assert views[0].in_flight == 2
    core.on(a.ticket, _ok(), 4.0)
    core.on(seen[0].ticket, _ok(), 5.0)  # type: ignore[union-attr]
    assert views[0].in_flight == 0 and group.loads() == [0, 0]


def test_per_rank_endpoints_and_bfio_levels_the_ranks():
    spec = DpGroupSpec(ranks=2, slots=2, assigner="bfio", params={"solver": "milp"})
    core, _, _, _ = _core(spec, endpoints=2)
    sends = [core.start(_request(r, t), 0.0) for r, t in (("x", 1000), ("y", 900))]
    assert all(isinstance(s, Send) for s in sends)
    # a new small one goes beside the lighter rank's resident; the endpoint is the rank's
    z = core.start(_request("z", 50), 0.0)
    assert isinstance(z, Send) and z.worker == f"e{z.rank}"
    light = next(s for s in sends if isinstance(s, Send) and s.ticket.info.id == "y")
    assert isinstance(light, Send) and z.rank == light.rank


def test_a_pooled_request_times_out_and_leaves_the_pool():
    core, _, _, log = _core(DpGroupSpec(ranks=1, slots=1, timeout_s=5.0))
    first = core.start(_request("a", 10), 0.0)
    waiting = core.start(_request("b", 10), 0.0)
    assert isinstance(first, Send) and isinstance(waiting, Wait)
    refused = core.on(waiting.ticket, DEADLINE, 5.0)
    assert isinstance(refused, Refuse) and (refused.status, refused.code) == (503, "queue_timeout")
    core.on(waiting.ticket, Finished(Outcome(Status.ERROR)), 5.0)
    assert not core.groups["dp"].pooled
    core.on(first.ticket, _ok(), 6.0)  # nothing left to assign
    assert log.of("b") == ["wait", "refuse 503 queue_timeout", "done error"]


def test_a_client_gone_while_pooled_is_forgotten_and_a_failed_rank_is_not_retried():
    core, seen, views, _ = _core(DpGroupSpec(ranks=1, slots=1))
    first = core.start(_request("a", 10), 0.0)
    gone = core.start(_request("b", 10), 0.0)
    assert isinstance(first, Send) and isinstance(gone, Wait)
    core.on(gone.ticket, Finished(Outcome(Status.DISCONNECT)), 1.0)
    failed = core.on(first.ticket, UpstreamFailed("connect", retryable=True), 2.0)
    assert isinstance(failed, Fail)
    core.on(first.ticket, Finished(Outcome(Status.ERROR)), 2.0)
    assert seen == [] and views[0].in_flight == 0
    assert core.groups["dp"].loads() == [0] and not core.groups["dp"].pooled


def test_a_full_holding_pool_refuses():
    core, _, _, _ = _core(DpGroupSpec(ranks=1, slots=1, max_pooled=1))
    assert isinstance(core.start(_request("a", 10), 0.0), Send)
    assert isinstance(core.start(_request("b", 10), 0.0), Wait)
    refused = core.start(_request("c", 10), 0.0)
    assert isinstance(refused, Refuse) and (refused.status, refused.code) == (429, "queue_full")


def test_a_whole_answer_counts_at_the_learnt_decode_rate_and_usage_reconciles():
    """A request answered whole streams nothing: once the engine's usage at some request's
    end has taught the group its decode rate, a whole answer still running counts
    rate × its time on the rank (at most its max_tokens), not its prompt alone; a streamed
    one counts what it streamed; the usage replaces any count."""
    core, _, _, _ = _core(DpGroupSpec(ranks=2, slots=2, assigner="fcfs_maxfree"))
    group = core.groups["dp"]
    a = core.start(_request("a", 100, max_tokens=500), 0.0)
    assert isinstance(a, Send) and a.rank == 0
    assert group.loads(1.0) == [100, 0]  # no rate learnt yet: the prompt alone
    # a's end: the engine counted 110 prompt and 40 completion tokens in 2 s on the rank
    core.on(a.ticket, Streamed(40, 110, exact=True), 2.0)
    assert group.rate == 20.0 and group.loads(2.0) == [150, 0]
    b = core.start(_request("b", 200, max_tokens=50), 2.0)
    assert isinstance(b, Send) and b.rank == 1
    assert group.loads(3.0) == [150, 200 + 20]  # 1 s at 20 tokens a second
    assert group.loads(10.0) == [150, 200 + 50]  # never past its max_tokens
    streamed = Prompt(CHAT, "m", ChatSize(1200, 1), 50, stream=True, exact_tokens=300)
    c = core.start(Request(streamed, "c", POOLS), 2.0)
    assert isinstance(c, Send) and c.rank == 0
    assert group.loads(10.0) == [450, 250]  # nothing streamed yet: nothing estimated
    core.on(c.ticket, Streamed(3), 10.0)
    assert group.loads(10.0) == [453, 250]
    # b ends after 2 s with 30 tokens (15 a second): the rate moves a fifth of the way
    core.on(b.ticket, Streamed(30, None, exact=True), 4.0)
    assert group.rate == 0.8 * 20 + 0.2 * 15 and group.loads(10.0) == [453, 230]
    for t in (a, b, c):
        core.on(t.ticket, _ok(), 11.0)
    assert group.loads() == [0, 0] and not group.whole
