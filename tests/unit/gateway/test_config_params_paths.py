"""`admission.params` of token_pools: numbers in exponent notation read from YAML, and
every validation error named by its full key path (`admission.params.<...>`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, yaml_load

POOLS = {"short": {"max_model_len": 8192, "models": ["m"], "workers": [{"url": "http://h:1"}]}}
POOL = {"slots": 4, "tokens_per_s": 100, "kv_bytes": 1000, "bytes_per_token": 1}
ENT = {"pool": "p", "class": "guaranteed", "tokens_per_s": 10, "kv_bytes": 100, "concurrency": 2}


def load(params: dict) -> None:
    data = {"pools": POOLS, "admission": {"policy": "token_pools", "params": params}}
    load_config(data=data, environ={})


def error(params: dict) -> str:
    with pytest.raises(ConfigError) as err:
        load(params)
    return str(err.value)


YAML = """
pools:
  short: {max_model_len: 8192, models: [m], workers: [{url: "http://h:1"}]}
admission:
  policy: token_pools
  params:
    pools:
      p: {slots: 1000000, tokens_per_s: 1.0e12, kv_bytes: 1e18, bytes_per_token: 1}
    entitlements:
      a: {pool: p, class: guaranteed, tokens_per_s: 1E11, kv_bytes: 5.0e17, concurrency: 1e6}
