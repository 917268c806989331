"""The pipeline core (policies/core.py): what each step does, one at a time. The
interleavings are in tests/property/test_core_properties.py; the two drivers in
tests/e2e/test_two_drivers.py."""

from __future__ import annotations

from dataclasses import dataclass

from policies.actions import PROCEED, Action, ActionLog, Admit, Fail, Refuse, Send, Wait
from policies.admission import ConcurrencyAdmitter, ConcurrencyConfig
from policies.budget import BudgetConfig, BudgetEstimator, ChatSize
from policies.core import Core
from policies.dispatch import FifoDispatcher
from policies.events import (
    ANSWERED,
    DEADLINE,
    Admitted,
    ContextRefused,
    Finished,
    Request,
    UpstreamFailed,
)
from policies.health import Breaker
from policies.intake import CHAT, Intake, Prompt
from policies.pools import make_placement
from policies.routing import make_router
from policies.types import Outcome, PoolSpec, Status, WorkerView

POOLS = [PoolSpec("short", 8192, frozenset({"m"})), PoolSpec("long", 65536, frozenset({"m"}))]


def _core(built: list[str] | None = None, **kw) -> Core:
    built = [] if built is None else built

    def router_for(pool: str):
        built.append(pool)
        return make_router("round_robin")

    core = Core(
        Intake(make_placement("short_long", "short", 8192), BudgetEstimator(BudgetConfig())),
        router_for,
        **kw,
    )
    return core


def _prompt(tokens: int, max_tokens: int = 100) -> Prompt:
    return Prompt(CHAT, "m", ChatSize(tokens * 4, 1), max_tokens, exact_tokens=tokens)


def _views(capacity: int | None = None) -> dict[str, list[WorkerView]]:
    return {
        p.name: [
            WorkerView(f"{p.name}{i}", p.name, p.max_model_len, capacity=capacity) for i in range(2)
        ]
        for p in POOLS
    }


def test_refusals_at_placement_never_reach_the_hooks():
    seen = []

    class Hook:
        def on_arrival(self, request, now):
            seen.append(request.id)

        def on_dispatch(self, request, worker, now):
            pass

    core = _core(hooks=(Hook(),))
    _bound(core, _views())
    refused = core.start(_request("big", 100_000), 0.0)
    assert isinstance(refused, Refuse) and refused.ticket is None and refused.status == 413
    assert isinstance(core.start(_request("ok", 10), 0.0), Send)
    assert seen == ["ok"]


def test_each_pool_has_its_own_router_built_on_first_use():
    built: list[str] = []
    core = _core(built)
    _bound(core, _views())
    short = core.start(_request("a", 100), 0.0)
    long = core.start(_request("b", 20_000), 0.0)
    assert isinstance(short, Send) and isinstance(long, Send)
    assert short.worker == "short0"
    # the long pool's round-robin turn is its own: it starts at its first worker too
    assert long.worker == "long0"
    assert built == ["short", "long"]


def test_a_spill_is_reported_and_a_retry_excludes_the_worker_tried():
    core = _core()
    views = _views()
    for v in views["short"]:
        v.healthy = False
    _bound(core, views)
    send = core.start(_request("a", 100), 0.0)
    assert isinstance(send, Send) and send.ticket.pools == ("short", "long")
    assert send.spilled and send.pool == "long" and send.worker == "long0"
    again = core.on(send.ticket, UpstreamFailed("connect", retryable=True), 0.0)
    assert isinstance(again, Send) and again.spilled and again.worker == "long1"


def _bound(core: Core, views: dict[str, list[WorkerView]]) -> list[Action]:
    """Bind the core to `views` as a driver does; the actions it takes for other requests."""
    by_id = {v.id: v for vs in views.values() for v in vs}
    core.views = lambda pool: views[pool]
    core.load_of = by_id.__getitem__
    seen: list[Action] = []
    core.on_action = seen.append
    return seen


def _request(rid: str, tokens: int = 100) -> Request:
    return Request(_prompt(tokens), rid, POOLS)


