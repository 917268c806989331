"""The planner fed by the gateway's own traffic: /admin/plan/histogram, /admin/plan and
`fleetgate plan --from-gateway`."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, start_gateway
from tests.procs import ROOT, env, procs

pytestmark = pytest.mark.e2e

KEY = "admin-secret"


@pytest.fixture(scope="module")
def gw():
    with procs() as ps:
        s = emulator(ps, "s", 8192).wait_ready()
        long = emulator(ps, "l", 65536).wait_ready()
        cfg = gateway_config([s.url], [long.url], auth={"admin_key": KEY})
        yield start_gateway(ps, cfg)


def test_admin_routes_need_the_key(gw):
    for headers in ({}, {"authorization": "Bearer wrong"}):
        r = httpx.get(gw.url + "/admin/plan/histogram", headers=headers)
        assert r.status_code == 403
        assert r.json()["error"]["type"] == "permission_error"


def test_admin_disabled_without_a_key(fresh_procs):
    s = emulator(fresh_procs, "s", 8192).wait_ready()
    g = start_gateway(fresh_procs, gateway_config([s.url], []))
    r = httpx.get(g.url + "/admin/plan", headers={"authorization": "Bearer x"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"


def test_histogram_counts_what_was_served_and_the_plan_uses_it(gw):
    auth = {"authorization": f"Bearer {KEY}"}
    r = httpx.get(gw.url + "/admin/plan", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_traffic"
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    for max_tokens in (10, 20, 300, 900):
        c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens
        )
    doc = httpx.get(gw.url + "/admin/plan/histogram", headers=auth).json()
    assert doc["schema"] == "fleetgate.plan_histogram/v1"
    assert doc["requests"] == 4
    assert sum(n for _, n in doc["buckets"]) + doc["overflow"] == 4
    counts = dict(map(tuple, doc["buckets"]))
    assert (
        counts[64] == 2 and counts[512] == 1 and counts[1024] == 1
    )  # L_total = estimate + max_tokens
    assert doc["current"] == {"b_short": 8192, "gamma": 1.5, "n_short": 1, "n_long": 1}

    plan = httpx.get(gw.url + "/admin/plan?slo_ms=500", headers=auth, timeout=60).json()
    assert plan["histogram"]["requests"] == 4
    text = json.dumps(plan)
    assert "b_short" in text and "gamma" in text
    bad = httpx.get(gw.url + "/admin/plan?slo_ms=abc", headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "slo_ms"


def _plan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetgate", "plan", *args],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plan_cli_from_gateway(gw):
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=50
    )
    out = _plan_cli("--from-gateway", gw.url, "--admin-key", KEY, "--json")
    # an SLO no fleet meets is a finding in the answer, not an exit status (--strict)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["schema"] == "fleetgate.live_plan/v1"
    denied = _plan_cli("--from-gateway", gw.url, "--admin-key", "nope")
    assert denied.returncode != 0 and "403" in denied.stderr


def test_band_requests_of_every_category_count_for_p_c(gw):
    """The observed p_c divides by every request in the C&R band: a code prompt there is
    never compressed (it goes long) but counts as borderline, so p_c is not overstated."""
    auth = {"authorization": f"Bearer {KEY}"}
    before = httpx.get(gw.url + "/admin/plan/histogram", headers=auth).json()["compression"]
    # 560 small functions: estimated inside the band (8,192, 12,288] of B 8,192, γ 1.5
    code = "".join(f"def handler_{i}(request, value):\n    return value * {i} + len(request)\n\n"
                   for i in range(560))  # fmt: skip
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": code}], max_tokens=16
    )
    doc = httpx.get(gw.url + "/admin/plan/histogram", headers=auth).json()
    after = doc["compression"]
    assert after["borderline"] == before["borderline"] + 1
    assert after["attempted"] == before["attempted"]


def test_plan_sized_from_the_entitlements(fresh_procs):
    """`?source=promised|demand`: the arrival rate is the entitled tokens/s over the
    observed mean tokens per request, so raising an entitlement's baseline (admin API)
    grows the recommended fleet before any of that traffic arrives."""
    s = emulator(fresh_procs, "s", 8192).wait_ready()
    long = emulator(fresh_procs, "l", 65536).wait_ready()
    ent = {"pool": "p", "class": "guaranteed", "tokens_per_s": 2000.0,
           "kv_bytes": 1 << 40, "concurrency": 64}  # fmt: skip
    cfg = gateway_config(
        [s.url], [long.url],
        auth={"admin_key": KEY, "entitlements_admin_key": KEY},
        admission={"policy": "token_pools", "params": {
            "pools": {"p": {"slots": 1024, "tokens_per_s": 1e9, "kv_bytes": 1 << 50,
                            "bytes_per_token": 1}},
            "entitlements": {"team": ent, "spare": ent | {"state": "pending"}},
            "default_entitlement": "team"}},
    )  # fmt: skip
    g = start_gateway(fresh_procs, cfg)
    auth = {"authorization": f"Bearer {KEY}"}
    r = httpx.get(g.url + "/admin/plan?source=promised", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["code"] == "no_traffic"
    c = openai.OpenAI(base_url=g.url + "/v1", api_key="x", max_retries=0)
    for max_tokens in (100, 200, 300, 400):
        c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens
        )

    def plan(source: str) -> dict:
        r = httpx.get(g.url + f"/admin/plan?source={source}", headers=auth, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    small = plan("promised")
    basis = small["entitlements"]
    assert basis["tokens_per_s"] == 2000.0  # bound entitlements only: `spare` is pending
    assert basis["arrival_rate"] == pytest.approx(2000.0 / basis["mean_tokens_per_request"])
    assert small["observed"]["arrival_rate"] == pytest.approx(basis["arrival_rate"])
    assert 100 < basis["mean_tokens_per_request"] < 1024
    assert plan("demand")["entitlements"]["tokens_per_s"] >= 2000.0
    assert "entitlements" not in plan("observed")

    r = httpx.patch(g.url + "/admin/entitlements/team", json={"tokens_per_s": 400000.0},
                    headers=auth)  # fmt: skip
    assert r.status_code == 200, r.text
    big = plan("promised")
    assert big["entitlements"]["tokens_per_s"] == 400000.0
    assert big["recommended"]["total_gpus"] > small["recommended"]["total_gpus"]
    bad = httpx.get(g.url + "/admin/plan?source=guess", headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "source"


def test_plan_from_entitlements_needs_token_pools(gw):
    auth = {"authorization": f"Bearer {KEY}"}
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10
    )
    r = httpx.get(gw.url + "/admin/plan?source=promised", headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "source"
