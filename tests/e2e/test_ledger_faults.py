"""The shared ledger keeps its promise through Redis faults: two real gateway replicas, one
real redis-server, one global concurrency limit of 8, under load.

The oracle is the engine's own count of the requests it answers at once
(tests/misbehaving_engine.py `/stats/window`), never the gateway's. The sequence
(bench/token_pools_faults.py, shorter phases here): Redis unreachable at start, restarted
empty, stalled 3 s with a heartbeat TTL of 1.5 s, one replica SIGKILLed. For each fault:
the engine's peak during it and up to 2 s after stays within the README's stated bound,
afterwards within the limit; no 5xx to the guaranteed class; and every hold comes back
once its request ended — well before the holds' TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import time
from collections import Counter

import httpx
import pytest
import redis

from tests.e2e.fleet import metric, wait_until
from tests.e2e.test_tenancy import engine, engine_stats, load, replicas
from tests.experiments.token_pools_faults import (
    Load,
    Sampler,
    Settings,
    gateway_config,
    run,
    start_gateway,
    start_redis,
)
from tests.procs import Proc, Procs, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_limit_holds_through_every_redis_fault(fresh_procs: Procs):
    report = run(Settings(), fresh_procs)
    print("\n" + report.table())
    print("statuses:", dict(report.statuses))
    assert report.statuses["200"] > 0 and report.statuses["429"] > 0  # the limit was reached
    violations = report.violations()
    assert not violations, "\n".join(violations)


def redis_admitted(url: str) -> int:
    """The entitlement's admitted counter as Redis holds it (a request admitted by a
    replica's local fallback is not in it)."""
    r = redis.Redis.from_url(url)
    try:
        raw = r.eval(
            "local v = redis.call('HGET', KEYS[1], 'e:team') "
            "if not v then return -1 end return cmsgpack.unpack(v).adm",
            1,
            "fg:{p}:state",
        )
        return int(raw)
    finally:
        r.close()


def restart(procs: Procs, old: Proc) -> Proc:
    old.kill(signal.SIGKILL)
    assert old.popen is not None
    old.popen.wait(5)
    proc = Proc("redis2", list(old.args), old.port, procs.dir / "redis2.log")
    procs.procs.append(proc)
    proc.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", old.port), 0.2):
            return proc
        time.sleep(0.02)
    raise TimeoutError("redis-server did not restart")


def test_after_a_redis_restart_no_request_is_admitted_outside_redis(fresh_procs: Procs):
    """Pooled connections opened before a restart are dead after it: each must not send a
    reserve to the uncounted local fallback while Redis answers. Once the restarted Redis
    has the pool again and both breakers are closed, every request the engine sees is one
    Redis counted."""
    rs = fresh_procs.redis()
    url = f"redis://127.0.0.1:{rs.port}/0"
    eng = engine(fresh_procs, delay=0.002)
    gws = replicas(fresh_procs, eng, url, 8)
    urls = [g.url for g in gws]
    counts = asyncio.run(load(urls, 200, clients=48))  # many pooled connections per replica
    assert counts["200"] == 200
    rs = restart(fresh_procs, rs)

    def recovered() -> bool:
        with contextlib.suppress(redis.RedisError):
            if redis_admitted(url) < 0:
                return False
        return all(
            metric(httpx.get(g.url + "/metrics", timeout=5).text,
                   "fleetgate_entitlement_store_breaker_open") == 0
            for g in gws
        )  # fmt: skip

    assert wait_until(recovered, 10)
    before_engine, before_redis = engine_stats(eng)["requests"], redis_admitted(url)
    counts = asyncio.run(load(urls, 200, clients=48))
    engine_saw = engine_stats(eng)["requests"] - before_engine
    redis_counted = redis_admitted(url) - before_redis
    print(f"\nafter the restart: engine {engine_saw} requests, Redis admitted {redis_counted}")
    assert counts["200"] == 200
    assert engine_saw == 200
    assert redis_counted == engine_saw, f"{engine_saw - redis_counted} admitted outside Redis"


def test_a_stall_longer_than_the_heartbeat_ttl_reaps_no_live_replica(fresh_procs: Procs):
    """heartbeat_ttl_s 1.5, Redis SIGSTOPped 2.5 s while long requests (3.2 s) hold the
    whole limit of 8: no replica admits beyond its share meanwhile (the stated bound), and
    when Redis runs again neither replica's holds are reaped (the store stalled, not they):
    nothing new is admitted while the requests from before run — the engine's count does
    not rise after the stall — and once they have ended the limit holds."""
    s = Settings(engine_delay_s=0.8)  # 4 chunks: 3.2 s per request, longer than the stall
    eng = fresh_procs.python(
        "engine", "tests.misbehaving_engine", "--port", "{port}", "--mode", "slow-sse",
        "--param", "n=4", "--param", f"delay={s.engine_delay_s}",
    ).wait_ready("/health")  # fmt: skip
    port = free_port()
    rs = start_redis(fresh_procs, port, "redis")
    cfg = gateway_config(s, eng.url, f"redis://127.0.0.1:{port}/0")
    gws = [start_gateway(fresh_procs, cfg, f"gw{i}") for i in range(2)]
    load = Load([g.url for g in gws], s.clients)
    sampler = Sampler(eng.url)
    threads = [sampler.start(), load.start()]
    try:
        assert wait_until(lambda: engine_stats(eng)["busy"] == s.limit, 10)
        t0 = time.monotonic()
        rs.kill(signal.SIGSTOP)
        time.sleep(2.5)  # the fault's length, not a synchronisation
        rs.kill(signal.SIGCONT)
        t1 = time.monotonic()
        time.sleep(5.0)  # observed while the requests from before the stall end, and after
    finally:
        load.stop.set()
        sampler.stop.set()
        for t in threads:
            t.join(10)
    during, after = sampler.peak(t0, t1), sampler.peak(t1, t1 + 3.2)
    later = sampler.peak(t1 + 3.5, t1 + 5.0)  # every request from before has ended
    print(f"\nstall 2.5 s, heartbeat TTL 1.5 s: engine peak {during} during, {after} after, "
          f"{later} later (limit {s.limit}, bound {s.bound('stalled')}); "
          f"statuses {dict(Counter(st for _, st in load.records))}")  # fmt: skip
    assert during <= s.bound("stalled") and after <= s.bound("stalled"), (during, after)
    assert after <= max(during, s.limit), f"live holds reaped: {after} after, {during} during"
    assert later <= s.limit
    assert not any(st.startswith("5") for _, st in load.records)
