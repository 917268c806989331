"""The Redis entitlement store's own behaviour beyond the shared contract: atomic across
connections, the server's clock, a cancelled reserve, queued completions, and Redis
unreachable (the breaker, fail-open against local limits / live replicas, fail-closed)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.store_redis import CircuitBreaker, RedisDeadline, RedisStore, StoreUnavailable
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


def _away(s: RedisStore) -> None:
    """The store judges Redis away (its breaker open): fail-open classes admit locally."""
    s.breaker = CircuitBreaker(failures=1, cooldown_s=s.breaker.cooldown_s)
    s.breaker.failed(s._local_now(), "Redis away")


def _claim(i, name="g", replica="r1"):
    return Claim("p", name, f"q{i}", 100, replica)


async def test_concurrent_reserves_on_two_connections_never_over_admit(redis_url):
    """200 reserves at once on two stores (two connection pools) against r_e = 10: Redis's
    check-and-reserve is atomic, so at most 10 are ever granted — nothing is released
    before the end, so that is every moment — and every refusal is a legitimate one:
    `concurrency`, or `store_unavailable` for a call that timed out on a loaded host (a
    call failing while the breaker is closed is refused, never admitted outside Redis).
    With no timeout, exactly 10. The breakers never open here (the fallback's local share
    is not under test), and a reserve that timed out is cancelled by its id: Redis holds
    nothing after."""
    never = 10**9  # failures to open the breaker
    a = await _store(redis_url, breaker=CircuitBreaker(failures=never))  # the server's clock
    b = RedisStore.from_url(redis_url, timeout_s=2.0, prefix=a.prefix,
                            breaker=CircuitBreaker(failures=never))  # fmt: skip
    try:
        stores = [a if i % 2 else b for i in range(200)]
        verdicts = await asyncio.gather(*[s.reserve(_own(i)) for i, s in enumerate(stores)])
        granted = [(s, v) for s, v in zip(stores, verdicts, strict=True) if isinstance(v, Granted)]
        refused = [v.check for v in verdicts if isinstance(v, Denied)]
        assert len(granted) + len(refused) == 200
        assert len(granted) <= 10  # r_e: never over-admitted
        assert set(refused) <= {Check.CONCURRENCY, Check.STORE_UNAVAILABLE}
        assert a.degraded_admissions == b.degraded_admissions == 0  # every grant is Redis's
        if Check.STORE_UNAVAILABLE not in refused:
            assert len(granted) == 10  # nothing timed out: the limit, exactly
        for s, v in granted:
            s.finish_soon("p", v.reservation, 50)  # retried until Redis acknowledges it
        await a.drained()
        await b.drained()  # and the cancels of reserves that timed out
        view = await a.view("p")
        assert view.in_flight == 0 and view.holds == 0
    finally:
        await a.close()
        await b.close()


async def test_a_cancelled_reserve_leaves_nothing_held(redis_url):
    """A reserve cancelled in flight (the client left) still runs to its end in the
    background, and its grant, if any, is released: Redis holds nothing once those have
    ended (polled with a deadline — on a loaded host they may take a while)."""
    s = await _store(redis_url)
    try:
        for i in range(20):
            task = asyncio.ensure_future(s.reserve(_own(i)))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while True:
            await s.drained()
            view = await s.view("p")
            if view.in_flight == 0 and view.holds == 0:
                break
            assert loop.time() < deadline, view
            await asyncio.sleep(0.01)
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


# --- Redis faults (issue 23): ids, re-registration, cancellation, the fallback's share ------
def _own(i, name="g", replica="r1", slots=1):
    """A claim named by its replica, as the admitter names them (`<replica>#<n>`)."""
    return Claim("p", name, f"q{i}", 100, replica, slots, f"{replica}#{i}")


async def test_redis_restarted_empty_gets_the_pools_and_the_holds_in_flight_again(redis_url):
    s = await _store(redis_url)

    async def republish():
        await s.define_pool("p", POOL)
        await s.put_entitlement(G, 333.0)
        await s.put_entitlement(S, 0.3)

    s.republish = republish
    try:
        held = [await s.reserve(_own(i)) for i in range(3)]
        assert all(isinstance(v, Granted) for v in held)
        await s.client.delete(*s.keys("p"))  # restarted without persistence
        fourth = await s.reserve(_own(3))
        assert isinstance(fourth, Granted) and s.degraded_admissions == 0
        view = await s.view("p")
        assert view.in_flight == 4 and view.holds == 4  # the three running ones counted
        (g,) = [u for u in view.entitlements if u.definition.name == "g"]
        assert g.admitted == 1  # re-registrations are not admissions
        # a completion from before the restart releases its own hold, nothing newer
        s.finish_soon("p", held[0].reservation, 10, None)
        await s.drained()
        assert (await s.view("p")).in_flight == 3
    finally:
        await s.close()


async def test_a_reserve_released_before_redis_runs_it_holds_nothing(redis_url):
    """A reserve that timed out (Redis stalled) may run later: the store cancels it by
    its id, and Redis, told first, refuses the late reserve; a registration likewise."""
    s = await _store(redis_url)
    try:
        assert await s.release("p", "r1#late") is False  # the cancel arrives first
        late = await s.reserve(Claim("p", "g", "q", 100, "r1", 1, "r1#late"))
        assert isinstance(late, Denied) and late.check is Check.STORE_UNAVAILABLE
        assert (await s.view("p")).holds == 0
        again = await s.reserve(_own(1))
        same = await s.reserve(_own(1))  # retried after a lost answer: the same grant
        assert isinstance(again, Granted) and isinstance(same, Granted)
        assert again.reservation == same.reservation == "r1#1"
        assert (await s.view("p")).in_flight == 1
    finally:
        await s.close()


async def test_a_stalled_redis_leaves_no_hold_of_a_timed_out_reserve():
    """redis-server SIGSTOPped: a reserve times out and goes to the fallback; once Redis
    runs again, the reserve it finds queued is cancelled, and the hold the fallback granted
    is registered until its request ends: nothing is left held after."""
    import signal

    from tests.procs import Procs

    ps = Procs()
    try:
        proc = ps.redis()
        url = f"redis://127.0.0.1:{proc.port}/0"
        s = await _store(url, breaker=CircuitBreaker(failures=1))  # one timeout: Redis away
        s.timeout_s = 0.2
        proc.kill(signal.SIGSTOP)
        try:
            v = await s.reserve(_own(7))
            assert isinstance(v, Granted) and s.degraded_admissions == 1
        finally:
            proc.kill(signal.SIGCONT)
        assert v.reservation != "r1#7"  # the local grant has its own id
        await s.drained()  # the cancel of the queued reserve, acknowledged
        s.breaker.succeeded()
        assert await s.register_live(only_local=True) == 1  # the running request, counted
        assert await s.register_live(only_local=True) == 0  # once
        view = await s.view("p")
        assert view.holds == 1 and view.in_flight == 1  # r1#7 itself: never held
        s.finish_soon("p", v.reservation, 10, None)
        await s.drained()
        assert (await s.view("p")).holds == 0 and not s.live
        await s.close()
    finally:
        ps.close()


async def test_the_fallback_counts_what_redis_granted_and_admits_a_share():
    """Redis goes away with 3 of r_e = 10 in flight on this replica: with 2 replicas
    expected its share is 5, so 2 more are admitted locally, not 10."""
    from tests.procs import Procs

    ps = Procs()
    try:
        proc = ps.redis()
        s = await _store(
            f"redis://127.0.0.1:{proc.port}/0", expected_replicas=2,
            breaker=CircuitBreaker(failures=1),  # one failure: Redis away
        )  # fmt: skip
        s.timeout_s = 0.2
        held = [await s.reserve(_own(i)) for i in range(3)]
        assert all(isinstance(v, Granted) for v in held)
        proc.stop()
        verdicts = [await s.reserve(_own(10 + i)) for i in range(6)]
        granted = [v for v in verdicts if isinstance(v, Granted)]
        assert len(granted) == 2 and s.share == 2
        assert {v.check for v in verdicts if isinstance(v, Denied)} == {Check.CONCURRENCY}
        for v in held:  # requests Redis admitted end: the share has room again
            s.finish_soon("p", v.reservation, 10, None)
        assert isinstance(await s.reserve(_own(20)), Granted)
        await s.close()
    finally:
        ps.close()


async def test_a_replica_redis_forgot_registers_its_requests_before_it_is_granted_more(redis_url):
    """Redis restarted empty and another replica published the pools again: this replica's
    next reserve is answered `replica_unknown` until its requests in flight are registered
    (one heartbeat), then granted — Redis never grants it before counting them."""
    s = await _store(redis_url)
    s.start("r1")
    other = RedisStore.from_url(redis_url, timeout_s=2.0, prefix=s.prefix)
    try:
        held = [await s.reserve(_own(i)) for i in range(3)]
        assert all(isinstance(v, Granted) for v in held)
        await s.client.delete(*s.keys("p"))
        await other.define_pool("p", POOL)  # the other replica found the pool gone first
        await other.put_entitlement(G, 333.0)
        v = await s.reserve(_own(3))
        assert isinstance(v, Granted) and s.degraded_admissions == 0
        view = await s.view("p")
        assert view.in_flight == 4 and view.holds == 4
    finally:
        await other.close()
        await s.close()


# --- issue 23: the limit after a fault — a replica that did not run is not a Redis away ----
async def test_a_reserve_redis_answered_while_this_process_did_not_run_is_granted_by_redis(
    redis_url, monkeypatch
):
    """The replica's event loop is held up (a CPU-starved host) from the moment its reserve
    is sent until well past the call's timeout; Redis answers meanwhile. The answer waits
    in the socket: the reserve is Redis's grant. (A plain timeout cancelled the call when
    the loop ran again, and the reserve went to the local fallback while Redis answered —
    admitted on this replica's share while the others admitted up to the limit in Redis:
    9–10 against 8 after a fault.)"""
    import time

    import redis as sync_redis
    from redis.asyncio.connection import AbstractConnection

    s = await _store(redis_url, expected_replicas=1)
    s.timeout_s = 0.2
    probe = sync_redis.Redis.from_url(redis_url)
    holds = s.keys("p")[1]
    try:
        assert isinstance(await s.reserve(_own(1)), Granted)  # a pooled connection, warm
        claim = _own(2)
        loop = asyncio.get_running_loop()
        sent = asyncio.Event()
        send = AbstractConnection.send_packed_command

        async def send_and_mark(self, command, check_health=True):
            await send(self, command, check_health)
            sent.set()

        monkeypatch.setattr(AbstractConnection, "send_packed_command", send_and_mark)
        # Redis holds write commands back 150 ms: the answer comes while the loop is held
        probe.execute_command("CLIENT", "PAUSE", 150, "WRITE")
        started = loop.time()

        def not_running() -> None:
            if not sent.is_set():  # the reserve is not on the wire yet: let it go out
                loop.call_soon(not_running)
                return
            deadline = time.monotonic() + 10
            while not probe.hexists(holds, claim.hold):  # Redis ran it: the answer is sent
                assert time.monotonic() < deadline, "Redis never ran the reserve"
                time.sleep(0.005)
            # …and this process runs again only well after the call's deadline
            while loop.time() < started + 2 * s.timeout_s:
                time.sleep(0.005)

        task = asyncio.ensure_future(s.reserve(claim))
        loop.call_soon(not_running)
        verdict = await task
        assert isinstance(verdict, Granted) and verdict.reservation == claim.hold
        assert s.degraded_admissions == 0 and s.breaker.errors == 0
        view = await s.view("p")
        assert view.holds == 2 and view.in_flight == 2
    finally:
        probe.close()
        await s.close()


async def test_a_stalled_redis_goes_to_the_fallback():
    """With Redis SIGSTOPped (it never answers) a reserve ends, through the deadline, on
    the local share; how long that takes on a loop that runs on time is
    `test_the_deadline_expires_at_the_first_check_that_runs_on_time`'s (engine time, not
    this machine's wall clock)."""
    import signal

    from tests.procs import Procs

    ps = Procs()
    try:
        proc = ps.redis()
        s = await _store(f"redis://127.0.0.1:{proc.port}/0", breaker=CircuitBreaker(failures=1))
        s.timeout_s = 0.2
        proc.kill(signal.SIGSTOP)
        try:
            v = await s.reserve(_own(1))
        finally:
            proc.kill(signal.SIGCONT)
        assert isinstance(v, Granted) and s.degraded_admissions == 1
        await s.close()
    finally:
        ps.close()