def test_a_released_slot_wakes_the_first_waiter_of_its_pool():
    core = _core(dispatcher=FifoDispatcher(8, 10.0))
    views = _views(capacity=1)
    views["long"] = []
    woken = _bound(core, views)
    sent = [core.start(_request(f"r{i}"), 0.0) for i in range(2)]
    assert [type(a) for a in sent] == [Send, Send]
    late = core.start(_request("late"), 0.0)
    assert isinstance(late, Wait) and late.deadline == 10.0
    assert isinstance(core.start(_request("later"), 0.0), Wait)  # behind "late": FIFO
    first = sent[0]
    assert isinstance(first, Send)
    core.on(first.ticket, Finished(Outcome(Status.OK, prompt_tokens=100)), 1.0)
    assert first.slot.released
    assert [(type(a), a.ticket.info.id) for a in woken] == [(Send, "late")]  # type: ignore[union-attr]
    assert views["short"][0].in_flight == 1 and len(core.dispatcher) == 1


def test_a_deadline_refuses_with_503_and_gives_the_queue_place_back():
    core = _core(dispatcher=FifoDispatcher(8, 10.0))
    views = _views(capacity=1)
    views["long"] = []
    _bound(core, views)
    core.start(_request("a"), 0.0)
    core.start(_request("b"), 0.0)
    wait = core.start(_request("c"), 0.0)
    assert isinstance(wait, Wait)
    refused = core.on(wait.ticket, DEADLINE, 10.0)
    assert isinstance(refused, Refuse) and (refused.status, refused.code) == (503, "queue_timeout")
    assert refused.retry_after == 10.0 and len(core.dispatcher) == 0


def test_no_healthy_worker_is_a_503_not_a_wait():
    core = _core()
    views = _views()
    for vs in views.values():
        for v in vs:
            v.healthy = False
    _bound(core, views)
    refused = core.start(_request("a"), 0.0)
    assert isinstance(refused, Refuse) and refused.code == "no_healthy_worker"


@dataclass(slots=True)
class _Worker(WorkerView):
    """A worker's view with the breaker's state, as the gateway's WorkerState has both."""

    proven: bool = True
    health_fails: int = 0
    health_oks: int = 0
    breaker_fails: int = 0
    open_until: float = 0.0


def test_a_connect_failure_is_retried_once_on_another_worker_and_the_breaker_counts():
    core = _core()
    core.breaker = Breaker(failures=2, open_s=5.0)
    views = {p.name: [_Worker(f"{p.name}{i}", p.name, p.max_model_len) for i in range(2)]
             for p in POOLS}  # fmt: skip
    _bound(core, views)  # type: ignore[arg-type]
    log = ActionLog()
    core.log = log
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, Send) and send.worker == "short0"
    again = core.on(send.ticket, UpstreamFailed("connect", retryable=True), 1.0)
    assert isinstance(again, Send) and again.worker == "short1" and again.attempt == 1
    short0, short1 = views["short"]
    assert short0.in_flight == 0 and short0.breaker_fails == 1
    failed = core.on(again.ticket, UpstreamFailed("connect", retryable=True), 2.0)
    assert isinstance(failed, Fail)  # one retry only
    assert short1.breaker_fails == 1
    core.on(again.ticket, UpstreamFailed("reset", before_response=False), 2.0)
    assert short1.open_until == 7.0  # the second failure in a row opened its circuit
    assert log.of("a") == ["send short/short0", "retry connect exclude=short0",
                           "send short/short1", "fail", "open short1", "fail"]  # fmt: skip
    core.on(again.ticket, ANSWERED, 3.0)  # a success closes it (the worker answers)
    assert short1.open_until == 0.0 and short1.breaker_fails == 0
    assert log.of("a")[-1] == "close short1"


