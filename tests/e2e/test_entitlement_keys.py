"""API keys on a gateway whose only keys name entitlements (token pools, in-memory store):
/v1/models asks for one like the proxy routes do, and a key belongs to one entitlement —
the admin API refuses to give it to a second (409) rather than move that tenant's traffic."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, start_gateway
from tests.procs import procs

pytestmark = pytest.mark.e2e

SECRET = "test-secret-0123456789abcdef"
ADMIN = "ent-admin-key"
BIG = 1 << 50
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def gw():
    ent = {"pool": "p", "class": "guaranteed", "tokens_per_s": 1e9, "kv_bytes": BIG,
           "concurrency": 8}  # fmt: skip
    with procs() as ps:
        emu = emulator(ps, "k-emu", 8192).wait_ready()
        cfg = gateway_config(
            [emu.url], [],
            auth={"keys": {"team-a": ["sk-team-a-1"]}, "key_secret": SECRET,
                  "entitlements_admin_key": ADMIN},
            admission={"policy": "token_pools", "params": {
                "pools": {"p": {"slots": 64, "tokens_per_s": 1e9, "kv_bytes": BIG,
                                "bytes_per_token": 1}},
                "entitlements": {"team-a": ent, "team-z": {**ent, "keys": ["sk-team-z-1"]}}}},
        )  # fmt: skip
        yield start_gateway(ps, cfg)


def test_models_needs_a_key_when_only_entitlement_keys_are_configured(gw):
    """Was: 200 without a key."""
    assert httpx.get(gw.url + "/v1/models").status_code == 401
    r = httpx.get(gw.url + "/v1/models", headers=bearer("sk-unknown"))
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    for key in ("sk-team-a-1", "sk-team-z-1"):
        r = httpx.get(gw.url + "/v1/models", headers=bearer(key))
        assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL
    assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 401


def _conflict(r: httpx.Response, key: str, *names: str) -> None:
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "keys"
    assert key not in r.text  # never the key
    for name in names:
        assert repr(name) in err["message"], err["message"]


def test_a_key_of_another_entitlement_is_refused_with_409(gw):
    """Was: 201, and the configured tenant's traffic silently moved to the new one."""
    a = bearer(ADMIN)
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        body = {"name": "team-b", "pool": "p", "class": "spot", "keys": ["sk-team-a-1"]}
        _conflict(c.post("/admin/entitlements", json=body, headers=a), "sk-team-a-1",
                  "team-b", "team-a")  # fmt: skip
        assert c.get("/admin/entitlements/team-b", headers=a).status_code == 404  # not made
        body = {**body, "keys": ["sk-team-b-1", "sk-team-z-1"]}
        _conflict(c.post("/admin/entitlements", json=body, headers=a), "sk-team-z-1",
                  "team-b", "team-z")  # fmt: skip
        r = c.post("/admin/entitlements", json={**body, "keys": ["sk-team-b-1"]}, headers=a)
        assert r.status_code == 201, r.text
        # an update: the key of a configured entitlement, of one made at run time
        _conflict(c.patch("/admin/entitlements/team-b", json={"keys": ["sk-team-a-1"]},
                          headers=a), "sk-team-a-1", "team-b", "team-a")  # fmt: skip
        _conflict(c.patch("/admin/entitlements/team-a", json={"keys": ["sk-team-b-1"]},
                          headers=a), "sk-team-b-1", "team-a", "team-b")  # fmt: skip
        # its own keys again, and a new one, are fine
        r = c.patch("/admin/entitlements/team-b", json={"keys": ["sk-team-b-1", "sk-team-b-2"]},
                    headers=a)  # fmt: skip
        assert r.status_code == 200 and r.json()["keys"] == 2
        # every tenant's traffic is still its own
        for key, name in (("sk-team-a-1", "team-a"), ("sk-team-z-1", "team-z"),
                          ("sk-team-b-1", "team-b"), ("sk-team-b-2", "team-b")):  # fmt: skip
            r = c.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
            assert r.status_code == 200, r.text
            assert r.headers["x-fleetgate-entitlement"] == name


def test_a_bad_definition_or_an_unknown_name_answers_before_a_key_clash(gw):
    a = bearer(ADMIN)
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        body = {"name": "team-q", "pool": "nope", "class": "spot", "keys": ["sk-team-a-1"]}
        r = c.post("/admin/entitlements", json=body, headers=a)
        assert r.status_code == 400 and r.json()["error"]["param"] == "pool", r.text
        r = c.patch("/admin/entitlements/none", json={"keys": ["sk-team-a-1"]}, headers=a)
        assert r.status_code == 404, r.text
