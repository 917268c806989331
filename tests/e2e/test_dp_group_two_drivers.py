"""A dp_group pool through both drivers of the core (policies/core.py): the gateway in
front of an emulated data-parallel group (`fleetgate emulate --data-parallel-size 4`, one
endpoint, the rank in `X-data-parallel-rank`) and the simulator (the same lockstep group
model) take the same assignments, in the same order, and give everything back.

The trace: G = 4 ranks of B = 2 slots, `fcfs_maxfree`. Eight requests fill the eight
slots as they arrive (the group's rank with the most free slots, lowest index first);
four more wait in the holding pool; each completion frees one slot and the oldest pooled
request takes it. The first eight end 40 steps apart and the pooled ones (400 tokens each)
only after all of them, 40 steps apart too: completions come in one order in both drivers
whatever the steps over which the gateway's arrivals spread (up to ~20).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gateway.app import create_app
from gateway.config import load_config
from policies.actions import ActionLog
from policies.types import Category
from simulator.run import run
from simulator.workloads import RequestSpec
from tests.e2e.fleet import MODEL, emulator, gateway_config
from tests.e2e.test_two_drivers import _client_ids
from tests.unit.simulator.conftest import small

pytestmark = pytest.mark.e2e

G, B = 4, 2
DP_GROUP = {"ranks": G, "slots": B, "assigner": {"policy": "fcfs_maxfree"}}
# id → (prompt tokens, output tokens): the first eight fill the slots, the last four wait
TRACE = {f"f{i}": (100 + 37 * i, 40 * (i + 1)) for i in range(8)}
TRACE.update({f"p{i}": (150 + 11 * i, 400) for i in range(4)})


def _simulated() -> list[tuple[str, str]]:
    log = ActionLog()
    pool = {"name": "short", "workers": 1, "max_model_len": 8192, "kind": "dp_group",
            "dp_group": DP_GROUP}  # fmt: skip
    sc = small(pools=[pool])
    specs = [
        RequestSpec(id=rid, arrival=0.0001 * i, prompt_tokens=p, output_tokens=n, max_tokens=n,
                    client="default", model="model", category=Category.CODE)
        for i, (rid, (p, n)) in enumerate(TRACE.items())
    ]  # fmt: skip
    res = run(sc, specs=specs, log=log)
    assert {r.status for r in res.records} == {"ok"}
    core = res.core
    assert core is not None
    group = core.groups["short"]
    assert group.loads() == [0] * G and not group.pooled
    assert all(v.in_flight == v.outstanding_tokens == 0 for v in core.views("short"))
    return _decisions(log)


def _decisions(log: ActionLog, ids: dict[str, str] | None = None) -> list[tuple[str, str]]:
    out = []
    for rid, what, detail in log.entries:
        rid = ids.get(rid, rid) if ids else rid
        if what == "send":  # pool/worker#rank: the rank is what both must agree on
            detail = detail.rsplit("#", 1)[1]
        out.append((rid, f"{what} {detail}".rstrip()))
    return out


async def _live() -> tuple[list[tuple[str, str]], str]:
    from tests.procs import procs

    log = ActionLog()
    with procs() as ps, _client_ids() as ids:
        emu = emulator(
            ps, "dp4", 8192, "--time-scale", "1.0", "--data-parallel-size", str(G),
            "--max-num-seqs", str(B),
        ).wait_ready()  # fmt: skip
        cfg = gateway_config([emu.url], [])
        cfg["pools"]["short"].update(kind="dp_group", dp_group=DP_GROUP)  # type: ignore[index]
        app = create_app(load_config(data=cfg, environ={}))
        await app.gateway.start()
        try:
            driver = app.gateway.driver
            assert driver is not None
            core = driver.core
            core.log = log
            group = core.groups["short"]
            worker = next(iter(app.gateway.fleet.workers.values()))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                         timeout=60) as c:  # fmt: skip

                def send(rid: str) -> asyncio.Task[httpx.Response]:
                    prompt, n = TRACE[rid]
                    body = {"model": MODEL, "prompt": list(range(1000, 1000 + prompt)),
                            "max_tokens": n, "ignore_eos": True, "stream": True}  # fmt: skip
                    return asyncio.create_task(
                        c.post("/v1/completions", json=body, headers={"x-request-id": rid})
                    )

                async def until(check: object) -> None:
                    deadline = time.monotonic() + 20
                    while not check():  # type: ignore[operator]
                        assert time.monotonic() < deadline, "the trace did not get there"
                        await asyncio.sleep(0.001)

                tasks = []
                for i, rid in enumerate(TRACE):
                    tasks.append(send(rid))
                    if rid.startswith("f"):
                        await until(lambda i=i: worker.in_flight == i + 1)
                    else:
                        await until(lambda i=i: len(group.pooled) == i - 7)
                answers = [await t for t in tasks]
                assert [a.status_code for a in answers] == [200] * len(TRACE)
                emu_metrics = httpx.get(emu.url + "/metrics", timeout=5).text
                gw_metrics = (await c.get("/metrics")).text
            assert worker.in_flight == worker.outstanding_tokens == 0
            assert group.loads() == [0] * G and not group.pooled
        finally:
            await app.gateway.stop()
    # every assignment's pool wait was observed; the ranks are empty again
    assert f'fleetgate_dp_pool_wait_seconds_count{{pool="short"}} {len(TRACE)}.0' in gw_metrics
    for g in range(G):
        assert f'fleetgate_dp_rank_load_tokens{{pool="short",rank="{g}"}} 0.0' in gw_metrics
    assert 'fleetgate_dp_imbalance_tokens{pool="short"} 0.0' in gw_metrics
    return _decisions(log, ids), emu_metrics


async def test_both_drivers_assign_the_same_ranks_in_the_same_order():
    sim = _simulated()
    # the first eight fill the ranks in turn (most free slots, lowest index); each
    # completion gives its rank to the oldest pooled request
    sends = [(rid, what) for rid, what in sim if what.startswith("send")]
    assert sends[:8] == [(f"f{i}", f"send {r}") for i, r in enumerate([0, 1, 2, 3, 0, 1, 2, 3])]
    assert [what for rid, what in sim if rid == "p0"] == ["wait", "send 0", "done ok"]
    live, emu_metrics = await _live()
    assert live == sim, ("gateway", live)
    # the emulated group exports its ranks as vLLM's DP engines do: one `engine` each
    for g in range(G):
        assert f'vllm:num_requests_running{{engine="{g}",model_name="{MODEL}"}}' in emu_metrics


async def test_live_rank_loads_follow_the_engines_usage():
    """The gateway in front of an emulated DP group: a streamed chat answer's load counts
    its tokens, not the role-only first event (its count equals the engine's usage when
    the request ends); a whole answer's usage teaches the group its decode rate; a whole
    answer still running then counts more than its prompt; every load leaves with its
    request."""
    from tests.procs import procs

    seen: list[tuple[str, int, int]] = []  # (request, count before the usage, usage)
    with procs() as ps, _client_ids() as ids:
        emu = emulator(
            ps, "dp2", 8192, "--time-scale", "1.0", "--data-parallel-size", "2",
            "--max-num-seqs", "2",
        ).wait_ready()  # fmt: skip
        cfg = gateway_config([emu.url], [])
        cfg["pools"]["short"].update(  # type: ignore[index]
            kind="dp_group", dp_group={"ranks": 2, "slots": 2, "assigner": {"policy": "bfio"}}
        )
        app = create_app(load_config(data=cfg, environ={}))
        await app.gateway.start()
        try:
            driver = app.gateway.driver
            assert driver is not None
            group = driver.core.groups["short"]
            reconcile = group.reconcile

            def spy(key: str, rank: int, completion: int, prompt: int | None, now: float) -> None:
                seen.append((key, group.running[rank][key].generated, completion))
                reconcile(key, rank, completion, prompt, now)

            group.reconcile = spy  # type: ignore[method-assign]
            loop = asyncio.get_running_loop()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                         timeout=60) as c:  # fmt: skip
                chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 30, "ignore_eos": True, "stream": True}  # fmt: skip
                r = await c.post("/v1/chat/completions", json=chat, headers={"x-request-id": "s"})
                assert r.status_code == 200 and "[DONE]" in r.text
                whole = {"model": MODEL, "prompt": list(range(1000, 1100)), "max_tokens": 60,
                         "ignore_eos": True}  # fmt: skip
                r = await c.post("/v1/completions", json=whole, headers={"x-request-id": "w"})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 60
                assert group.rate is not None and group.rate > 0
                long = {**whole, "max_tokens": 400}
                task = asyncio.create_task(
                    c.post("/v1/completions", json=long, headers={"x-request-id": "l"})
                )
                deadline = time.monotonic() + 20
                while sum(group.loads(loop.time())) <= 100 + 20:
                    assert time.monotonic() < deadline, "the whole answer's load never grew"
                    await asyncio.sleep(0.01)
                assert (await task).status_code == 200
            assert group.loads() == [0, 0] and not group.pooled and not group.whole
        finally:
            await app.gateway.stop()
    by_id = {ids.get(k, k): (before, usage) for k, before, usage in seen}
    assert by_id["s"] == (30, 30)  # streamed: exactly the tokens, the role event not one
    assert by_id["w"] == (0, 60)  # whole: nothing streamed, the usage at the end
    assert by_id["l"][1] == 400


async def test_per_rank_ports_serve_one_lockstep_group_through_the_gateway():
    """`--data-parallel-rank-ports BASE` (vLLM's external load balancing: an API server per
    rank): port BASE + g answers as rank g whatever rank the request names, the ranks stay
    one group (one /metrics with every rank), and a dp_group pool listing the G per-rank
    endpoints in rank order sends rank g's requests to port BASE + g."""
    from tests.procs import free_ports, procs

    def generated(text: str) -> list[float]:
        out = [0.0, 0.0]
        for line in text.splitlines():
            for g in (0, 1):
                if line.startswith(f'vllm:generation_tokens_total{{engine="{g}"'):
                    out[g] = float(line.rsplit(" ", 1)[1])
        return out

    with procs() as ps:
        base = free_ports(2)
        emu = emulator(
            ps, "dp2ports", 8192, "--data-parallel-size", "2", "--max-num-seqs", "1",
            "--data-parallel-rank-ports", str(base),
        ).wait_ready()  # fmt: skip
        urls = [f"http://127.0.0.1:{base + g}" for g in (0, 1)]
        body = {"model": MODEL, "prompt": list(range(1000, 1050)), "max_tokens": 7,
                "ignore_eos": True}  # fmt: skip
        # the port decides, not the header (a per-rank server has only its own rank)
        r = httpx.post(urls[1] + "/v1/completions", json=body, timeout=30,
                       headers={"x-data-parallel-rank": "0"})  # fmt: skip
        assert r.status_code == 200, r.text
        assert generated(httpx.get(emu.url + "/metrics", timeout=5).text) == [0.0, 7.0]
        assert generated(httpx.get(urls[0] + "/metrics", timeout=5).text) == [0.0, 7.0]

        cfg = gateway_config(urls, [])
        cfg["pools"]["short"].update(  # type: ignore[index]
            kind="dp_group",
            dp_group={"ranks": 2, "slots": 1, "assigner": {"policy": "fcfs_maxfree"}},
        )
        app = create_app(load_config(data=cfg, environ={}))
        await app.gateway.start()
        try:
            driver = app.gateway.driver
            assert driver is not None
            group = driver.core.groups["short"]
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw",
                                         timeout=60) as c:  # fmt: skip
                long = {**body, "max_tokens": 200}
                first = asyncio.create_task(c.post("/v1/completions", json=long))
                deadline = time.monotonic() + 20
                while not group.running[0]:  # one slot a rank: the first takes rank 0
                    assert time.monotonic() < deadline, "the first request never ran"
                    await asyncio.sleep(0.001)
                second = await c.post("/v1/completions", json={**body, "max_tokens": 11})
                assert second.status_code == 200 and (await first).status_code == 200
            assert group.loads() == [0, 0] and not group.pooled
        finally:
            await app.gateway.stop()
        # rank 0's request went to BASE + 0, rank 1's to BASE + 1 (no rank header sent)
        assert generated(httpx.get(emu.url + "/metrics", timeout=5).text) == [200.0, 18.0]
