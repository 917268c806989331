"""One trace through both drivers of the core's state machine (policies/core.py): the
gateway (real time, HTTP, emulated engines in their own processes) and the simulator
(virtual time, the engine model). Both must take the same decisions in the same order —
the core's action log, the same in both — and give every lease back.

The trace (one entitlement; two workers in the short pool, the first of them dropping
every connection; one in the long pool; each worker takes one request at a time, at most
two requests of the entitlement are admitted at once; a–f are too long for the short
pool; round-robin routing):

    r   sent to the short pool's first worker, which drops the connection: sent again to
        the other (a retry before any answer)
    a   sent to the long pool; a long answer
    b   finds no room: waits; woken when `a` ends, and sent
    c   refused at admission (a and b hold both seats): 429
    f   sent to the long pool; a longer answer
    e   waits behind it, past the queue's timeout: 503 queue_timeout
    d   fits the short pool as configured; its turn sends it to the dropping worker
        (retried on the other), whose engine serves a shorter context than configured:
        refused by the engine, placed again on the long pool, sent there
    k   a chat in the compress-and-route band: compressed to the short pool's budget
        (the gateway's compressor on the text, the simulator's compression model), then
        as `d` (its original text goes to the long pool); the dropping worker's third
        failure in a row opens its circuit breaker

The gateway's client sends each request once the one before it is where the trace says
(in flight, or waiting): the order is the requests' causality, not a race of clocks.
Timeouts are in each driver's time: the gateway's wall seconds are the emulators'
engine seconds × their time scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from unittest import mock

import httpx
import pytest
import uvicorn

from gateway import request_ids
from gateway.app import create_app
from gateway.config import load_config
from policies.actions import ActionLog
from policies.types import Category
from simulator.run import run
from simulator.workloads import RequestSpec
from tests.e2e.fleet import MODEL, emulator, gateway_config
from tests.hook_events import Events
from tests.procs import free_port
from tests.unit.simulator.conftest import small

pytestmark = pytest.mark.e2e

SCALE = 0.1  # the emulators' time scale: wall seconds per engine second
TIMEOUT = 6.0  # the queue's timeout, engine seconds: `e` waits behind `f` past it
SHORT, ENGINE_SHORT, LONG = 4096, 2048, 65536

# id → (sim arrival in engine seconds, prompt tokens, output tokens)
TRACE = {
    "r": (0.05, 100, 16),
    "a": (1.1, 5000, 400),
    "b": (1.2, 5000, 16),
    "c": (1.3, 5000, 16),
    "f": (10.0, 5000, 2000),
    "e": (10.1, 5000, 16),
    "d": (40.0, 2500, 16),
    "k": (50.0, 5500, 16),  # a chat of prose: in the compress-and-route band
}
# `k`'s text in the gateway: 26 turns of plain prose (~3.7 bytes a token: the estimate, at
# 4, stays in the band), the last user message a question
PROSE = [
    "I think we can do it, and we will see how it goes by the end of the day.",
    "It was not the plan, but he said we should try it one more time to be sure.",
    "She had a lot to say on the call, so we let her go first and then we took notes.",
    "If the run is slow, we can add two more boxes and see if it gets any better.",
    "We did not get to the last item, so it moves to the top of the list for next week.",
    "He asked if the new log view is up yet, and I told him it is not done but close.",
]


def _chat() -> list[dict[str, str]]:
    turns = [
        {"role": "user" if t % 2 == 0 else "assistant",
         "content": " ".join(PROSE[(t + j) % len(PROSE)] for j in range(10))}
        for t in range(26)
    ]  # fmt: skip
    return [*turns, {"role": "user", "content": "Which of the points above matters most?"}]


EXPECTED = [
    ("r", "send short/0"),
    ("r", "retry reset exclude=short/0"),
    ("r", "send short/1"),
    ("r", "done ok"),
    ("a", "send long/0"),
    ("b", "wait"),
    ("c", "refuse 429 entitlement_exhausted"),
    ("c", "done error"),
    ("a", "done ok"),
    ("b", "send long/0"),
    ("b", "done ok"),
    ("f", "send long/0"),
    ("e", "wait"),
    ("e", "refuse 503 queue_timeout"),
    ("e", "done error"),
    ("f", "done ok"),
    ("d", "send short/0"),  # the round-robin turn: the dropping worker again
    ("d", "retry reset exclude=short/0"),
    ("d", "send short/1"),
    ("d", "replace long"),
    ("d", "send long/0"),
    ("d", "done ok"),
    ("k", "fit 4080"),  # compressed to the short pool's budget (what the engine refuses again)
    ("k", "send short/0"),
    ("k", "open short/0"),  # its third failure in a row: the breaker (3 by default) opens
    ("k", "retry reset exclude=short/0"),
    ("k", "send short/1"),
    ("k", "replace long"),
    ("k", "send long/0"),
    ("k", "done ok"),
]


@contextlib.contextmanager
def _client_ids() -> Iterator[dict[str, str]]:
    """The gateway sends each request with an id of its own (gateway/request_ids.py), the id
    the core and the hooks know it by: map each back to the client's x-request-id (the pair
    the request log keeps as `engine_request_id` / `request_id`), so that both drivers' logs
    compare under the trace's names."""
    ids: dict[str, str] = {}
    made: list[str] = []
    real_new, real_client = request_ids.new, request_ids.client_id

    def new() -> str:
        made.append(real_new())
        return made[-1]

    def client_id(value: bytes | None) -> str | None:
        client = real_client(value)
        if client is not None:  # asked right after `new`, in the same handler step
            ids[made[-1]] = client
        return client

    with (
        mock.patch.object(request_ids, "new", new),
        mock.patch.object(request_ids, "client_id", client_id),
    ):
        yield ids


