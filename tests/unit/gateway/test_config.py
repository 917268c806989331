from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[3]

MINIMAL = {
    "pools": {
        "short": {
            "max_model_len": 8192,
            "models": ["m"],
            "workers": [{"url": "http://127.0.0.1:1"}],
        }
    }
}


def test_example_config_validates():
    cfg = load_config(ROOT / "config" / "gateway.yaml", environ={})
    assert set(cfg.pools) == {"short", "long"}
    assert cfg.b_short == 8192
    assert cfg.pools["long"].max_model_len == 65536


def test_unknown_key_is_named():
    data = {**MINIMAL, "routing": {"polcy": "least_loaded"}}
    with pytest.raises(ConfigError, match=r"routing\.polcy: unknown key"):
        load_config(data=data, environ={})


def test_bad_worker_url_is_named():
    data = {
        "pools": {
            "short": {"max_model_len": 1, "models": ["m"], "workers": [{"url": "127.0.0.1:80"}]}
        }
    }
    with pytest.raises(ConfigError, match=r"pools\.short\.workers\.0\.url"):
        load_config(data=data, environ={})


def test_missing_pools():
    with pytest.raises(ConfigError, match="pools"):
        load_config(data={}, environ={})


def test_duplicate_worker_rejected():
    w = {"url": "http://127.0.0.1:1"}
    data = {"pools": {"a": {"max_model_len": 1, "models": ["m"], "workers": [w, w]}}}
    with pytest.raises(ConfigError, match="appears twice"):
        load_config(data=data, environ={})


def test_env_overrides(tmp_path):
    env = {
        "FLEETGATE_LISTEN__PORT": "9123",
        "FLEETGATE_POOLS__SHORT__WORKERS__0__ENGINE": "sglang",
        "OTHER": "x",
    }
    cfg = load_config(data=MINIMAL, environ=env)
    assert cfg.listen.port == 9123
    assert cfg.pools["short"].workers[0].engine == "sglang"


def test_env_override_type_error_is_named():
    with pytest.raises(ConfigError, match=r"listen\.port"):
        load_config(data=MINIMAL, environ={"FLEETGATE_LISTEN__PORT": "eighty"})


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad, environ={})


def _two_pools(**placement: object) -> dict[str, object]:
    return {
        "pools": {
            "small": {"max_model_len": 8192, "models": ["m"], "workers": [{"url": "http://a:1"}]},
            "big": {"max_model_len": 65536, "models": ["m"], "workers": [{"url": "http://b:1"}]},
        },
        "placement": placement,
    }


def test_short_pool_naming_no_pool_is_a_config_error():
    """Before: `placement.short_pool` defaults to "short"; pools named otherwise (or a typo)
    validated, b_short came out 0 and no request ever matched the short pool, so
    Compress-and-Route was silently off (everything went to the long pool, uncompressed)."""
    with pytest.raises(
        ConfigError,
        match=r"placement\.short_pool: no pool named 'short' \(the pools are 'small', 'big'\)",
    ):
        load_config(data=_two_pools(), environ={})
    with pytest.raises(ConfigError, match=r"placement\.short_pool: no pool named 'smal'"):
        load_config(data=_two_pools(short_pool="smal", policy="short_long"), environ={})
    cfg = load_config(data=_two_pools(short_pool="small"), environ={})
    assert cfg.b_short == 8192


def test_b_short_beyond_the_short_pool_context_is_a_config_error():
    """Before: a b_short above the short pool's max_model_len validated, and placement
    quietly capped it at the context (the configured boundary was never in force)."""
    with pytest.raises(
        ConfigError,
        match=r"placement\.b_short: 9000 is larger than the context of the short pool 'small' "
        r"\(max_model_len 8192\)",
    ):
        load_config(data=_two_pools(short_pool="small", b_short=9000), environ={})
    assert (
        load_config(data=_two_pools(short_pool="small", b_short=8192), environ={}).b_short == 8192
    )
    assert (
        load_config(data=_two_pools(short_pool="small", b_short=4096), environ={}).b_short == 4096
    )


def test_env_overrides_leave_the_callers_data_alone():
    """Before: only mappings were copied, lists shallowly, so an override reaching into a
    list item (a pool's worker) changed the caller's dict, and a later load_config with the
    same data (another test, another process config built from one template) saw it."""
    import copy

    data = {
        "pools": {
            "short": {
                "max_model_len": 8192,
                "models": ["m"],
                "workers": [{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"}],
            }
        },
        "listen": {"port": 8080},
    }
    before = copy.deepcopy(data)
    env = {
        "FLEETGATE_LISTEN__PORT": "9123",
        "FLEETGATE_POOLS__SHORT__WORKERS__0__ENGINE": "sglang",
        "FLEETGATE_POOLS__SHORT__MODELS": "[m, n]",
        "FLEETGATE_PLACEMENT__GAMMA": "2.0",  # a section the data lacks
    }
    cfg = load_config(data=data, environ=env)
    assert cfg.listen.port == 9123 and cfg.placement.gamma == 2.0
    assert cfg.pools["short"].workers[0].engine == "sglang"
    assert cfg.pools["short"].models == ["m", "n"]
    assert data == before
    assert load_config(data=data, environ={}).pools["short"].workers[0].engine == "vllm"


def test_placement_is_built_by_name_with_its_params():
    """`placement.policy` names a registered placer (no fixed list in the schema) and
    `placement.params` are its own, checked at start with their key path."""
    with pytest.raises(
        ConfigError, match=r"placement\.policy: unknown 'nope'; known: .*short_long"
    ):
        load_config(data=_two_pools(short_pool="small", policy="nope"), environ={})
    with pytest.raises(ConfigError, match=r"placement\.params: .*unknown parameter\(s\) min_tragt"):
        load_config(data=_two_pools(short_pool="small", params={"min_tragt": 9}), environ={})
    cfg = load_config(data=_two_pools(short_pool="small", params={"min_target": 512}), environ={})
    assert cfg.placement.params == {"min_target": 512}
