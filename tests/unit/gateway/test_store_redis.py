"""The Redis entitlement store's own behaviour beyond the shared contract: atomic across
connections, the server's clock, a cancelled reserve, queued completions, and Redis
unreachable (the breaker, fail-open against local limits / live replicas, fail-closed)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.store_redis import RedisStore, StoreUnavailable
from policies.clock import ManualClock
from policies.tenancy.capacity import PoolCapacity
from policies.tenancy.classes import ServiceClass as C
from policies.tenancy.entitlement import Entitlement
from policies.tenancy.verdict import Check, Claim, Denied, Granted
from tests.procs import free_port

POOL = PoolCapacity(tokens_per_s=1e6, kv_bytes=10**12, slots=64, bytes_per_token=10)
G = Entitlement("g", "p", C.GUARANTEED, 1e5, 10**11, 10)
S = Entitlement("s", "p", C.SPOT, 1e5, 10**11, 10)


async def _store(url, **kw):
    s = RedisStore.from_url(url, timeout_s=2.0, prefix=f"t{uuid.uuid4().hex[:8]}", **kw)
    await s.define_pool("p", POOL)
    await s.put_entitlement(G, 333.0)
    await s.put_entitlement(S, 0.3)
    return s


def _claim(i, name="g", replica="r1"):
    return Claim("p", name, f"q{i}", 100, replica)


async def test_concurrent_reserves_on_two_connections_never_over_admit(redis_url):
    a = await _store(redis_url)  # the server's clock (TIME)
    b = RedisStore.from_url(redis_url, timeout_s=2.0, prefix=a.prefix)
    try:
        verdicts = await asyncio.gather(
            *[(a if i % 2 else b).reserve(_claim(i)) for i in range(200)]
        )
        granted = [v for v in verdicts if isinstance(v, Granted)]
        assert len(granted) == 10  # r_e, exactly
        assert {v.check for v in verdicts if isinstance(v, Denied)} == {Check.CONCURRENCY}
        for v in granted:
            assert await (a if hash(v.reservation) % 2 else b).finish("p", v.reservation, 50)
        view = await a.view("p")
        assert view.in_flight == 0 and view.holds == 0
    finally:
        await a.close()
        await b.close()


async def test_a_cancelled_reserve_leaves_nothing_held(redis_url):
    s = await _store(redis_url)
    try:
        for i in range(20):
            task = asyncio.ensure_future(s.reserve(_claim(i)))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await asyncio.sleep(0.2)
        await s.drained()
        assert (await s.view("p")).in_flight == 0
    finally:
        await s.close()


async def test_finish_soon_reaches_redis_in_order(redis_url):
    s = await _store(redis_url)
    try:
        held = [await s.reserve(_claim(i)) for i in range(5)]
        for v in held:
            s.finish_soon("p", v.reservation, 10, 0.1)
        await s.drained()
        assert (await s.view("p")).in_flight == 0
    finally:
        await s.close()


async def test_many_completions_take_few_round_trips_and_survive_a_script_flush(redis_url):
    """Completions go in pipelines of up to FINISH_BATCH FINISH calls; a Redis that lost its
    scripts (restarted) answers NOSCRIPT, and the completion is sent again with the script."""
    s = await _store(redis_url)
    try:
        held = [await s.reserve(_claim(i)) for i in range(10)]
        before = await s.client.info("commandstats")
        for v in held[:8]:
            s.finish_soon("p", v.reservation, 10, 0.1)
        await s.drained()
        after = await s.client.info("commandstats")
        calls = after["cmdstat_evalsha"]["calls"] - before["cmdstat_evalsha"]["calls"]
        assert calls == 8  # one EVALSHA per completion, sent together
        assert (await s.view("p")).in_flight == 2
        await s.client.script_flush()
        for v in held[8:]:
            s.finish_soon("p", v.reservation, 10, 0.1)
        await s.drained()
        assert (await s.view("p")).in_flight == 0
    finally:
        await s.close()


async def test_unreachable_redis_fails_open_for_protected_classes_and_closed_for_spot():
    clock = ManualClock(0.0)
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    s = RedisStore.from_url(dead, timeout_s=0.2, clock=clock.now)
    # definitions are known locally even though Redis never got them
    for call in (s.define_pool("p", POOL), s.put_entitlement(G, 333.0), s.put_entitlement(S, 0.3)):
        with pytest.raises(StoreUnavailable):
            await call
    assert s.breaker.state == "open"  # three consecutive failures
    s.live_replicas = 2  # the last heartbeat saw two replicas: local limits are halved
    verdicts = [await s.reserve(_claim(i)) for i in range(7)]
    granted = [v for v in verdicts if isinstance(v, Granted)]
    assert len(granted) == 5  # r_e = 10 over 2 replicas
    assert all(v.reservation.startswith("local:") for v in granted)
    spot = await s.reserve(_claim(99, "s"))
    assert isinstance(spot, Denied) and spot.check is Check.STORE_UNAVAILABLE
    assert 0 < spot.retry_after <= s.breaker.cooldown_s
    # completions of local holds are local, at once
    for v in granted:
        s.finish_soon("p", v.reservation, 10, None)
    assert s.local.pools["p"].in_flight == 0
    # after the cooldown one probe goes out; it fails and the breaker opens again
    clock.advance(s.breaker.cooldown_s)
    assert isinstance(await s.reserve(_claim(100)), Granted)
    assert s.breaker.state == "open" and s.breaker.transitions >= 3
    await s.close()


async def test_the_admitter_uses_an_attached_store(redis_url):
    from policies.admission import make_admitter
    from policies.types import Outcome, RequestInfo, Status

    params = {
        "pools": {
            "p": {"slots": 64, "tokens_per_s": 1e6, "kv_bytes": 10**12, "bytes_per_token": 10}
        },
        "entitlements": {
            "g": {"pool": "p", "class": "guaranteed", "tokens_per_s": 1e5}
            | {"kv_bytes": 10**11, "concurrency": 2}
        },
    }
    admitter = make_admitter("token_pools", params)
    s = RedisStore.from_url(redis_url, timeout_s=2.0, prefix=f"t{uuid.uuid4().hex[:8]}")
    admitter.attach(s, s, "r1")
    await admitter.publish()  # the configured pools and entitlements, into the shared store
    try:
        first = await admitter.admit_async(RequestInfo("a", "m", 0.0, 100, 0, entitlement="g"), 0.0)
        await admitter.admit_async(RequestInfo("b", "m", 0.0, 100, 0, entitlement="g"), 0.0)
        refused = await admitter.admit_async(
            RequestInfo("c", "m", 0.0, 100, 0, entitlement="g"), 0.0
        )
        assert refused.code == "concurrency" and refused.retry_after > 0
        assert first.tokens == 100 + 1024  # check 2: the default max_tokens
        first.settle(Outcome(Status.OK, prompt_tokens=100, completion_tokens=20), 1.0)
        first.release()
        first.release()
        await s.drained()
        (g,) = [u for u in (await s.view("p")).entitlements if u.definition.name == "g"]
        assert g.in_flight == 1
    finally:
        await s.close()