def _decisions(
    log: ActionLog, names: dict[str, str], ids: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """The log with each worker named by its place in its pool (`names`: id → pool/i),
    the same in both drivers."""
    out = []
    for rid, what, detail in log.entries:
        rid = ids.get(rid, rid) if ids else rid
        if what == "send":  # pool/worker
            detail = names[detail.split("/", 1)[1]]
        else:
            for worker, name in names.items():
                detail = detail.replace(worker, name)
        out.append((rid, f"{what} {detail}".rstrip()))
    return out


def _names(pools: dict[str, list[str]]) -> dict[str, str]:
    return {w: f"{pool}/{i}" for pool, ids in pools.items() for i, w in enumerate(ids)}


def _simulated() -> tuple[list[tuple[str, str]], Events]:
    log, events = ActionLog(), Events()
    sc = small(
        engine={"max_num_seqs": 1},
        pools=[
            {"name": "short", "workers": 2, "max_model_len": SHORT,
             "engine": {"max_model_len": ENGINE_SHORT}, "refuse_connections": 1},
            {"name": "long", "workers": 1, "max_model_len": LONG},
        ],
        policy={
            "routing": {"policy": "round_robin"},
            "placement": {"policy": "compress_and_route", "short_pool": "short",
                          "b_short": SHORT},
            "admission": {"policy": "concurrency", "params": {"limit": 2}},
            "dispatch": {"capacity": "engine", "timeout_s": TIMEOUT},
            "compression": {"shortenable": {"chat": {"mean": 0.45, "sd": 0.0}}},
        },
    )  # fmt: skip
    specs = [
        RequestSpec(id=rid, arrival=at, prompt_tokens=p, output_tokens=n, max_tokens=n,
                    client="default", model="model",
                    category=Category.CHAT if rid == "k" else Category.CODE)
        for rid, (at, p, n) in TRACE.items()
    ]  # fmt: skip
    res = run(sc, specs=specs, hooks=(events,), log=log)
    compressed = {r.id: r.compressed_to for r in res.records if r.compressed_to}
    assert list(compressed) == ["k"] and compressed["k"] <= 4080  # by the compression model
    core = res.core
    assert core is not None
    names = _names({pool: [v.id for v in core.views(pool)] for pool in ("short", "long")})
    for pool in ("short", "long"):
        for v in core.views(pool):
            assert v.in_flight == v.outstanding_tokens == v.prefill_tokens == 0, v
    assert len(core.dispatcher) == 0 and core.admitter.in_flight == {}  # type: ignore[attr-defined]
    return _decisions(log, names), events


async def _live() -> tuple[list[tuple[str, str]], Events]:
    from tests.procs import procs

    log, events = ActionLog(), Events()
    with procs() as ps, _client_ids() as ids:
        scale = ("--time-scale", str(SCALE))
        dropping = ps.python(
            "two-drop", "tests.misbehaving_engine", "--port", "{port}", "--mode", "drop"
        ).wait_ready("/health")
        short = emulator(ps, "two-short", ENGINE_SHORT, *scale).wait_ready()
        long = emulator(ps, "two-long", LONG, *scale).wait_ready()
        cfg = gateway_config([dropping.url, short.url], [long.url])
        cfg["routing"] = {"policy": "round_robin"}
        # the dropping engine answers its health checks: it stays in routing
        cfg["health"] = {"interval_s": 60, "unhealthy_after": 3}
        cfg["pools"]["short"].update(max_model_len=SHORT, max_num_seqs=1)  # type: ignore[index]
        cfg["pools"]["long"]["max_num_seqs"] = 1  # type: ignore[index]
        cfg["placement"] = {"policy": "compress_and_route", "short_pool": "short"}
        cfg["admission"] = {"policy": "concurrency", "params": {"limit": 2}}
        cfg["dispatch"] = {"timeout_s": TIMEOUT * SCALE}
        app = create_app(load_config(data=cfg, environ={}))
        await app.gateway.start()
        try:
            driver = app.gateway.driver
            assert driver is not None
            core = driver.core
            core.log = log
            driver.hooks = (events,)
            workers = app.gateway.fleet.workers
            pools = app.gateway.fleet.pools
            names = _names({p: [w.id for w in pools[p]] for p in ("short", "long")})
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                         timeout=60) as c:  # fmt: skip

                def send(rid: str) -> asyncio.Task[httpx.Response]:
                    _, prompt, n = TRACE[rid]
                    if rid == "k":
                        chat = {"model": MODEL, "messages": _chat(), "max_tokens": n,
                                "ignore_eos": True, "stream": True}  # fmt: skip
                        return asyncio.create_task(
                            c.post("/v1/chat/completions", json=chat, headers={"x-request-id": rid})
                        )
                    # token ids: the gateway's count is exact, as the simulator's is; streamed,
                    # so that the hooks hear a first token (a whole answer has none to hear)
                    body = {"model": MODEL, "prompt": list(range(1000, 1000 + prompt)),
                            "max_tokens": n, "ignore_eos": True, "stream": True}  # fmt: skip
                    return asyncio.create_task(
                        c.post("/v1/completions", json=body, headers={"x-request-id": rid})
                    )

                async def until(check: object) -> None:
                    deadline = time.monotonic() + 20
                    while not check():  # type: ignore[operator]
                        assert time.monotonic() < deadline, "the trace did not get there"
                        await asyncio.sleep(0.002)

                in_flight = lambda: sum(w.in_flight for w in workers.values())  # noqa: E731
                assert (await send("r")).status_code == 200
                a = send("a")
                await until(lambda: in_flight() == 1)
                b = send("b")
                await until(lambda: len(core.dispatcher) == 1)
                assert (await send("c")).status_code == 429
                assert [(await t).status_code for t in (a, b)] == [200, 200]
                f = send("f")
                await until(lambda: in_flight() == 1)
                assert (await send("e")).status_code == 503
                assert (await f).status_code == 200
                d = await send("d")
                assert d.status_code == 200 and d.headers["x-fleetgate-pool"] == "long"
                k = await send("k")
                assert k.status_code == 200 and k.headers["x-fleetgate-pool"] == "long"
                assert k.headers["x-fleetgate-retried"] == "context_length"
                metrics = (await c.get("/metrics")).text
                assert "fleetgate_compress_compressed_total 1.0" in metrics  # k, by the compressor
            for w in workers.values():  # every lease came back
                assert w.in_flight == w.outstanding_tokens == w.prefill_tokens == 0
            assert len(core.dispatcher) == 0 and core.admitter.in_flight == {}  # type: ignore[attr-defined]
        finally:
            await app.gateway.stop()
    events.seen = [(ids.get(rid, rid), event) for rid, event in events.seen]
    return _decisions(log, names, ids), events


