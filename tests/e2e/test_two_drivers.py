"""The same requests through both drivers of the pipeline: the gateway (real time, HTTP,
an emulated engine) and the simulator (virtual time, the engine model). A policy's hooks
(policies/hooks.py) see the same events in the same order in both; both place the same
requests on the same pools with the same `Intake`; every worker slot comes back."""

from __future__ import annotations

import httpx
import pytest

from gateway.app import create_app
from gateway.config import load_config
from policies.types import Category
from simulator.run import run
from simulator.workloads import RequestSpec
from tests.e2e.fleet import MODEL, emulator, gateway_config
from tests.hook_events import Events
from tests.unit.simulator.conftest import small

pytestmark = pytest.mark.e2e


# (id, prompt tokens, max tokens): short, long (beyond the short pool), too long for any
TRACE = [("t0", 300, 16), ("t1", 6000, 16), ("t2", 70000, 16)]
EXPECTED = {
    "t0": ["arrival", "dispatch", "first_token", "complete:ok"],
    "t1": ["arrival", "dispatch", "first_token", "complete:ok"],
    "t2": [],  # refused at placement (400): policies never hear of it
}


def _simulated() -> tuple[Events, dict[str, str | None]]:
    events = Events()
    sc = small(
        pools=[
            {"name": "short", "workers": 1, "max_model_len": 4096},
            {"name": "long", "workers": 1, "max_model_len": 65536},
        ],
        policy={"placement": {"policy": "compress_and_route", "short_pool": "short",
                              "b_short": 4096}},
    )  # fmt: skip
    specs = [
        RequestSpec(id=rid, arrival=0.1 * (i + 1), prompt_tokens=p, output_tokens=m,
                    max_tokens=m, category=Category.CODE, model="model")
        for i, (rid, p, m) in enumerate(TRACE)
    ]  # fmt: skip
    res = run(sc, specs=specs, hooks=(events,))
    return events, {r.id: r.pool for r in res.records}


async def _live(tmp_path) -> tuple[Events, dict[str, str | None]]:
    from tests.procs import procs

    events = Events()
    pools: dict[str, str | None] = {}
    with procs() as ps:
        short = emulator(ps, "two-short", 4096).wait_ready()
        long = emulator(ps, "two-long", 65536).wait_ready()
        cfg = gateway_config([short.url], [long.url])
        cfg["pools"]["short"]["max_model_len"] = 4096
        cfg["placement"] = {"policy": "compress_and_route", "short_pool": "short"}
        app = create_app(load_config(data=cfg, environ={}))
        await app.gateway.start()
        try:
            app.gateway.pipeline.hooks = (events,)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                for rid, prompt, max_tokens in TRACE:
                    # token ids: the gateway's count is exact, as the simulator's is;
                    # streamed: the gateway sees a first token only in a stream
                    body = {"model": MODEL, "prompt": list(range(1000, 1000 + prompt)),
                            "max_tokens": max_tokens, "ignore_eos": True,
                            "stream": True}  # fmt: skip
                    seen = len(events.seen)
                    r = await c.post("/v1/completions", json=body, headers={"x-request-id": rid})
                    pools[rid] = r.headers.get("x-fleetgate-pool")
                    # policies know a request by the gateway's own id, never the client's
                    # (gateway/request_ids.py): name its events by the trace's
                    own = {r for r, _ in events.seen[seen:]}
                    assert rid not in own and len(own) <= 1
                    events.seen[seen:] = [(rid, e) for _, e in events.seen[seen:]]
            for w in app.gateway.fleet.workers.values():
                assert w.in_flight == 0 and w.outstanding_tokens == 0  # every slot came back
        finally:
            await app.gateway.stop()
    return events, pools


async def test_both_drivers_see_the_same_events_and_decisions(tmp_path):
    sim_events, sim_pools = _simulated()
    live_events, live_pools = await _live(tmp_path)
    for rid, _, _ in TRACE:
        assert sim_events.of(rid) == EXPECTED[rid], ("simulator", rid, sim_events.of(rid))
        assert live_events.of(rid) == EXPECTED[rid], ("gateway", rid, live_events.of(rid))
    assert sim_pools == live_pools == {"t0": "short", "t1": "long", "t2": None}
