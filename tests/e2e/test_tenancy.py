"""Token-pool entitlements through gateway processes: API keys → entitlements (401, 403),
the admin API round trip, and with Redis two replicas enforcing one global limit exactly,
and surviving a Redis restart and a replica's death.

The oracle for "exactly" is not the gateway's own count: the engine is
tests/misbehaving_engine.py, which counts the requests it is answering at once
(`/stats` peak_busy) — every admitted request reaches it, nothing else does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import redis
from orjson import loads as orjson_loads

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway, wait_until
from tests.procs import Proc, Procs

pytestmark = pytest.mark.e2e

SECRET = "test-secret-0123456789abcdef"
ADMIN = "ent-admin-key"
BIG = 1 << 50


def token_pools(entitlements: dict[str, Any], **store: Any) -> dict[str, Any]:
    return {
        "policy": "token_pools",
        "params": {
            "pools": {
                "p": {"slots": 64, "tokens_per_s": 1e9, "kv_bytes": BIG, "bytes_per_token": 1}
            },
            "entitlements": entitlements,
            "control_interval_s": 0.2,
            **store,
        },
    }


def guaranteed(concurrency: int, **extra: Any) -> dict[str, Any]:
    return {
        "pool": "p",
        "class": "guaranteed",
        "tokens_per_s": 1e9,
        "kv_bytes": BIG,
        "concurrency": concurrency,
        **extra,
    }


def chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **extra,
    }


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# --- (c) keys, 403, the admin API (in-memory store) ------------------------------------------
def test_keys_entitlements_and_admin_round_trip(fresh_procs: Procs):
    emu = emulator(fresh_procs, "t-emu", 8192).wait_ready()
    cfg = gateway_config(
        [emu.url],
        [],
        auth={
            "keys": {"team-a": ["sk-team-a-1"]},
            "key_secret": SECRET,
            "entitlements_admin_key": ADMIN,
        },
        admission=token_pools({"team-a": guaranteed(4), "idle": guaranteed(1, state="pending")}),
    )
    gw = start_gateway(fresh_procs, cfg)
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        assert c.post("/v1/chat/completions", json=chat()).status_code == 401
        r = c.post("/v1/chat/completions", json=chat(), headers=bearer("sk-unknown"))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = c.post("/v1/chat/completions", json=chat(), headers=bearer("sk-team-a-1"))
        assert r.status_code == 200, r.text
        assert r.headers["x-fleetgate-entitlement"] == "team-a"
        assert float(r.headers["x-fleetgate-priority"]) > 0

        # the admin API: its own key
        assert c.get("/admin/entitlements").status_code == 403
        assert c.get("/admin/entitlements", headers=bearer("wrong")).status_code == 403
        a = bearer(ADMIN)
        listed = c.get("/admin/entitlements", headers=a).json()
        assert {e["name"] for e in listed["data"]} == {"team-a", "idle"}
        assert next(e for e in listed["data"] if e["name"] == "team-a")["keys"] == 1

        body = {
            "name": "team-b", "pool": "p", "class": "elastic", "tokens_per_s": 1000,
            "kv_bytes": BIG, "concurrency": 2, "slo_target_ms": 500, "keys": ["sk-team-b-1"],
        }  # fmt: skip
        r = c.post("/admin/entitlements", json=body, headers=a)
        assert r.status_code == 201, r.text
        made = r.json()
        assert made["class"] == "elastic" and made["keys"] == 1 and made["source"] == "admin"
        assert "sk-team-b-1" not in r.text  # keys are never shown
        assert c.post("/admin/entitlements", json=body, headers=a).status_code == 409
        bad = body | {"name": "team-c", "pool": "nope"}
        assert c.post("/admin/entitlements", json=bad, headers=a).status_code == 400
        assert c.get("/admin/entitlements/none", headers=a).status_code == 404

        r = c.post("/v1/chat/completions", json=chat(), headers=bearer("sk-team-b-1"))
        assert r.status_code == 200 and r.headers["x-fleetgate-entitlement"] == "team-b"
        got = c.get("/admin/entitlements/team-b", headers=a).json()
        assert got["usage"]["admitted"] == 1 and got["usage"]["in_flight"] == 0

        r = c.patch("/admin/entitlements/team-b", json={"concurrency": 3}, headers=a)
        assert r.status_code == 200 and r.json()["concurrency"] == 3
        r = c.post("/admin/entitlements/team-b/expire", headers=a)
        assert r.status_code == 200 and r.json()["state"] == "expired"
        r = c.post("/v1/chat/completions", json=chat(), headers=bearer("sk-team-b-1"))
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "entitlement_inactive"
        assert r.headers["x-fleetgate-entitlement"] == "team-b"

        # a pending entitlement is inactive too; a key made for it at run time maps to it
        c.patch("/admin/entitlements/idle", json={"keys": ["sk-idle-1"]}, headers=a)
        r = c.post("/v1/chat/completions", json=chat(), headers=bearer("sk-idle-1"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "entitlement_inactive"

        text = c.get("/metrics").text
        assert metric(text, "fleetgate_admission_admitted_total", entitlement="team-a") == 1
        assert (
            metric(text, "fleetgate_admission_refused_total", entitlement="team-b",
                   reason="entitlement_state") == 1
        )  # fmt: skip
        assert metric(text, "fleetgate_entitlement_tokens_total", entitlement="team-a") > 0
        assert metric(text, "fleetgate_pool_capacity", pool="p", resource="slots") == 64
        schema = c.get("/openapi.json").json()
        assert "EntitlementCreate" in schema["components"]["schemas"]


def test_requests_of_no_entitlement_are_counted_against_the_default(fresh_procs: Procs):
    """With `default_entitlement`, a request whose key names no entitlement (here: an open
    gateway, no key) is claimed against the default one: it is counted under that name in
    fleetgate_admission_* and the tokens metric, and the answer says which entitlement."""
    emu = emulator(fresh_procs, "d-emu", 8192).wait_ready()
    admission = token_pools({"anyone": guaranteed(1)})
    admission["params"]["default_entitlement"] = "anyone"
    gw = start_gateway(fresh_procs, gateway_config([emu.url], [], admission=admission))
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        r = c.post("/v1/chat/completions", json=chat())
        assert r.status_code == 200, r.text
        assert r.headers["x-fleetgate-entitlement"] == "anyone"
        text = c.get("/metrics").text
        assert metric(text, "fleetgate_admission_admitted_total", entitlement="anyone") == 1
        assert metric(text, "fleetgate_entitlement_tokens_total", entitlement="anyone") > 0


def test_n_best_of_and_batched_prompts_are_charged_as_the_engine_runs_them(fresh_procs: Procs):
    """The engine runs n (or best_of) sequences per prompt, for every prompt of a batch:
    admission charges that many slots and answers' worth of tokens. A guaranteed
    entitlement of 8 slots and a 1,000-token budget (100 tokens/s over 10 s)."""
    emu = emulator(fresh_procs, "n-emu", 8192).wait_ready()
    team = guaranteed(8, tokens_per_s=100.0, window_s=10.0)
    admission = token_pools({"team": team})
    admission["params"]["default_entitlement"] = "team"
    gw = start_gateway(fresh_procs, gateway_config([emu.url], [], admission=admission))
    with httpx.Client(base_url=gw.url, timeout=10) as c:

        def code(path: str, body: dict[str, Any]) -> str:
            r = c.post(path, json=body)
            return str(r.status_code) if r.status_code != 429 else r.json()["error"]["code"]

        chat_path, completions = "/v1/chat/completions", "/v1/completions"
        assert code(chat_path, chat(n=64, max_tokens=10)) == "concurrency"  # 64 slots > 8
        assert code(chat_path, chat(best_of=16, max_tokens=10)) == "concurrency"
        assert code(chat_path, chat(n=8, max_tokens=200)) == "token_budget"  # 1,600 > 1,000
        nine = {"model": MODEL, "prompt": [f"say {i}" for i in range(9)], "max_tokens": 4}
        assert code(completions, nine) == "concurrency"  # 9 prompts: 9 sequences
        r = c.post(chat_path, json=chat(n=2, max_tokens=10))
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2
        three = {"model": MODEL, "prompt": ["a", "b", "c"], "max_tokens": 4, "n": 2}
        r = c.post(completions, json=three)
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 6
        text = c.get("/metrics").text
        assert metric(text, "fleetgate_admission_admitted_total", entitlement="team") == 2


# --- Redis: two replicas, one limit --------------------------------------------------------
def engine(procs: Procs, delay: float = 0.004, n: int = 4) -> Proc:
    """The counting engine: every request is an SSE answer of n chunks `delay` apart."""
    proc = procs.python(
        "engine", "tests.misbehaving_engine", "--port", "{port}", "--mode", "slow-sse",
        "--param", f"n={n}", "--param", f"delay={delay}",
    )  # fmt: skip
    return proc.wait_ready("/health")


def redis_config(url: str, limit: int, **store: Any) -> dict[str, Any]:
    return token_pools(
        {"team": guaranteed(limit), "surplus": {"pool": "p", "class": "spot"}},
        store="redis",
        redis_url=url,
        hold_ttl_s=3.0,
        heartbeat_ttl_s=1.5,
        timeout_s=0.2,
        breaker_cooldown_s=0.5,
        **store,
    )


def replicas(procs: Procs, eng: Proc, url: str, limit: int, n: int = 2) -> list[Proc]:
    cfg = gateway_config(
        [eng.url],
        [],
        auth={"keys": {"team": ["sk-team"], "surplus": ["sk-spot"]}, "key_secret": SECRET,
              "entitlements_admin_key": ADMIN},
        admission=redis_config(url, limit),
    )  # fmt: skip
    return [start_gateway(procs, cfg, name=f"gw{i}") for i in range(n)]


async def load(
    urls: list[str],
    requests: int,
    clients: int,
    key: str = "sk-team",
    until_ok: bool = True,
    stop: asyncio.Event | None = None,
    max_tokens: int = 4,
) -> Counter[str]:
    """`requests` streamed chats over `clients` connections, alternating replicas; with
    `until_ok` a 429 is retried after 2 ms until admitted. Counts statuses (and errors)."""
    counts: Counter[str] = Counter()
    todo = iter(range(requests))
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=clients)) as c:

        async def one(i: int) -> None:
            while True:
                url = urls[i % len(urls)]
                try:
                    async with c.stream(
                        "POST", url + "/v1/chat/completions",
                        json=chat(stream=True, max_tokens=max_tokens), headers=bearer(key),
                    ) as r:  # fmt: skip
                        await r.aread()
                        counts[str(r.status_code)] += 1
                        if r.status_code == 429:
                            counts["429:" + r.json()["error"]["code"]] += 1
                        if r.status_code != 429 or not until_ok:
                            return
                except httpx.HTTPError as exc:
                    counts[type(exc).__name__] += 1
                    if len(urls) == 1 or not until_ok:
                        return
                    i += 1  # that replica is gone: the next
                await asyncio.sleep(0.002)

        async def worker() -> None:
            for i in todo:
                if stop is not None and stop.is_set():
                    return
                await one(i)

        await asyncio.gather(*(worker() for _ in range(clients)))
    return counts


def held(url: str) -> int:
    r = redis.Redis.from_url(url)
    try:
        return int(r.hlen("fg:{p}:holds"))
    finally:
        r.close()


def engine_stats(eng: Proc) -> dict[str, int]:
    return httpx.get(eng.url + "/stats", timeout=5).json()


def test_two_replicas_one_global_concurrency_limit(fresh_procs: Procs):
    rs = fresh_procs.redis()
    url = f"redis://127.0.0.1:{rs.port}/0"
    eng = engine(fresh_procs)
    limit, requests = 8, 2000
    gws = replicas(fresh_procs, eng, url, limit)
    t0 = time.monotonic()
    counts = asyncio.run(load([g.url for g in gws], requests, clients=48))
    elapsed = time.monotonic() - t0
    stats = engine_stats(eng)
    degraded = [metric(httpx.get(g.url + "/metrics").text,
                       "fleetgate_entitlement_store_degraded_admissions_total") for g in gws]  # fmt: skip
    print(f"\n2 replicas, limit {limit}: {requests} requests in {elapsed:.1f} s, "
          f"statuses {dict(counts)}, engine {stats}, admitted outside Redis {degraded}")  # fmt: skip
    for g in gws:  # breaker transitions, registrations: why, if the limit was not held
        print(g.name, [line for line in g.output().splitlines() if "entitlement store" in line])
    assert counts["200"] == requests
    assert stats["requests"] == requests  # every admitted request reached the engine once
    over = max(0, stats["peak_busy"] - limit)
    assert over == 0, f"{over} over-admissions: the engine saw {stats['peak_busy']} at once"
    assert stats["peak_busy"] == limit  # the limit was reached (it is global, not per replica)
    assert counts["429:concurrency"] > 0
    assert wait_until(lambda: held(url) == 0, 5), held(url)
    admitted = sum(metric(httpx.get(g.url + "/metrics").text,
                          "fleetgate_admission_admitted_total", entitlement="team") for g in gws)  # fmt: skip
    assert admitted == requests


def test_two_replicas_one_global_token_budget(fresh_procs: Procs):
    """One tokens/s budget across two replicas: λ = 330 tokens/s over a 10 s window
    (3,300 tokens deep). Each request reserves prompt + max_tokens (≥ 16) and is settled
    with the engine's usage, exactly 11 tokens (7 + 4 chunks). The oracle: the engine's
    own request count N; the bucket never gives more than its depth plus its refill over
    the load's duration, so N·11 ≤ 3,300 + 330·T. Per-replica budgets would admit about
    twice that."""
    rs = fresh_procs.redis()
    url = f"redis://127.0.0.1:{rs.port}/0"
    eng = engine(fresh_procs, delay=0.001)
    rate, window, used = 330.0, 10.0, 11
    team = guaranteed(64, tokens_per_s=rate, window_s=window)
    admission = token_pools(
        {"team": team},
        store="redis",
        redis_url=url,
        hold_ttl_s=30.0,
        heartbeat_ttl_s=3.0,
        timeout_s=0.5,
    )
    cfg = gateway_config(
        [eng.url], [], auth={"keys": {"team": ["sk-team"]}, "key_secret": SECRET},
        admission=admission,
    )  # fmt: skip
    gws = [start_gateway(fresh_procs, cfg, name=f"gw{i}") for i in range(2)]
    # 2,000 keep the suite short; FLEETGATE_BUDGET_REQUESTS=5000 is the figure
    requests = int(os.environ.get("FLEETGATE_BUDGET_REQUESTS", "2000"))
    t0 = time.monotonic()
    counts = asyncio.run(
        load([g.url for g in gws], requests, clients=32, until_ok=False, max_tokens=16)
    )
    elapsed = time.monotonic() - t0
    stats = engine_stats(eng)
    bound = rate * window + rate * elapsed
    admitted = stats["requests"]
    print(f"\n2 replicas, {rate:g} tokens/s over {window:g} s: {requests} requests in "
          f"{elapsed:.1f} s, statuses {dict(counts)}; engine {admitted} requests = "
          f"{admitted * used} tokens, bound {bound:.0f} ({admitted * used / bound:.3f})")  # fmt: skip
    assert counts["200"] == admitted  # every admitted request reached the engine once
    assert counts["200"] + counts["429"] == requests
    assert counts["429"] == counts["429:token_budget"] > 0
    assert admitted * used <= bound, "over-admission: more tokens than the budget refilled"
    assert admitted * used >= 0.8 * bound  # the budget was used (it is global, not split)
    assert wait_until(lambda: held(url) == 0, 5), held(url)


def restart_redis(procs: Procs, old: Proc, down_s: float) -> Proc:
    """SIGKILL, `down_s` without Redis, then a new empty one on the same port."""
    old.kill(signal.SIGKILL)
    assert old.popen is not None
    old.popen.wait(5)
    time.sleep(down_s)
    argv = list(old.args)
    proc = Proc("redis2", argv, old.port, procs.dir / "redis2.log")
    procs.procs.append(proc)
    proc.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", old.port), 0.2):
            return proc
        time.sleep(0.05)
    raise TimeoutError("redis-server did not restart")


def test_chaos_redis_restart_and_a_replica_killed(fresh_procs: Procs):
    rs = fresh_procs.redis()
    url = f"redis://127.0.0.1:{rs.port}/0"
    eng = engine(fresh_procs, delay=0.01)
    limit = 8
    gw_a, gw_b = replicas(fresh_procs, eng, url, limit)
    urls = [gw_a.url, gw_b.url]
    timeline: list[tuple[str, Counter[str]]] = []

    async def run() -> None:
        stop = asyncio.Event()
        guaranteed_load = asyncio.create_task(load(urls, 10**6, 16, stop=stop))
        spot_load = asyncio.create_task(load([gw_a.url], 10**6, 2, key="sk-spot", stop=stop))

        async def phase(name: str, seconds: float) -> None:
            before = dict(engine_stats(eng))
            await asyncio.sleep(seconds)
            timeline.append((name, Counter({"engine_requests": engine_stats(eng)["requests"]
                                             - before["requests"]})))  # fmt: skip

        await phase("steady", 1.5)
        await asyncio.to_thread(restart_redis_and_keep, rs)
        await phase("redis restarted", 2.0)
        gw_b.kill(signal.SIGKILL)
        await phase("replica b killed", 2.0)
        stop.set()
        g, s = await guaranteed_load, await spot_load
        timeline.append(("guaranteed statuses", g))
        timeline.append(("spot statuses", s))

    restarted: list[Proc] = []

    def restart_redis_and_keep(old: Proc) -> None:
        restarted.append(restart_redis(fresh_procs, old, 1.0))

    asyncio.run(run())
    for name, c in timeline:
        print(f"{name}: {dict(c)}")
    g, s = timeline[-2][1], timeline[-1][1]
    # guaranteed fails open (answered throughout, never a 5xx or a 403), spot fails closed
    assert g["200"] > 0 and not any(k[0] in "45" and k[:3] != "429" for k in g), g
    assert set(k for k in s if k.startswith("429:")) <= {"429:store_unavailable",
                                                         "429:pool_contention"}, s  # fmt: skip
    assert s["429:store_unavailable"] > 0
    assert all(c["engine_requests"] > 0 for _, c in timeline[:3]), timeline  # answered throughout
    # nothing held once the holds' TTL (3 s) and the dead replica's heartbeat (1.5 s) pass
    t_end = time.monotonic()
    assert wait_until(lambda: held(url) == 0, 8), held(url)
    print(f"held after the run: 0 after {time.monotonic() - t_end:.1f} s; "
          f"engine peak {engine_stats(eng)['peak_busy']} (limit {limit})")  # fmt: skip
    text = httpx.get(gw_a.url + "/metrics").text
    assert metric(text, "fleetgate_entitlement_in_flight", entitlement="team") == 0 or wait_until(
        lambda: metric(httpx.get(gw_a.url + "/metrics").text, "fleetgate_entitlement_in_flight",
                       entitlement="team") == 0, 3)  # fmt: skip


# --- eviction of preemptible requests ------------------------------------------------------
def evicting_pools(slots: int, **store: Any) -> dict[str, Any]:
    params = token_pools(
        {
            "gold": guaranteed(2),
            "batch": {"pool": "p", "class": "preemptible", "concurrency": 4},
        },
        **store,
    )
    params["params"]["pools"]["p"]["slots"] = slots
    return params


def long_chat(**extra: Any) -> dict[str, Any]:
    """An answer that takes seconds on a real-time emulator: still running when evicted."""
    return chat(max_tokens=2000, ignore_eos=True, **extra)


def eviction_keys() -> dict[str, Any]:
    return {
        "keys": {"gold": ["sk-gold"], "batch": ["sk-batch"]},
        "key_secret": SECRET,
        "entitlements_admin_key": ADMIN,
    }


async def first_frame(lines: Any) -> str:
    async for line in lines:
        if line.startswith("data: "):
            return line
    raise AssertionError("the stream ended before its first frame")


async def rest_of(lines: Any) -> list[str]:
    return [line async for line in lines if line.startswith("data: ")]


def in_flight(c: httpx.Client, name: str) -> int:
    return c.get(f"/admin/entitlements/{name}", headers=bearer(ADMIN)).json()["usage"]["in_flight"]


def test_a_guaranteed_arrival_evicts_preemptible_requests(fresh_procs: Procs):
    """Pool of 2 slots full of preemptible `batch` (one stream, one whole answer): each
    guaranteed arrival evicts one. The stream ends with an error frame `preempted` then
    [DONE]; the unanswered request gets 429 `preempted` with Retry-After; the engine's
    requests are aborted and nothing stays held."""
    emu = fresh_procs.emulator(
        "evict-emu", "--model", MODEL, "--max-model-len", "8192", "--time-scale", "1"
    ).wait_ready()
    cfg = gateway_config([emu.url], [], auth=eviction_keys(), admission=evicting_pools(2))
    gw = start_gateway(fresh_procs, cfg)
    url = gw.url + "/v1/chat/completions"

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30) as c:
            batch, gold = bearer("sk-batch"), bearer("sk-gold")
            async with c.stream("POST", url, json=long_chat(stream=True), headers=batch) as a:
                assert a.status_code == 200
                a_lines = a.aiter_lines()
                await first_frame(a_lines)  # the stream is running
                b = asyncio.create_task(c.post(url, json=long_chat(), headers=batch))
                with httpx.Client(base_url=gw.url, timeout=5) as sync:
                    assert await asyncio.to_thread(
                        wait_until, lambda: in_flight(sync, "batch") == 2, 10
                    )
                # gold's first request (a long stream) takes a's slot
                async with c.stream("POST", url, json=long_chat(stream=True), headers=gold) as g1:
                    assert g1.status_code == 200
                    frames = await asyncio.wait_for(rest_of(a_lines), 10)
                    assert frames[-1] == "data: [DONE]"
                    err = orjson_loads(frames[-2][6:])["error"]
                    assert err["code"] == "preempted" and err["type"] == "rate_limit_error"
                    assert "preemptible" in err["message"]
                    # gold's second takes b's: b, not yet answered, gets a 429
                    g2 = await c.post(url, json=chat(), headers=gold)
                    assert g2.status_code == 200, g2.text
                    rb = await asyncio.wait_for(b, 10)
                    assert rb.status_code == 429, rb.text
                    assert rb.json()["error"]["code"] == "preempted"
                    assert float(rb.headers["retry-after"]) > 0
                    assert rb.headers["x-fleetgate-entitlement"] == "batch"
                    await first_frame(g1.aiter_lines())  # gold itself is untouched

    asyncio.run(run())
    with httpx.Client(base_url=gw.url, timeout=5) as c:
        assert wait_until(lambda: in_flight(c, "batch") + in_flight(c, "gold") == 0, 10)
        text = c.get("/metrics").text
        assert metric(text, "fleetgate_evictions_total", entitlement="batch",
                      **{"class": "preemptible"}) == 2  # fmt: skip
        assert metric(text, "fleetgate_evictions_total", entitlement="gold") == 0
    assert wait_until(
        lambda: metric(httpx.get(emu.url + "/metrics").text, "vllm:num_requests_running") == 0, 10
    )


def test_an_eviction_named_on_one_replica_reaches_the_other(fresh_procs: Procs):
    """Two replicas on one Redis, a pool of 1 slot: a preemptible stream on replica 0 is
    named by a guaranteed grant on replica 1; replica 0 hears of it (a notice on its next
    heartbeat) and ends the stream with the `preempted` frame; nothing stays held."""
    rs = fresh_procs.redis()
    url = f"redis://127.0.0.1:{rs.port}/0"
    emu = fresh_procs.emulator(
        "evict-emu", "--model", MODEL, "--max-model-len", "8192", "--time-scale", "1"
    ).wait_ready()
    store = {"store": "redis", "redis_url": url, "hold_ttl_s": 30.0, "heartbeat_ttl_s": 1.5}
    cfg = gateway_config([emu.url], [], auth=eviction_keys(), admission=evicting_pools(1, **store))
    gws = [start_gateway(fresh_procs, cfg, name=f"gw{i}") for i in range(2)]

    async def run() -> float:
        async with httpx.AsyncClient(timeout=30) as c:
            on_0 = gws[0].url + "/v1/chat/completions"
            on_1 = gws[1].url + "/v1/chat/completions"
            async with c.stream(
                "POST", on_0, json=long_chat(stream=True), headers=bearer("sk-batch")
            ) as a:
                assert a.status_code == 200
                lines = a.aiter_lines()
                await first_frame(lines)
                g = await c.post(on_1, json=chat(), headers=bearer("sk-gold"))
                assert g.status_code == 200, g.text
                t0 = time.monotonic()
                frames = await asyncio.wait_for(rest_of(lines), 10)
                waited = time.monotonic() - t0
                assert frames[-1] == "data: [DONE]"
                assert orjson_loads(frames[-2][6:])["error"]["code"] == "preempted"
                return waited

    waited = asyncio.run(run())
    print(f"\nthe other replica ended the evicted stream {waited * 1000:.0f} ms after the grant")
    assert wait_until(lambda: held(url) == 0, 10), held(url)
    text = httpx.get(gws[0].url + "/metrics").text
    assert metric(text, "fleetgate_evictions_total", entitlement="batch") == 1