async def test_both_drivers_take_the_same_decisions_in_the_same_order():
    sim_log, sim_events = _simulated()
    assert sim_log == EXPECTED, ("simulator", sim_log)
    live_log, live_events = await _live()
    assert live_log == EXPECTED, ("gateway", live_log)
    # and a policy's hooks hear the same events of each request in both
    for rid in TRACE:
        assert live_events.of(rid) == sim_events.of(rid), rid


# --- eviction (token pools) ----------------------------------------------------------------
BIG = 1 << 50
POOLS_1 = {"p": {"slots": 1, "tokens_per_s": 1e9, "kv_bytes": BIG, "bytes_per_token": 1}}
ENTITLEMENTS = {
    "gold": {"pool": "p", "class": "guaranteed", "tokens_per_s": 1e9, "kv_bytes": BIG,
             "concurrency": 2},
    "batch": {"pool": "p", "class": "preemptible", "concurrency": 2},
}  # fmt: skip
# id → (entitlement, sim arrival in engine seconds, output tokens)
EVICTION = {"x": ("batch", 0.1, 2000), "g": ("gold", 0.5, 16)}
EVICTED = {
    "x": ["send short/0", "evict", "done error"],
    "g": ["send short/0", "done ok"],
}


def _per_request(decisions: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for rid, what in decisions:
        out.setdefault(rid, []).append(what)
    return out


def _simulated_eviction() -> list[tuple[str, str]]:
    log = ActionLog()
    sc = small(
        engine={"max_num_seqs": 2},
        pools=[{"name": "short", "workers": 1, "max_model_len": 8192}],
        policy={
            "admission": {"policy": "token_pools",
                          "params": {"pools": POOLS_1, "entitlements": ENTITLEMENTS}},
            "dispatch": {"capacity": "engine"},
        },
    )  # fmt: skip
    specs = [
        RequestSpec(id=rid, arrival=at, prompt_tokens=100, output_tokens=n, max_tokens=n,
                    client=ent, category=Category.CODE, model="model")
        for rid, (ent, at, n) in EVICTION.items()
    ]  # fmt: skip
    res = run(sc, specs=specs, log=log)
    assert {r.id: r.status for r in res.records} == {"x": "evicted", "g": "ok"}
    core = res.core
    assert core is not None
    names = _names({"short": [v.id for v in core.views("short")]})
    assert all(v.in_flight == v.outstanding_tokens == 0 for v in core.views("short"))
    return _decisions(log, names)


async def _live_eviction() -> list[tuple[str, str]]:
    from tests.procs import procs

    log = ActionLog()
    with procs() as ps, _client_ids() as ids:
        emu = emulator(ps, "evict-short", 8192, "--time-scale", str(SCALE)).wait_ready()
        cfg = gateway_config([emu.url], [])
        cfg["pools"]["short"]["max_num_seqs"] = 2  # type: ignore[index]
        cfg["auth"] = {"keys": {"gold": ["sk-gold"], "batch": ["sk-batch"]},
                       "key_secret": "test-secret-0123456789abcdef"}  # fmt: skip
        cfg["admission"] = {"policy": "token_pools",
                            "params": {"pools": POOLS_1, "entitlements": ENTITLEMENTS}}  # fmt: skip
        app = create_app(load_config(data=cfg, environ={}))
        await app.gateway.start()
        # served by uvicorn (in this loop): each request its own handler task, as in
        # production — the task an eviction cancels
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning")
        )
        serving = asyncio.create_task(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            driver = app.gateway.driver
            assert driver is not None
            driver.core.log = log
            workers = app.gateway.fleet.workers
            names = _names({"short": [w.id for w in app.gateway.fleet.pools["short"]]})
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:

                def send(rid: str) -> asyncio.Task[httpx.Response]:
                    ent, _, n = EVICTION[rid]
                    body = {"model": MODEL, "prompt": list(range(1000, 1100)), "max_tokens": n,
                            "ignore_eos": True}  # fmt: skip
                    headers = {"x-request-id": rid, "authorization": f"Bearer sk-{ent}"}
                    return asyncio.create_task(
                        c.post("/v1/completions", json=body, headers=headers)
                    )

                x = send("x")
                deadline = time.monotonic() + 20
                while sum(w.in_flight for w in workers.values()) < 1:
                    assert time.monotonic() < deadline, "x was never sent"
                    await asyncio.sleep(0.002)
                g = await send("g")
                assert g.status_code == 200, g.text
                rx = await x
                assert rx.status_code == 429 and rx.json()["error"]["code"] == "preempted"
            deadline = time.monotonic() + 10
            while any(w.in_flight for w in workers.values()):  # the evicted one unwinds
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            for w in workers.values():
                assert w.in_flight == w.outstanding_tokens == 0
        finally:
            server.should_exit = True
            await serving
            await app.gateway.stop()
    return _decisions(log, names, ids)


async def test_both_drivers_evict_the_same_request():
    """A guaranteed grant names a preemptible request to evict: the same decisions for each
    request in both drivers. (Across requests, the evicted one's end comes at once in the
    simulator and once its cancelled handler unwinds in the gateway: each request's own
    sequence is compared, the decision to evict before the guaranteed one is sent in both.)"""
    sim = _simulated_eviction()
    assert _per_request(sim) == EVICTED, ("simulator", sim)
    assert sim.index(("x", "evict")) < sim.index(("g", "send short/0"))
    live = await _live_eviction()
    assert _per_request(live) == EVICTED, ("gateway", live)
    assert live.index(("x", "evict")) < live.index(("g", "send short/0"))


# --- the circuit breaker ------------------------------------------------------------------
# Two short workers, round-robin; the first drops every connection for a while (the
# gateway: an in-process engine in `drop` mode, then `normal`; the simulator: a `fault`
# event). Two failures in a row open its circuit; while open, requests go to the other
# worker without trying it; the first request after the open period is its trial, which
# fails (the fault goes on) and re-opens it at once; once the fault is over the next trial
# succeeds and closes it. Sequential requests: each ends before the next is sent.
BREAKER_FAILURES = 2
BREAKER = [  # request, the phase it is sent in, its arrival in the simulator (engine s)
    ("q1", "fault", 0.0), ("q2", "fault", 0.5), ("q3", "open", 1.0), ("q4", "open", 1.5),
    ("q5", "half-open", 11.0), ("q6", "open", 11.5), ("q7", "recovered", 22.0),
    ("q8", "recovered", 22.5),
]  # fmt: skip
BREAKER_EXPECTED = [
    ("q1", "send short/0"),
    ("q1", "retry reset exclude=short/0"),
    ("q1", "send short/1"),
    ("q1", "done ok"),
    ("q2", "send short/0"),
    ("q2", "open short/0"),  # the second failure in a row
    ("q2", "retry reset exclude=short/0"),
    ("q2", "send short/1"),
    ("q2", "done ok"),
    ("q3", "send short/1"),  # open: not tried
    ("q3", "done ok"),
    ("q4", "send short/1"),
    ("q4", "done ok"),
    ("q5", "send short/0"),  # half-open: its trial
    ("q5", "open short/0"),  # one more failure re-opens it at once
    ("q5", "retry reset exclude=short/0"),
    ("q5", "send short/1"),
    ("q5", "done ok"),
    ("q6", "send short/1"),  # open again
    ("q6", "done ok"),
    ("q7", "send short/1"),  # the round-robin turn
    ("q7", "done ok"),
    ("q8", "send short/0"),  # the fault is over: the trial succeeds and closes it
    ("q8", "close short/0"),
    ("q8", "done ok"),
]


def _simulated_breaker() -> list[tuple[str, str]]:
    log = ActionLog()
    open_s = 10.0  # engine seconds: q3-q4 inside the first open period, q5 after it
    sc = small(
        pools=[{"name": "short", "workers": 2, "max_model_len": SHORT}],
        policy={
            "routing": {"policy": "round_robin"},
            "placement": {"policy": "short_long", "short_pool": "short", "b_short": SHORT},
            "breaker": {"failures": BREAKER_FAILURES, "open_s": open_s},
        },
        # the first worker drops every connection from the start until after q6
        events=[{"kind": "fault", "at": 0.0, "pool": "short", "worker": 0, "for_s": 15.0}],
    )
    specs = [
        RequestSpec(id=rid, arrival=at, prompt_tokens=100, output_tokens=4, max_tokens=4,
                    client="default", model="model", category=Category.CHAT)
        for rid, _, at in BREAKER
    ]  # fmt: skip
    res = run(sc, specs=specs, log=log)
    core = res.core
    assert core is not None
    views = core.views("short")
    names = _names({"short": [v.id for v in views]})
    assert all(v.in_flight == v.outstanding_tokens == 0 for v in views)
    return _decisions(log, names)


async def _live_breaker() -> list[tuple[str, str]]:
    from tests.misbehaving_engine import MisbehavingEngine

    log = ActionLog()
    faulty, good = MisbehavingEngine("drop"), MisbehavingEngine("normal")
    await faulty.start()
    await good.start()
    with _client_ids() as ids:
        cfg = gateway_config([faulty.url, good.url], [])
        cfg["routing"] = {"policy": "round_robin"}
        cfg["placement"] = {"policy": "short_long", "short_pool": "short"}
        cfg["pools"]["short"]["max_model_len"] = SHORT  # type: ignore[index]
        cfg["breaker"] = {"failures": BREAKER_FAILURES, "open_s": 2.0}  # wall seconds
        app = create_app(load_config(data=cfg, environ={}))
        await app.gateway.start()
        try:
            driver = app.gateway.driver
            assert driver is not None
            driver.core.log = log
            fleet = app.gateway.fleet
            workers = fleet.pools["short"]
            names = _names({"short": [w.id for w in workers]})
            loop = asyncio.get_running_loop()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                         timeout=30) as c:  # fmt: skip

                async def until_closed_for_trial() -> None:
                    deadline = time.monotonic() + 10
                    while loop.time() < workers[0].open_until:  # the open period's end
                        assert time.monotonic() < deadline
                        await asyncio.sleep(0.01)

                phase = "fault"
                for rid, want, _ in BREAKER:
                    if want == "open":
                        assert loop.time() < workers[0].open_until, rid  # still open
                    elif want != phase:  # half-open, or the fault is over: wait the period out
                        if want == "recovered":
                            faulty.mode = "normal"
                        await until_closed_for_trial()
                    phase = want
                    body = {"model": MODEL, "prompt": list(range(1000, 1100)), "max_tokens": 4}
                    r = await c.post("/v1/completions", json=body, headers={"x-request-id": rid})
                    assert r.status_code == 200, (rid, r.text)
            assert all(w.in_flight == w.outstanding_tokens == 0 for w in workers)
        finally:
            await app.gateway.stop()
            await faulty.close()
            await good.close()
    return _decisions(log, names, ids)


async def test_both_drivers_open_and_close_the_circuit_breaker_alike():
    """The breaker (policies/health.py) runs in the core for both drivers: the same
    failures and successes open and close it at the same requests."""
    sim_log = _simulated_breaker()
    assert sim_log == BREAKER_EXPECTED, ("simulator", sim_log)
    live_log = await _live_breaker()
    assert live_log == BREAKER_EXPECTED, ("gateway", live_log)