class _SteppedLoop:
    """The two loop methods `RedisDeadline._check` uses, on a clock the test sets."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, object, tuple[object, ...]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: object, *args: object) -> object:
        self.timers.append((when, callback, args))
        return None


class _Expiry:
    def __init__(self) -> None:
        self.at: float | None = None

    def reschedule(self, when: float | None) -> None:
        self.at = when


def _deadline_on(loop: _SteppedLoop, timeout_s: float) -> tuple[RedisDeadline, _Expiry]:
    d = RedisDeadline(timeout_s)  # late_s 0.02, cap 4 timeouts
    expiry = _Expiry()
    d._loop, d._cm, d._until = loop, expiry, timeout_s * 4  # type: ignore[assignment]
    return d, expiry


def _fire_next(loop: _SteppedLoop, late_by: float) -> None:
    """Run the earliest timer `late_by` seconds after it was due."""
    when, callback, args = loop.timers.pop(0)
    loop.now = when + late_by
    callback(*args)  # type: ignore[operator]


def test_the_deadline_expires_at_the_first_check_that_runs_on_time() -> None:
    """A loop that runs its timers on time: the call is cancelled at the first check, one
    timeout after it started — not `cap` timeouts (a stalled Redis is not waited for)."""
    loop = _SteppedLoop()
    d, expiry = _deadline_on(loop, 0.2)
    loop.timers.append((0.2, d._check, (0.2,)))
    _fire_next(loop, late_by=0.005)  # within late_s: on time
    assert expiry.at == pytest.approx(0.205) and not loop.timers


def test_a_late_check_gives_the_call_a_quarter_timeout_more_up_to_the_cap() -> None:
    """A check that ran more than late_s after it was due (this process was held up) gives
    the call timeout / 4 more, again and again while it keeps running late, but never past
    `cap` timeouts from the start; the first on-time check then expires it."""
    loop = _SteppedLoop()
    d, expiry = _deadline_on(loop, 0.2)
    loop.timers.append((0.2, d._check, (0.2,)))
    _fire_next(loop, late_by=0.1)  # held up 100 ms: stretched to 0.35
    assert expiry.at is None and loop.timers[0][0] == pytest.approx(0.35)
    _fire_next(loop, late_by=0.0)  # on time now: expires
    assert expiry.at == pytest.approx(0.35)

    loop = _SteppedLoop()
    d, expiry = _deadline_on(loop, 0.2)
    loop.timers.append((0.2, d._check, (0.2,)))
    stretches = 0
    while expiry.at is None:  # always late: stretched until the cap (0.8 s)
        _fire_next(loop, late_by=0.1)
        stretches += expiry.at is None
    assert expiry.at is not None and expiry.at >= 0.8 and stretches == 4


async def test_a_registration_into_a_pool_without_the_entitlement_yet_is_not_counted_done(
    redis_url,
):
    """Redis came back empty and another replica is publishing the definitions again: the
    pool is there, the entitlement not yet. This replica's registration of what its
    fallback admitted must not be taken as done (Redis skipped the holds): it is sent
    again once the entitlement is there, so Redis counts them before it grants more."""
    s = await _store(redis_url, expected_replicas=1)
    try:
        _away(s)
        local = s._fallback(_own(1), "Redis away")  # admitted on the local share
        assert isinstance(local, Granted) and s._pending_local
        s.breaker.succeeded()  # Redis back
        await s.client.hdel(s.keys("p")[0], "e:g")  # the pool is back, the entitlement not
        with pytest.raises(StoreUnavailable):
            await s.register_live(only_local=True)
        assert not s.live["r1#1"].in_redis
        await s.put_entitlement(G, 333.0)
        assert await s.register_live(only_local=True) == 1
        view = await s.view("p")
        assert view.holds == 1 and view.in_flight == 1
    finally:
        await s.close()


async def test_a_registration_whose_answer_was_lost_is_released_in_redis_too():
    """A registration that went out but timed out (Redis stalled) may still be run: the
    request's completion is sent to Redis as well, which marks its id gone, so that the
    late registration, when Redis runs it, leaves no hold behind."""
    import signal

    from tests.procs import Procs

    ps = Procs()
    try:
        proc = ps.redis()
        s = await _store(f"redis://127.0.0.1:{proc.port}/0", expected_replicas=1)
        s.timeout_s = 0.2
        _away(s)
        assert isinstance(s._fallback(_own(1), "Redis away"), Granted)
        s.breaker.succeeded()
        proc.kill(signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable):
                await s.register_live(only_local=True)  # sent, unanswered
        finally:
            proc.kill(signal.SIGCONT)
        s.breaker.succeeded()
        s.finish_soon("p", "r1#1", 10, None)  # the request ends
        await s.drained()
        # the registration Redis runs late (here: sent again by hand, as it was)
        args = ["", "r1", 10**9, 10**6, "r1#1", "g", "q1", 100, 1]
        assert await s._register(keys=s.keys("p"), args=args) == 0
        assert (await s.view("p")).holds == 0
        await s.close()
    finally:
        ps.close()


async def test_a_hiccup_is_refused_not_admitted_outside_redis():
    """Redis held up for a moment (SIGSTOP): the reserves in flight time out together —
    one observation, not an outage: each is refused (429 store_unavailable, retry after a
    timeout), none admitted on the local share (the other replicas admit up to the limit
    in Redis meanwhile), the breaker stays closed. Failures one after another are an
    outage: the breaker opens and the fallback admits."""
    import signal

    from tests.procs import Procs

    ps = Procs()
    try:
        proc = ps.redis()
        s = await _store(f"redis://127.0.0.1:{proc.port}/0", expected_replicas=2)
        s.timeout_s = 0.2
        proc.kill(signal.SIGSTOP)
        try:
            together = await asyncio.gather(*(s.reserve(_own(i)) for i in range(4)))
            assert all(
                isinstance(v, Denied) and v.check is Check.STORE_UNAVAILABLE for v in together
            )
            assert s.degraded_admissions == 0 and s.breaker.state == "closed"
            assert s.breaker.errors == 1
            one_after_another = [await s.reserve(_own(10 + i)) for i in range(2)]
        finally:
            proc.kill(signal.SIGCONT)
        assert isinstance(one_after_another[0], Denied) and s.breaker.state == "open"
        assert isinstance(one_after_another[1], Granted) and s.degraded_admissions == 1
        await s.close()
    finally:
        ps.close()


async def _until(ok, timeout_s: float) -> bool:
    """Poll `ok()` until it holds or `timeout_s` has passed (an observable, not a sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not ok():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


async def test_a_replica_rejoins_redis_as_soon_as_it_answers_counting_what_it_runs_first():
    """issue 23, the limit within 2 s after a fault: Redis stalled (SIGSTOP) while replica A
    runs 2 requests Redis granted; A's breaker opens and A admits on its share (⌊10 / 2⌋ =
    5: 3 more, locally). When Redis runs again, A's background probe closes the breaker
    long before its cooldown (an hour here) — and only once Redis holds all 5 of A's
    requests. So replica B, on Redis, is granted the 5 left of r_e = 10, never 10. (Before:
    A stayed open for the whole cooldown — 2 s by default — admitting on its share while B
    filled the limit in Redis: up to 12 against 8 in the fault test's "to +2 s" window.)"""
    import signal

    from tests.procs import Procs

    ps = Procs()
    a = b = None
    try:
        proc = ps.redis()
        url = f"redis://127.0.0.1:{proc.port}/0"
        a = await _store(url, expected_replicas=2,
                         breaker=CircuitBreaker(failures=1, cooldown_s=3600))  # fmt: skip
        a.timeout_s = 0.2
        b = RedisStore.from_url(url, timeout_s=2.0, prefix=a.prefix)
        a.start("rA")
        closed_with: list[list[str]] = []  # A's requests Redis did not hold when it closed
        tell = a.breaker.on_move

        def moved(state: str) -> None:
            if state == "closed":
                closed_with.append([h for h, e in a.live.items() if not e.in_redis])
            if tell is not None:
                tell(state)

        a.breaker.on_move = moved
        held = [await a.reserve(_own(i, replica="rA")) for i in range(2)]
        assert all(isinstance(v, Granted) for v in held) and a.degraded_admissions == 0
        proc.kill(signal.SIGSTOP)
        try:
            local = [await a.reserve(_own(i, replica="rA")) for i in range(2, 6)]
        finally:
            proc.kill(signal.SIGCONT)
        assert a.breaker.state == "open"
        assert [isinstance(v, Granted) for v in local] == [True, True, True, False]
        assert a.degraded_admissions == 3 and len(a.live) == 5
        # Redis runs again: A's probe closes the breaker, not the hour's cooldown
        assert await _until(lambda: a.breaker.state == "closed", 10.0), a.breaker
        assert closed_with == [[]]  # every request A runs was in Redis before it closed
        await a.drained()  # the reserve that timed out ran when Redis resumed: cancelled
        view = await b.view("p")
        assert view.holds == 5 and view.in_flight == 5
        verdicts = [await b.reserve(_own(10 + i, replica="rB")) for i in range(8)]
        granted = [v for v in verdicts if isinstance(v, Granted)]
        refused = {v.check for v in verdicts if isinstance(v, Denied)}
        assert refused <= {Check.CONCURRENCY, Check.STORE_UNAVAILABLE}
        assert len(granted) <= 5  # A's 5 + B's ≤ r_e = 10: the limit, at once
        if Check.STORE_UNAVAILABLE not in refused:  # nothing timed out: the limit, exactly
            assert len(granted) == 5
    finally:
        for s in (a, b):
            if s is not None:
                await s.close()
        ps.close()


async def test_a_replica_away_while_redis_restarted_empty_rejoins_with_all_it_runs():
    """Redis SIGKILLed and restarted empty on its port while replica A runs 2 requests it
    granted and 2 its fallback granted: A's probe finds Redis without the pool, publishes
    it again, registers all 4 — and only then closes the breaker (long before its hour's
    cooldown); a completion from before the restart releases its own hold only."""
    import signal

    from tests.experiments.token_pools_faults import start_redis
    from tests.procs import Procs

    ps = Procs()
    a = None
    try:
        port = free_port()
        proc = start_redis(ps, port, "redis")
        url = f"redis://127.0.0.1:{port}/0"
        a = await _store(url, expected_replicas=2,
                         breaker=CircuitBreaker(failures=1, cooldown_s=3600))  # fmt: skip
        a.timeout_s = 0.2
        store = a

        async def republish() -> None:
            await store.define_pool("p", POOL)
            await store.put_entitlement(G, 333.0)
            await store.put_entitlement(S, 0.3)

        a.republish = republish
        a.start("rA")
        closed_with: list[list[str]] = []
        tell = a.breaker.on_move

        def moved(state: str) -> None:
            if state == "closed":
                closed_with.append([h for h, e in store.live.items() if not e.in_redis])
            if tell is not None:
                tell(state)

        a.breaker.on_move = moved
        held = [await a.reserve(_own(i, replica="rA")) for i in range(2)]
        assert all(isinstance(v, Granted) for v in held)
        proc.kill(signal.SIGKILL)
        assert proc.popen is not None
        proc.popen.wait(5)
        local = [await a.reserve(_own(i, replica="rA")) for i in range(2, 4)]
        assert all(isinstance(v, Granted) for v in local) and a.degraded_admissions == 2
        assert a.breaker.state == "open"
        start_redis(ps, port, "redis2")  # empty
        assert await _until(lambda: a.breaker.state == "closed", 10.0), a.breaker
        assert closed_with == [[]]
        view = await a.view("p")
        assert view.holds == 4 and view.in_flight == 4  # all A runs, counted
        a.finish_soon("p", held[0].reservation, 10, None)  # from before the restart
        await a.drained()
        assert (await a.view("p")).in_flight == 3
    finally:
        if a is not None:
            await a.close()
        ps.close()


async def test_a_replica_back_first_keeps_to_its_share_while_the_others_may_not_be():
    """Redis stalled with both replicas on their local shares (⌊10 / 2⌋ = 5 each): A runs
    1 request, B 5, and Redis counts none of B's. A's probe finds Redis first; B has not
    yet (its breaker stays open here). For its rejoin window A's reserves must fit its
    share as well as Redis's limit: A is granted 4 more in Redis, not the 9 Redis alone
    would grant — the fleet runs 10, the limit, not 14."""
    import signal

    from tests.procs import Procs

    ps = Procs()
    a = b = None
    try:
        proc = ps.redis()
        url = f"redis://127.0.0.1:{proc.port}/0"
        a = await _store(url, expected_replicas=2, rejoin_window_s=3600.0,
                         breaker=CircuitBreaker(failures=1, cooldown_s=3600))  # fmt: skip
        b = RedisStore.from_url(url, timeout_s=0.2, prefix=a.prefix, expected_replicas=2,
                                breaker=CircuitBreaker(failures=1, cooldown_s=3600))  # fmt: skip
        b.capacities, b.definitions = dict(a.capacities), dict(a.definitions)
        a.timeout_s = 0.2
        a.start("rA")
        proc.kill(signal.SIGSTOP)
        try:
            on_a = await a.reserve(_own(0, replica="rA"))
            on_b = [await b.reserve(_own(10 + i, replica="rB")) for i in range(6)]
        finally:
            proc.kill(signal.SIGCONT)
        assert isinstance(on_a, Granted) and a.degraded_admissions == 1
        assert [isinstance(v, Granted) for v in on_b] == [True] * 5 + [False]
        assert b.breaker.state == "open"  # B has not found Redis back (no probe here)
        assert await _until(lambda: a.breaker.state == "closed", 10.0), a.breaker
        more = [await a.reserve(_own(i, replica="rA")) for i in range(1, 10)]
        granted = [v for v in more if isinstance(v, Granted)]
        refused = {v.check for v in more if isinstance(v, Denied)}
        assert refused <= {Check.CONCURRENCY, Check.STORE_UNAVAILABLE}
        assert len(granted) <= 4  # A's share: 1 + 4; with B's 5, the limit of 10
        if Check.STORE_UNAVAILABLE not in refused:
            assert len(granted) == 4
        assert a.degraded_admissions == 1  # the 4 are Redis's grants
        await a.drained()
        view = await a.view("p")
        assert view.in_flight == 1 + len(granted)  # Redis counts A's, not yet B's
    finally:
        for s in (a, b):
            if s is not None:
                await s.close()
        ps.close()