"""


def test_exponent_notation_reads_as_numbers_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(YAML)
    c = load_config(path, environ={})
    params = c.admission.policy_params()
    assert params["pools"]["p"]["tokens_per_s"] == 1e12
    assert params["entitlements"]["a"]["tokens_per_s"] == 1e11


def test_exponent_notation_in_an_environment_override(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(YAML)
    env = {"FLEETGATE_ADMISSION__PARAMS__CONTROL_INTERVAL_S": "5e-1"}
    c = load_config(path, environ=env)
    assert c.admission.params["control_interval_s"] == 0.5


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1.0e12", 1e12), ("1e12", 1e12), ("-2E-3", -0.002), (".5e3", 500.0),
        ("1.0e+12", 1e12), ("12", 12), ("1_000", 1000), ("1.5", 1.5), ("0x1F", 31),
        ('"1e3"', "1e3"), ("1e", "1e"), ("12e3abc", "12e3abc"), ("e12", "e12"),
    ],
)  # fmt: skip
def test_yaml_scalars(text: str, value: object) -> None:
    got = yaml_load(f"v: {text}")["v"]
    assert got == value and type(got) is type(value)


def test_whole_floats_are_taken_for_counts() -> None:
    load({"pools": {"p": POOL | {"kv_bytes": 8.0e9, "slots": 1e3}}, "entitlements": {"a": ENT}})


@pytest.mark.parametrize(
    ("params", "where"),
    [
        # a number quoted (or written in a form YAML 1.1 reads as text): the path and the fix
        ({"pools": {"p": POOL | {"tokens_per_s": "1.0e12"}}},
         "admission.params.pools.p.tokens_per_s: must be a number, got the string '1.0e12'; "
         "YAML 1.1"),
        ({"pools": {"p": POOL}, "control_interval_s": "1e3"},
         "admission.params.control_interval_s: must be a number"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"tokens_per_s": "fast"}}},
         "admission.params.entitlements.a.tokens_per_s: must be a number, got the string 'fast'"),
        ({"pools": {"p": POOL | {"slots": 2.5}}},
         "admission.params.pools.p.slots: must be a whole number"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"class": "gold"}}},
         "admission.params.entitlements.a.class: must be one of dedicated, guaranteed"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"state": "asleep"}}},
         "admission.params.entitlements.a.state: must be one of pending, bound"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"pool": "q"}}},
         "admission.params.entitlements.a.pool: no pool 'q'"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"kv_bytes": -1}}},
         "admission.params.entitlements.a.kv_bytes: cannot be negative"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"concurrency": 0}}},
         "admission.params.entitlements.a.concurrency: a guaranteed entitlement needs a positive"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"window_s": 0}}},
         "admission.params.entitlements.a.window_s: must be positive"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"slo_target_ms": -5}}},
         "admission.params.entitlements.a.slo_target_ms: must be positive"),
        ({"pools": {"p": POOL}, "entitlements": {"a": ENT | {"bogus": 1}}},
         "admission.params.entitlements.a.bogus: unknown parameter"),
        ({"pools": {"p": POOL}, "entitlements": {"a": 5}},
         "admission.params.entitlements.a: must be a mapping"),
        ({"pools": {"p": POOL}, "entitlements": {"a": {"class": "spot"}}},
         "admission.params.entitlements.a.pool: required"),
        ({"pools": {"p": POOL | {"slots": 0}}}, "admission.params.pools.p.slots: must be positive"),
        ({"pools": {"p": POOL | {"window_s": -1}}},
         "admission.params.pools.p.window_s: must be positive"),
        ({"pools": {"p": {"slots": 4, "kv_bytes": 9, "bytes_per_token": 1}}},
         "admission.params.pools.p.tokens_per_s: required"),
        ({"pools": {"p": {k: v for k, v in POOL.items() if k != "bytes_per_token"}}},
         "admission.params.pools.p: give exactly one of bytes_per_token, kv_geometry"),
        ({"pools": {"p": {**{k: v for k, v in POOL.items() if k != "bytes_per_token"},
                          "kv_geometry": {"layers": 2, "kv_heads": 1, "head_dim": "x"}}}},
         "admission.params.pools.p.kv_geometry.head_dim: must be a whole number"),
        ({"pools": {"p": {**{k: v for k, v in POOL.items() if k != "bytes_per_token"},
                          "kv_geometry": {"layers": 0, "kv_heads": 1, "head_dim": 8}}}},
         "admission.params.pools.p.kv_geometry: KV geometry"),
        ({"pools": {"p": {**{k: v for k, v in POOL.items() if k != "bytes_per_token"},
                          "kv_geometry": {"layerz": 2}}}},
         "admission.params.pools.p.kv_geometry.layerz: unknown parameter"),
        ({"pools": 3}, "admission.params.pools: must be a mapping"),
        ({"pools": {"p": POOL}, "bogus": 1}, "admission.params.bogus: unknown parameter"),
        ({"pools": {"p": POOL}, "default_entitlement": "zz"},
         "admission.params.default_entitlement: 'zz' is not an entitlement"),
        ({"pools": {"p": POOL}, "default_max_tokens": 0},
         "admission.params.default_max_tokens: must be at least 1"),
        ({"pools": {"p": POOL}, "control_interval_s": 0},
         "admission.params.control_interval_s: must be positive"),
        ({"pools": {"p": POOL}, "hold_ttl_s": -1}, "admission.params.hold_ttl_s: must be positive"),
        ({"pools": {"p": POOL}, "heartbeat_ttl_s": 0},
         "admission.params.heartbeat_ttl_s: must be positive"),
        ({"pools": {"p": POOL}, "state_retry_s": 0},
         "admission.params.state_retry_s: must be positive"),
        ({"pools": {"p": POOL}, "alpha_debt": -1}, "admission.params.alpha_debt: cannot be negative"),
        ({"pools": {"p": POOL}, "gamma_burst": 1.0}, "admission.params.gamma_burst: must be in [0, 1)"),
        ({"pools": {"p": POOL}, "class_weights": {"gold": 1}},
         "admission.params.class_weights.gold: must be one of"),
        ({"pools": {"p": POOL}, "class_weights": {"spot": "high"}},
         "admission.params.class_weights.spot: must be a number"),
        ({"pools": {"p": POOL}, "store": "disk"}, "admission.params.store:"),
    ],
)  # fmt: skip
def test_every_params_error_names_its_full_key_path(params: dict, where: str) -> None:
    assert where in error(params)
