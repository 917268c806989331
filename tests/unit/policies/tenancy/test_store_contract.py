"""The `EntitlementStore` contract (policies/tenancy/store.py): every test runs against the
in-memory store and the Redis store (a real redis-server on loopback), with the same
expected numbers — hand-computed from the checks of §4.3 and the token bucket, not taken
from either implementation. The last test runs one seeded random sequence through both and
requires identical verdicts and counters."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from policies.tenancy.capacity import PoolCapacity
from policies.tenancy.classes import ServiceClass
from policies.tenancy.control import step
from policies.tenancy.entitlement import Entitlement, EntitlementState
from policies.tenancy.ledger import StoreConfig
from policies.tenancy.priority import PriorityConfig
from policies.tenancy.verdict import Check, Claim, Denied, Granted
from tests.unit.policies.tenancy.conftest import make_store

C = ServiceClass
BIG = 10**12  # KV bytes that never bind
POOL = PoolCapacity(tokens_per_s=1e6, kv_bytes=BIG, slots=4, bytes_per_token=100)


def ent(name, cls, r=2, tps=1e5, kv=BIG, **kw):
    if cls in (C.SPOT, C.PREEMPTIBLE):
        kw.setdefault("concurrency", r)
        return Entitlement(name, "p", cls, tokens_per_s=tps, kv_bytes=kv, **kw)
    return Entitlement(name, "p", cls, tokens_per_s=tps, kv_bytes=kv, concurrency=r, **kw)


async def setup(store, *ents, pool=POOL, prio=None):
    await store.define_pool("p", pool)
    for e in ents:
        await store.put_entitlement(e, (prio or {}).get(e.name, 1.0))
    return store


def claim(name, i=0, tokens=100, replica="r1"):
    return Claim("p", name, f"{name}-{i}", tokens, replica)


async def test_guaranteed_concurrency_is_a_hard_limit(stores):
    s = await setup(stores(), ent("g", C.GUARANTEED, r=2))
    a, b = await s.reserve(claim("g", 0)), await s.reserve(claim("g", 1))
    assert isinstance(a, Granted) and isinstance(b, Granted) and not a.bursting
    third = await s.reserve(claim("g", 2))
    assert isinstance(third, Denied) and third.check is Check.CONCURRENCY
    assert third.retry_after == 1.0  # the pool's typical request length, seeded
    assert await s.release("p", a.reservation) is True
    assert await s.release("p", a.reservation) is False  # once
    assert isinstance(await s.reserve(claim("g", 3)), Granted)


async def test_token_budget_waits_exactly_for_the_refill(stores, clock):
    # λ_e = 100 tokens/s, window 10 s: 1000 tokens deep
    s = await setup(stores(), ent("g", C.GUARANTEED, r=10, tps=100.0, window_s=10.0))
    assert isinstance(await s.reserve(claim("g", 0, tokens=600)), Granted)
    refused = await s.reserve(claim("g", 1, tokens=600))
    assert isinstance(refused, Denied) and refused.check is Check.TOKEN_BUDGET
    assert refused.retry_after == pytest.approx(2.0)  # (600 − 400) / 100
    clock.advance(2.0)
    assert isinstance(await s.reserve(claim("g", 2, tokens=600)), Granted)
    never = await s.reserve(claim("g", 3, tokens=5000))  # above λ_e·window: never fits
    assert isinstance(never, Denied) and never.retry_after == 10.0


async def test_settle_refunds_the_unused_budget_once(stores):
    s = await setup(stores(), ent("g", C.GUARANTEED, r=10, tps=100.0, window_s=10.0))
    first = await s.reserve(claim("g", 0, tokens=600))
    assert await s.settle("p", first.reservation, 100) is True  # 500 come back
    assert await s.settle("p", first.reservation, 0) is False  # once
    assert isinstance(await s.reserve(claim("g", 1, tokens=800)), Granted)  # 900 left
    view = await s.view("p")
    (g,) = view.entitlements
    assert g.charged == (100 + 800) * 1000 and g.in_flight == 2


async def test_an_overrun_charges_down_to_an_empty_budget_never_below(stores):
    s = await setup(stores(), ent("g", C.GUARANTEED, r=10, tps=100.0, window_s=10.0))
    first = await s.reserve(claim("g", 0, tokens=500))
    await s.settle("p", first.reservation, 5000)  # the estimate was far off
    refused = await s.reserve(claim("g", 1, tokens=1))
    assert isinstance(refused, Denied) and refused.check is Check.TOKEN_BUDGET
    assert refused.retry_after == pytest.approx(0.01)  # the budget is at 0, not negative


async def test_kv_bytes_bound_a_guaranteed_entitlement(stores):
    # 100 bytes a token; χ_e = 50,000 bytes: 500 tokens of context
    s = await setup(stores(), ent("g", C.GUARANTEED, r=10, kv=50_000))
    assert isinstance(await s.reserve(claim("g", 0, tokens=300)), Granted)
    refused = await s.reserve(claim("g", 1, tokens=300))
    assert isinstance(refused, Denied) and refused.check is Check.KV_BYTES


async def test_state_and_unknown_are_refused_first(stores):
    config = StoreConfig(state_retry_s=7.0)
    s = await setup(stores(config), ent("d", C.GUARANTEED, state=EntitlementState.DEGRADED))
    refused = await s.reserve(claim("d"))
    assert isinstance(refused, Denied) and refused.check is Check.STATE
    assert refused.retry_after == 7.0
    unknown = await s.reserve(claim("nobody"))
    assert isinstance(unknown, Denied) and unknown.check is Check.UNKNOWN


async def test_spot_takes_only_surplus_and_guaranteed_is_never_refused_for_contention(stores):
    s = await setup(
        stores(), ent("g", C.GUARANTEED, r=2), ent("s", C.SPOT, r=4), prio={"g": 500, "s": 0.3}
    )
    spots = [await s.reserve(claim("s", i)) for i in range(4)]
    assert all(isinstance(v, Granted) and v.bursting for v in spots)  # backfill: the pool idles
    refused = await s.reserve(claim("s", 4))
    assert isinstance(refused, Denied) and refused.check is Check.POOL_CONTENTION
    # the pool is full of spot; guaranteed within its baseline goes in regardless
    g = [await s.reserve(claim("g", i)) for i in range(2)]
    assert all(isinstance(v, Granted) and v.evict == () for v in g)
    assert (await s.view("p")).in_flight == 6


async def test_guaranteed_cannot_burst_but_elastic_bursts_into_idle_capacity(stores):
    s = await setup(stores(), ent("g", C.GUARANTEED, r=1), ent("e", C.ELASTIC, r=1))
    await s.reserve(claim("g", 0))
    refused = await s.reserve(claim("g", 1))
    assert isinstance(refused, Denied) and refused.check is Check.CONCURRENCY
    first, second = await s.reserve(claim("e", 0)), await s.reserve(claim("e", 1))
    assert isinstance(first, Granted) and not first.bursting
    assert isinstance(second, Granted) and second.bursting
    await s.reserve(claim("e", 2))  # the pool's 4 slots are now taken
    no = await s.reserve(claim("e", 3))
    assert isinstance(no, Denied) and no.check is Check.POOL_CONTENTION


async def test_contention_admits_above_the_threshold_only(stores):
    # pool of 4: "lo" (priority 20) holds 2, "hi" (priority 90) holds 2 → full
    s = await setup(
        stores(), ent("lo", C.ELASTIC, r=3), ent("hi", C.ELASTIC, r=3), prio={"lo": 20, "hi": 90}
    )
    for i in range(2):
        await s.reserve(claim("lo", i))
        await s.reserve(claim("hi", i))
    assert (await s.view("p")).threshold == 20
    hi = await s.reserve(claim("hi", 9))  # within baseline, 90 > 20
    assert isinstance(hi, Granted)
    lo = await s.reserve(claim("lo", 9))  # within baseline, 20 is not above 20
    assert isinstance(lo, Denied) and lo.check is Check.POOL_CONTENTION


async def test_a_protected_request_names_preemptible_requests_to_evict(stores):
    pool = PoolCapacity(tokens_per_s=1e6, kv_bytes=BIG, slots=2, bytes_per_token=100)
    s = await setup(
        stores(),
        ent("g", C.GUARANTEED, r=2),
        ent("x", C.PREEMPTIBLE, r=2),
        pool=pool,
        prio={"g": 1000, "x": 0.1},
    )
    x0 = await s.reserve(claim("x", 0))
    x1 = await s.reserve(claim("x", 1))
    g = await s.reserve(claim("g", 0))
    # one slot short: one victim, named by its hold
    assert isinstance(g, Granted) and g.evict == (x0.reservation,)
    g2 = await s.reserve(claim("g", 1))
    assert isinstance(g2, Granted) and g2.evict == (x1.reservation,)  # never the same twice
    g3 = await s.reserve(claim("g", 2))  # over r_e: refused, and nobody else is named
    assert isinstance(g3, Denied)
    # the victims stay held until their requests end (settled once, by their own)
    assert (await s.view("p")).in_flight == 4
    assert await s.finish("p", x0.reservation, 50) is True
    assert await s.finish("p", x0.reservation, 50) is False
    assert (await s.view("p")).in_flight == 3


async def test_another_replicas_victim_reaches_it_once_as_a_notice(stores):
    pool = PoolCapacity(tokens_per_s=1e6, kv_bytes=BIG, slots=3, bytes_per_token=100)
    s = await setup(
        stores(),
        ent("g", C.GUARANTEED, r=2),
        ent("x", C.PREEMPTIBLE, r=3),
        pool=pool,
        prio={"g": 1000, "x": 0.1},
    )
    heard: list[tuple[str, ...]] = []
    s.on_evict = heard.append
    on_a = [await s.reserve(claim("x", i, replica="a")) for i in range(2)]
    on_b = await s.reserve(claim("x", 9, replica="b"))
    # b's two guaranteed requests take 2 slots: each names one preemptible hold, the
    # lowest id first — a's (told to a, not to b); a hold already named counts as freed
    g1 = await s.reserve(claim("g", 0, replica="b"))
    assert isinstance(g1, Granted) and g1.evict == ()
    g2 = await s.reserve(claim("g", 1, replica="b"))
    assert isinstance(g2, Granted) and g2.evict == ()
    assert heard == []  # nothing of b's was named by another replica
    assert await s.heartbeat("a") == (on_a[0].reservation, on_a[1].reservation)
    assert await s.heartbeat("a") == ()  # once
    assert on_b.reservation not in g1.evict + g2.evict


async def test_a_notice_rides_on_the_victims_replicas_next_call(stores):
    pool = PoolCapacity(tokens_per_s=1e6, kv_bytes=BIG, slots=2, bytes_per_token=100)
    s = await setup(
        stores(),
        ent("g", C.GUARANTEED, r=2),
        ent("x", C.PREEMPTIBLE, r=3),
        pool=pool,
        prio={"g": 1000, "x": 0.1},
    )
    heard: list[tuple[str, ...]] = []
    s.on_evict = heard.append
    x = [await s.reserve(claim("x", i, replica="a")) for i in range(2)]
    await s.reserve(claim("g", 0, replica="b"))  # names a's first hold
    assert heard == []
    late = await s.reserve(claim("x", 5, replica="a"))  # a's next round trip carries it
    assert isinstance(late, Denied)
    assert heard == [(x[0].reservation,)]
    await s.finish("p", x[1].reservation, 10)  # nothing more to tell a
    assert heard == [(x[0].reservation,)]
    assert await s.heartbeat("a") == ()


async def test_dedicated_idle_baseline_is_not_backfilled(stores):
    s = await setup(stores(), ent("d", C.DEDICATED, r=2, kv=100_000), ent("s", C.SPOT, r=4))
    granted = [await s.reserve(claim("s", i)) for i in range(3)]
    assert [isinstance(v, Granted) for v in granted] == [True, True, False]
    d = await s.reserve(claim("d", 0))  # its baseline was held for it
    assert isinstance(d, Granted) and not d.bursting


async def test_holds_expire_after_their_ttl(stores, clock):
    s = await setup(stores(StoreConfig(hold_ttl_s=30.0)), ent("g", C.GUARANTEED, r=1))
    held = await s.reserve(claim("g", 0))
    assert isinstance(await s.reserve(claim("g", 1)), Denied)
    clock.advance(30.0)
    assert isinstance(await s.reserve(claim("g", 2)), Granted)  # reaped by the sweep
    assert await s.release("p", held.reservation) is False  # already given back


async def test_a_silent_replica_loses_its_holds_early(stores, clock):
    s = await setup(stores(StoreConfig(heartbeat_ttl_s=10.0)), ent("g", C.GUARANTEED, r=4))
    await s.heartbeat("a")
    await s.heartbeat("b")
    for i in range(2):
        await s.reserve(claim("g", i, replica="a"))
        await s.reserve(claim("g", 10 + i, replica="b"))
    for _ in range(3):  # a has crashed; b lives, heartbeating every TTL / 3 or so
        clock.advance(3.0)
        await s.heartbeat("b")
    clock.advance(2.0)
    assert await s.expire() == 2
    view = await s.view("p")
    assert view.in_flight == 2 and view.holds == 2


async def test_a_stalled_store_does_not_reap_replicas_that_lived_through_it(stores, clock):
    """Nobody reached the store for longer than the heartbeat TTL (Redis SIGSTOPped): the
    time does not count against the replicas; one that stays silent afterwards lapses."""
    s = await setup(stores(StoreConfig(heartbeat_ttl_s=10.0)), ent("g", C.GUARANTEED, r=4))
    await s.heartbeat("a")
    await s.heartbeat("b")
    held = [await s.reserve(claim("g", i, replica=r)) for i, r in enumerate("ab")]
    clock.advance(25.0)  # the stall
    assert isinstance(await s.reserve(claim("g", 5, replica="b")), Granted)  # b's, queued
    assert await s.expire() == 0
    assert (await s.view("p")).holds == 3
    for _ in range(4):  # b heartbeats; a, dead, does not
        clock.advance(3.0)
        await s.heartbeat("b")
    assert await s.expire() == 1  # a's hold, a TTL after the stall ended
    assert await s.release("p", held[1].reservation) is True


async def test_a_claim_holds_its_slots_and_a_retried_reserve_gets_the_same_grant(stores):
    s = await setup(stores(), ent("g", C.GUARANTEED, r=4))
    c = Claim("p", "g", "q", 100, "r1", slots=3, hold="r1#run-7")
    first = await s.reserve(c)
    assert isinstance(first, Granted) and first.reservation == "r1#run-7"
    again = await s.reserve(c)  # its answer was lost: retried under the same id
    assert isinstance(again, Granted) and again.reservation == "r1#run-7"
    assert (await s.view("p")).in_flight == 3
    refused = await s.reserve(Claim("p", "g", "q2", 100, "r1", slots=2))
    assert isinstance(refused, Denied) and refused.check is Check.CONCURRENCY
    assert await s.release("p", "r1#run-7") is True
    assert (await s.view("p")).in_flight == 0


async def test_finish_settles_and_releases_in_one_step(stores):
    s = await setup(stores(), ent("g", C.GUARANTEED, r=1, tps=100.0, window_s=10.0))
    held = await s.reserve(claim("g", 0, tokens=900))
    assert await s.finish("p", held.reservation, 100, latency=3.0) is True
    assert await s.finish("p", held.reservation, 100) is False
    view = await s.view("p")
    assert view.in_flight == 0 and view.holds == 0
    assert view.typical_s == pytest.approx(0.8 * 1.0 + 0.2 * 3.0)
    assert isinstance(await s.reserve(claim("g", 1, tokens=900)), Granted)  # refunded


async def test_a_control_step_applies_once_per_view(stores, clock):
    s = await setup(stores(), ent("e", C.ELASTIC, r=1, tps=100.0, window_s=10.0))
    config = PriorityConfig()
    first = await s.view("p")
    assert await s.apply_step(first, step(first, config)) is True
    assert await s.apply_step(first, step(first, config)) is False  # another replica's won
    await s.reserve(claim("e", 0, tokens=400))
    await s.reserve(claim("e", 1, tokens=400))  # refused: r_e = 1 ... but elastic bursts
    clock.advance(10.0)
    view = await s.view("p")
    dyn = step(view, config)
    assert await s.apply_step(view, dyn) is True
    (e,) = (await s.view("p")).entitlements
    assert e.debt == dyn["e"].debt and e.priority == dyn["e"].priority


async def test_both_stores_agree_on_a_random_sequence(redis_url):
    """One seeded sequence of reserve / settle / release / finish / heartbeat / expire /
    clock steps through both stores: identical verdicts and identical counters."""
    from policies.clock import ManualClock

    clocks = [ManualClock(50.0), ManualClock(50.0)]
    config = StoreConfig(hold_ttl_s=20.0, heartbeat_ttl_s=6.0)
    mem = make_store("memory", clocks[0], None, config)
    red = make_store("redis", clocks[1], redis_url, config)
    pool = PoolCapacity(tokens_per_s=400.0, kv_bytes=400_000, slots=6, bytes_per_token=100)
    ents = [
        ent("g", C.GUARANTEED, r=2, tps=100.0, kv=150_000, window_s=5.0),
        ent("d", C.DEDICATED, r=2, tps=80.0, kv=100_000, window_s=5.0),
        ent("e", C.ELASTIC, r=2, tps=60.0, kv=100_000, window_s=5.0),
        ent("s", C.SPOT, r=3, tps=50.0, kv=100_000, window_s=5.0),
        ent("x", C.PREEMPTIBLE, r=3, tps=50.0, kv=100_000, window_s=5.0),
    ]
    prio = {"g": 333.3, "d": 333.3, "e": 40.0, "s": 0.33, "x": 0.033}
    rng = random.Random(14)
    try:
        heard: tuple[list[tuple[str, ...]], list[tuple[str, ...]]] = ([], [])
        for st, log in zip((mem, red), heard, strict=True):
            await setup(st, *ents, pool=pool, prio=prio)
            st.on_evict = log.append
        held: list[str] = []
        for i in range(400):
            op = rng.random()
            if op < 0.5:
                c = claim(rng.choice("gdesx"), i, rng.randint(1, 900), rng.choice(["r1", "r2"]))
                # sequences (n, best_of, batches) and ids the caller chose, some of the time
                c = replace(c, slots=rng.choice([1, 1, 1, 2, 3]))
                if rng.random() < 0.3:
                    c = replace(c, hold=f"{c.replica}#own{i}")
                a, b = await mem.reserve(c), await red.reserve(c)
                assert type(a) is type(b), (i, a, b)
                if isinstance(a, Granted):
                    assert (a.reservation, a.bursting, a.evict) == (
                        b.reservation,
                        b.bursting,
                        b.evict,
                    )
                    held.append(a.reservation)
                else:
                    assert (a.check, a.retry_after) == (b.check, pytest.approx(b.retry_after))
            elif op < 0.65 and held:
                h = held.pop(rng.randrange(len(held)))
                used = rng.randint(0, 1200)
                assert await mem.finish("p", h, used, 0.5) == await red.finish("p", h, used, 0.5)
            elif op < 0.75 and held:
                h = rng.choice(held)
                used = rng.randint(0, 1200)
                assert await mem.settle("p", h, used) == await red.settle("p", h, used)
            elif op < 0.82 and held:
                h = held.pop(rng.randrange(len(held)))
                assert await mem.release("p", h) == await red.release("p", h)
            elif op < 0.9:
                r = rng.choice(["r1", "r2"])
                assert await mem.heartbeat(r) == await red.heartbeat(r)
            elif op < 0.93:
                assert await mem.expire() == await red.expire()
            else:
                dt = rng.choice([0.001, 0.05, 0.3, 1.7, 4.0])
                for c in clocks:
                    c.advance(dt)
            assert heard[0] == heard[1], i
            va, vb = await mem.view("p"), await red.view("p")
            assert (va.in_flight, va.kv, va.holds, va.threshold) == (
                vb.in_flight,
                vb.kv,
                vb.holds,
                vb.threshold,
            ), i
            for ua, ub in zip(va.entitlements, vb.entitlements, strict=True):
                assert (ua.in_flight, ua.kv, ua.charged, ua.refused, ua.admitted) == (
                    ub.in_flight,
                    ub.kv,
                    ub.charged,
                    ub.refused,
                    ub.admitted,
                ), (i, ua.definition.name)
    finally:
        await red.close()
