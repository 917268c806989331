"""token_pools in the gateway's configuration (key-path errors) and API keys as HMACs."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from gateway.apikeys import KeyDirectory, key_hash
from gateway.config import ConfigError, load_config
from gateway.tenancy import Tenancy
from policies.admission import ADMITTERS

POOLS = {"short": {"max_model_len": 8192, "models": ["m"], "workers": [{"url": "http://h:1"}]}}
TP = {"pools": {"p": {"slots": 4, "tokens_per_s": 10, "kv_bytes": 100, "bytes_per_token": 1}},
      "entitlements": {"a": {"pool": "p", "class": "spot"}}}  # fmt: skip
SECRET = "s" * 16


def cfg(admission_params: dict, **top):
    data = {"pools": POOLS, "admission": {"policy": "token_pools", "params": admission_params}}
    return load_config(data=data | top, environ={})


def test_store_settings_split_from_the_policy_params():
    c = cfg(
        TP | {"store": "redis", "redis_url": "redis://127.0.0.1:1/0", "fail_open": {"spot": True},
              "expected_replicas": 3}
    )  # fmt: skip
    s = c.admission.store_settings()
    assert s.store == "redis" and s.fail_open == {"spot": True} and s.expected_replicas == 3
    assert cfg(TP).admission.store_settings().expected_replicas == 1
    assert "store" not in c.admission.policy_params()


@pytest.mark.parametrize(
    ("params", "top", "where"),
    [
        (TP | {"redis_url": "http://x"}, {}, "admission.params.redis_url: must be a redis://"),
        (TP | {"store": "disk"}, {}, "admission.params.store:"),
        (TP | {"expected_replicas": 0}, {}, "admission.params.expected_replicas:"),
        (TP | {"expected_replicas": 1.5}, {}, "admission.params.expected_replicas:"),
        (TP | {"fail_open": {"gold": True}}, {}, "admission.params.fail_open.gold:"),
        (TP | {"nonsense": 1}, {}, "nonsense"),
        (TP, {"auth": {"keys": {"zz": ["k" * 10]}, "key_secret": SECRET}}, "auth.keys.zz: no such entitlement"),
        (TP, {"auth": {"keys": {"a": ["k" * 10]}}}, "key_secret: required"),
        (TP | {"follow_workers": {"q": "short"}}, {}, "params.follow_workers.q: no such pool"),
        (TP | {"follow_workers": {"p": "long"}}, {}, "params.follow_workers.p: no fleet pool"),
        (TP | {"follow_workers": {"p": "short"}, "store": "redis"}, {}, "needs the in-memory"),
    ],
)  # fmt: skip
def test_errors_name_the_key_path(params, top, where):
    with pytest.raises(ConfigError) as err:
        cfg(params, **top)
    assert where in str(err.value)


def test_keys_from_auth_and_from_entitlements():
    ents = {"a": {"pool": "p", "class": "spot", "keys": ["sk-a-2"]}}
    c = cfg(TP | {"entitlements": ents}, auth={"keys": {"a": ["sk-a-1"]}, "key_secret": SECRET})
    assert c.entitlement_keys() == {"a": ["sk-a-1", "sk-a-2"]}
    assert c.auth_required
    assert "keys" not in c.admission.policy_params()["entitlements"]["a"]


def test_keys_are_kept_as_hmacs_and_looked_up():
    pre = key_hash(SECRET, "sk-b")
    d = KeyDirectory.build(SECRET, {"a": ["sk-a"], "b": [pre]})
    expected = hmac.new(SECRET.encode(), b"sk-a", hashlib.sha256).hexdigest()  # independent
    assert "hmac-sha256:" + expected in d.configured
    assert "sk-a" not in str(d.configured)
    assert d.entitlement_of("sk-a") == "a" and d.entitlement_of("sk-b") == "b"
    assert d.entitlement_of("sk-c") is None
    d.set_managed("c", [key_hash(SECRET, "sk-c")])
    assert d.entitlement_of("sk-c") == "c"
    d.set_managed("c", [])
    assert d.entitlement_of("sk-c") is None
    assert KeyDirectory.build(SECRET + "x", {"a": ["sk-a"]}).configured != d.configured


def test_a_token_pool_follows_the_workers_in_service_of_its_fleet_pool():
    two = {"short": POOLS["short"] | {"workers": [{"url": "http://h:1"}, {"url": "http://h:2"}]}}
    params = TP | {"follow_workers": {"p": "short"}}
    c = load_config(data={"pools": two, "admission": {"policy": "token_pools", "params": params}},
                    environ={})  # fmt: skip
    admitter = ADMITTERS.make("token_pools", c.admission.policy_params())
    tenancy = Tenancy.of(c, admitter, "r1")
    active = {"short": 2}
    tenancy.fleet_counts = lambda: active
    slots = lambda: admitter.ledger.pools["p"].capacity.slots  # noqa: E731
    tenancy.follow_fleet(1.0)
    assert slots() == 4
    active["short"] = 1  # one worker drained
    tenancy.follow_fleet(2.0)
    assert slots() == 2 and admitter.ledger.pools["p"].capacity.tokens_per_s == 5
    active["short"] = 2  # back in service
    tenancy.follow_fleet(3.0)
    assert slots() == 4


def test_a_token_pool_follows_discovered_workers_too():
    """Was: a fleet pool whose workers are all discovered (Kubernetes) lists none, so the
    token pool kept its configured capacity whatever ran — all of it with no worker in
    service. Now capacity follows the live fleet: the configured capacity is one
    worker's, × the workers in service (the gateway's own Fleet, changed as discovery
    changes it)."""
    from gateway.config import Worker
    from gateway.workers import Fleet

    discovered = {"short": {"max_model_len": 8192, "models": ["m"], "discovery": {
        "kind": "kubernetes", "namespace": "llm", "selector": "app=vllm", "port": "http"}}}  # fmt: skip
    params = TP | {"follow_workers": {"p": "short"}}
    c = load_config(data={"pools": discovered,
                          "admission": {"policy": "token_pools", "params": params}},
                    environ={})  # fmt: skip
    admitter = ADMITTERS.make("token_pools", c.admission.policy_params())
    tenancy = Tenancy.of(c, admitter, "r1")
    fleet = Fleet(c)
    tenancy.fleet_counts, tenancy.fleet_listed = fleet.active_counts, fleet.listed_counts
    slots = lambda: admitter.ledger.pools["p"].capacity.slots  # noqa: E731
    pods = tuple(Worker(url=f"http://10.0.0.{i}:8000") for i in (1, 2, 3))
    fleet.set_discovered("short", pods)
    tenancy.follow_fleet(1.0)
    assert slots() == 12 and admitter.ledger.pools["p"].capacity.tokens_per_s == 30
    fleet.set_discovered("short", pods[:1])  # two pods left
    tenancy.follow_fleet(2.0)
    assert slots() == 4
    fleet.set_discovered("short", ())  # none in service: nothing admitted beyond a slot
    tenancy.follow_fleet(3.0)
    assert slots() == 1
