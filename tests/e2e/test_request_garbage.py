"""A request's objects are freed when it ends, by reference counting: none is left for the
cyclic garbage collector (which then ran every few hundred requests on the proxy's hot
path and cost ~5 % of its CPU per request: the core's ticket and the gateway's attempt
pointed at each other)."""

from __future__ import annotations

import gc

import httpx
import pytest

from gateway.app import create_app
from gateway.attempt import Attempt
from gateway.config import load_config
from policies.intake import Placed
from policies.ticket import Ticket
from policies.types import RequestInfo
from tests.e2e.fleet import MODEL, emulator, gateway_config
from tests.procs import procs

pytestmark = pytest.mark.e2e

PER_REQUEST = (Ticket, Attempt, Placed, RequestInfo)


async def test_a_request_leaves_no_cycle_behind() -> None:
    with procs() as ps:
        emu = emulator(ps, "garbage-emu", 8192).wait_ready()
        app = create_app(load_config(data=gateway_config([emu.url], []), environ={}))
        await app.gateway.start()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
                chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}

                async def ask(n: int) -> None:
                    for stream in (False, True) * n:
                        r = await c.post("/v1/chat/completions", json={**chat, "stream": stream})
                        assert r.status_code == 200, r.text

                await ask(2)  # warm: pools, series, connections
                gc.collect()
                gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept to look at
                try:
                    await ask(5)
                    gc.collect()
                    left = [type(o).__name__ for o in gc.garbage if isinstance(o, PER_REQUEST)]
                finally:
                    gc.set_debug(0)
                    gc.garbage.clear()
                assert left == []
        finally:
            await app.gateway.stop()
