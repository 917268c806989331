"""Readiness end to end: a gateway in front of a dead fleet is not ready."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.fleet import MODEL, TIME_SCALE, gateway_config, start_gateway, wait_until
from tests.procs import free_port

pytestmark = pytest.mark.e2e


def test_dead_fleet_is_not_ready_from_the_first_request_and_recovers(fresh_procs):
    """Before: the start-up health round only counted one failure against the worker
    (unhealthy_after = 3 here), which kept the benefit of the doubt `healthy = True`, so the
    first /readyz answered 200 "ready" (and vLLM's /health 200) in front of a port with
    nothing listening, until enough checks had failed. Now readiness needs a worker that
    has answered a health check or a scrape since start: 503 from the first request, and
    200 as soon as an engine comes up on that port."""
    port = free_port()  # nothing listens here
    cfg = gateway_config(
        [f"http://127.0.0.1:{port}"],
        [],
        health={"interval_s": 1.0, "timeout_s": 0.5, "unhealthy_after": 3},
    )
    gw = start_gateway(fresh_procs, cfg)  # waits on /healthz only: the process is up
    r = httpx.get(gw.url + "/readyz", timeout=5)
    assert r.status_code == 503, r.text
    assert r.json() == {"status": "no routable worker"}
    assert httpx.get(gw.url + "/health", timeout=5).status_code == 503
    # an engine comes up on that port: ready within a scrape or a health check
    fresh_procs.emulator(
        "late-emu",
        "--model",
        MODEL,
        "--max-model-len",
        "8192",
        "--time-scale",
        TIME_SCALE,
        port=port,
    ).wait_ready()
    assert wait_until(lambda: httpx.get(gw.url + "/readyz", timeout=5).status_code == 200)
    assert httpx.get(gw.url + "/health", timeout=5).status_code == 200
