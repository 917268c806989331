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
