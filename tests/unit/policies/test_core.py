"""The pipeline core (policies/core.py): what each step does, one at a time. The
interleavings are in tests/property/test_core_properties.py; the two drivers in
tests/e2e/test_two_drivers.py."""

from __future__ import annotations

from policies.admission import AdmissionRefused, ConcurrencyAdmitter, ConcurrencyConfig
from policies.budget import BudgetConfig, ChatSize, TokenBudget
from policies.core import Core, Ticket
from policies.dispatch import FifoDispatcher
from policies.intake import CHAT, Intake, Prompt, Refusal
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
        Intake(make_placement("short_long", "short", 8192), TokenBudget(BudgetConfig())),
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

    core = _core(hooks=(Hook(),))
    assert isinstance(core.arrive(_prompt(100_000), "big", 0.0, POOLS), Refusal)
    assert isinstance(core.arrive(_prompt(10), "ok", 0.0, POOLS), Ticket)
    assert seen == ["ok"]


def test_each_pool_has_its_own_router_built_on_first_use():
    built: list[str] = []
    core = _core(built)
    views = _views()
    short = core.arrive(_prompt(100), "a", 0.0, POOLS)
    long = core.arrive(_prompt(20_000), "b", 0.0, POOLS)
    assert isinstance(short, Ticket) and isinstance(long, Ticket)
    assert core.route(short, views.__getitem__).worker.id == "short0"  # type: ignore[union-attr]
    # the long pool's round-robin turn is its own: it starts at its first worker too
    assert core.route(long, views.__getitem__).worker.id == "long0"  # type: ignore[union-attr]
    assert built == ["short", "long"]


def test_a_spill_is_reported_and_exclusion_is_honoured():
    core = _core()
    views = _views()
    for v in views["short"]:
        v.healthy = False
    ticket = core.arrive(_prompt(100), "a", 0.0, POOLS)
    assert isinstance(ticket, Ticket) and ticket.pools == ("short", "long")
    route = core.route(ticket, views.__getitem__, exclude={"long0"})
    assert route is not None and route.spilled and route.pool == "long"
    assert route.worker.id == "long1"


def test_a_released_slot_wakes_the_first_waiter_of_its_pool():
    woken: list[str] = []
    core = _core(dispatcher=FifoDispatcher(8, 10.0))
    core.on_woken = lambda t: woken.append(t.info.id)
    views = _views(capacity=1)
    held = []
    for i in range(2):
        t = core.arrive(_prompt(100), f"r{i}", 0.0, POOLS)
        route = core.route(t, lambda p: views["short"] if p == "short" else [])
        held.append((t, core.dispatch(t, route.worker.id, route.worker, 0.0, 200)))
    late = core.arrive(_prompt(100), "late", 0.0, POOLS)
    assert core.route(late, lambda p: views["short"] if p == "short" else []) is None
    assert core.wait(late, 0.0) is not None and core.queued_behind(late)
    t0, slot0 = held[0]
    core.complete(t0, Outcome(Status.OK, prompt_tokens=100), 1.0)
    assert woken == ["late"] and slot0.released and views["short"][0].in_flight == 0
    assert len(core.dispatcher) == 0


def test_admission_refusal_holds_nothing_and_complete_gives_seats_back():
    admitter = ConcurrencyAdmitter(ConcurrencyConfig(limit=1))
    core = _core(admitter=admitter)
    a = core.arrive(_prompt(100), "a", 0.0, POOLS)
    b = core.arrive(_prompt(100), "b", 0.0, POOLS)
    assert core.admit(a, 0.0) is None
    refused = core.admit(b, 0.0)
    assert isinstance(refused, AdmissionRefused) and b.reservation is None
    core.complete(b, Outcome(Status.ERROR), 0.0)
    assert admitter.in_flight == {"default": 1}
    core.complete(a, Outcome(Status.OK), 1.0)
    core.complete(a, Outcome(Status.OK), 2.0)  # twice: nothing more
    assert admitter.in_flight == {}


def test_complete_learns_only_from_successful_answers():
    learned = []

    class Learning(Intake):
        def learn(self, taken, engine_prompt_tokens):
            learned.append(engine_prompt_tokens)

    core = _core()
    core.intake = Learning(make_placement("short_long", "short", 8192), TokenBudget(BudgetConfig()))
    for status, tokens in (
        (Status.OK, 120),
        (Status.ERROR, 90),
        (Status.DISCONNECT, 80),
        (Status.OK, 0),
    ):
        t = core.arrive(_prompt(100), str(status), 0.0, POOLS)
        core.complete(t, Outcome(status, prompt_tokens=tokens), 0.0)
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
    assert not core.admission_awaits
    store = MemoryStore(ManualClock())
    admitter.attach(store, store, "replica-1")  # type: ignore[attr-defined]
    await admitter.publish()  # type: ignore[attr-defined]
    assert core.admission_awaits
    a = core.arrive(_prompt(100), "a", 0.0, POOLS)
    b = core.arrive(_prompt(100), "b", 0.0, POOLS)
    assert await core.admit_async(a, 0.0) is None
    refused = await core.admit_async(b, 0.0)
    assert isinstance(refused, AdmissionRefused) and refused.retry_after > 0
    core.complete(a, Outcome(Status.OK, prompt_tokens=100, completion_tokens=5), 1.0)
    c = core.arrive(_prompt(100), "c", 1.0, POOLS)
    assert await core.admit_async(c, 1.0) is None  # the hold came back through the store