def test_a_context_refusal_is_placed_again_on_a_longer_pool_once():
    core = _core()
    views = _views()
    _bound(core, views)
    send = core.start(_request("a", 7000), 0.0)
    assert isinstance(send, Send) and send.pool == "short"
    assert send.ticket.placed.pools == ("short", "long")
    again = core.on(send.ticket, ContextRefused(8192), 1.0)
    assert isinstance(again, Send) and again.pool == "long" and again.attempt == 1
    assert send.slot.released and send.ticket.placed.pools == ("long",)
    assert not send.ticket.placed.classified
    assert core.on(again.ticket, ContextRefused(65536), 2.0) is PROCEED  # once


def test_admission_refusal_holds_nothing_and_complete_gives_seats_back():
    admitter = ConcurrencyAdmitter(ConcurrencyConfig(limit=1))
    core = _core(admitter=admitter)
    _bound(core, _views())
    a = core.start(_request("a"), 0.0)
    refused = core.start(_request("b"), 0.0)
    assert isinstance(a, Send) and a.ticket.reservation is not None
    assert isinstance(refused, Refuse) and refused.status == 429 and refused.ticket is not None
    b = refused.ticket
    assert b.reservation is None and b.admission == "entitlement_exhausted"
    core.on(b, Finished(Outcome(Status.ERROR)), 0.0)
    assert admitter.in_flight == {"default": 1}
    core.on(a.ticket, Finished(Outcome(Status.OK)), 1.0)
    core.on(a.ticket, Finished(Outcome(Status.OK)), 2.0)  # twice: nothing more
    assert admitter.in_flight == {}


def test_complete_learns_only_from_successful_answers():
    learned = []

    class Learning(Intake):
        def learn(self, placed, engine_prompt_tokens):
            learned.append(engine_prompt_tokens)

    core = _core()
    _bound(core, _views())
    core.intake = Learning(
        make_placement("short_long", "short", 8192), BudgetEstimator(BudgetConfig())
    )
    for status, tokens in (
        (Status.OK, 120),
        (Status.ERROR, 90),
        (Status.DISCONNECT, 80),
        (Status.OK, 0),
    ):
        send = core.start(_request(str(status)), 0.0)
        assert isinstance(send, Send)
        core.on(send.ticket, Finished(Outcome(status, prompt_tokens=tokens)), 0.0)
    assert learned == [120]


async def test_admission_through_a_shared_store_is_awaited_and_released_on_complete():
    """An admitter with a store attached (the gateway's Redis store; here the in-memory
    one behind the same async protocol) is awaited; `complete` gives its hold back."""
    from policies.admission import make_admitter
    from policies.clock import ManualClock
    from policies.tenancy.store import MemoryStore

    pool = {"slots": 1, "tokens_per_s": 1e6, "kv_bytes": 10**12, "bytes_per_token": 10}
    ent = {"pool": "p", "class": "guaranteed", "tokens_per_s": 1e5, "kv_bytes": 10**10,
           "concurrency": 1}  # fmt: skip
    admitter = make_admitter(
        "token_pools", {"pools": {"p": pool}, "entitlements": {"default": ent}}
    )
    core = _core(admitter=admitter)
    _bound(core, _views())
    store = MemoryStore(ManualClock())
    admitter.attach(store, store, "replica-1")  # type: ignore[attr-defined]
    await admitter.publish()  # type: ignore[attr-defined]

    async def admitted(rid: str, now: float) -> Action:
        admit = core.start(_request(rid), now)
        assert isinstance(admit, Admit)
        verdict = await admitter.admit_async(admit.ticket.info, now)  # type: ignore[attr-defined]
        return core.on(admit.ticket, Admitted(verdict), now)

    a = await admitted("a", 0.0)
    refused = await admitted("b", 0.0)
    assert isinstance(a, Send)
    assert isinstance(refused, Refuse) and refused.status == 429 and refused.retry_after > 0
    core.on(a.ticket, Finished(Outcome(Status.OK, prompt_tokens=100, completion_tokens=5)), 1.0)
    assert isinstance(await admitted("c", 1.0), Send)  # the hold came back through the store
