"""A `kind: pd` pool's configuration (gateway/config.py `check_pd_pool`,
gateway/config_pd.py): refused at start with the full key path, and what the core gets."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cache_wiring import gateway_core_spec
from gateway.config import ConfigError, load_config


def _pd(**pool: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": "pd",
        "max_model_len": 8192,
        "models": ["m"],
        "pd": {"protocol": "vllm"},
        "workers": [
            {"url": "http://127.0.0.1:1", "role": "prefill"},
            {"url": "http://127.0.0.1:2", "role": "decode"},
        ],
    }
    base.update(pool)
    return {"pools": {"short": base}}


def _refused(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(data=data, environ={})
    return str(info.value)


def test_a_pd_pool_reaches_the_core_with_its_protocol_and_selector():
    cfg = load_config(
        data=_pd(pd={"protocol": "vllm", "pair": {"policy": "round_robin"}}), environ={}
    )
    spec = gateway_core_spec(cfg).pd_pools["short"]
    assert spec.protocol == "vllm" and spec.pair.policy == "round_robin"
    assert [w.role for w in cfg.pools["short"].workers] == ["prefill", "decode"]


@pytest.mark.parametrize(
    ("pool", "says"),
    [
        ({"pd": None}, "pd.protocol"),
        ({"pd": {"protocol": "trtllm"}}, "protocol"),
        ({"pd": {"protocol": "vllm", "pair": {"policy": "nope"}}}, "kv_cost_decode_load"),
        ({"pd": {"protocol": "vllm", "pair": {"params": {"x": 1}}}}, "unknown parameter"),
        ({"workers": [{"url": "http://127.0.0.1:1", "role": "prefill"}]}, "decode worker"),
        ({"workers": [{"url": "http://127.0.0.1:1"}]}, "workers.0.role"),
        (
            {"workers": [{"url": "http://127.0.0.1:1", "role": "prefill", "engine": "sglang"}]},
            "workers.0.engine",
        ),
        (
            {
                "workers": [
                    {"url": "http://127.0.0.1:1", "role": "prefill", "bootstrap_port": 8998},
                    {"url": "http://127.0.0.1:2", "role": "decode"},
                ]
            },
            "workers.0.bootstrap_port",
        ),
    ],
)
def test_a_bad_pd_pool_is_refused_naming_the_key(pool: dict[str, Any], says: str):
    msg = _refused(_pd(**pool))
    assert "pools.short" in msg and says in msg


def test_roles_belong_to_pd_pools_only():
    data = {
        "pools": {
            "short": {
                "max_model_len": 8192,
                "models": ["m"],
                "workers": [{"url": "http://127.0.0.1:1", "role": "decode"}],
            }
        }
    }
    assert "kind: pd" in _refused(data)


def test_an_sglang_prefill_may_name_its_bootstrap_port():
    cfg = load_config(
        data=_pd(
            pd={"protocol": "sglang"},
            workers=[
                {
                    "url": "http://127.0.0.1:1",
                    "role": "prefill",
                    "engine": "sglang",
                    "bootstrap_port": 8998,
                },
                {"url": "http://127.0.0.1:2", "role": "decode", "engine": "sglang"},
            ],
        ),
        environ={},
    )
    assert cfg.pools["short"].workers[0].bootstrap_port == 8998


def test_a_running_fleet_refuses_pd_changes_it_cannot_make():
    from gateway.workers import Fleet, FleetError

    cfg = load_config(data=_pd(), environ={})
    fleet = Fleet(cfg)
    assert [w.role for w in fleet.pools["short"]] == ["prefill", "decode"]
    fleet.apply(load_config(data=_pd(), environ={}))  # the same: fine
    grown = _pd()
    grown["pools"]["short"]["workers"].append({"url": "http://127.0.0.1:3", "role": "decode"})
    diff = fleet.apply(load_config(data=grown, environ={}))  # a decode joins: fine
    assert diff.added == ("127.0.0.1:3",) or list(diff.added) == ["127.0.0.1:3"]
    swapped = _pd()
    swapped["pools"]["short"]["workers"][1]["role"] = "prefill"
    swapped["pools"]["short"]["workers"].append({"url": "http://127.0.0.1:4", "role": "decode"})
    with pytest.raises(FleetError, match="role"):
        fleet.apply(load_config(data=swapped, environ={}))
    other = _pd(pd={"protocol": "vllm", "pair": {"policy": "random"}})
    with pytest.raises(FleetError, match="restart"):
        fleet.apply(load_config(data=other, environ={}))
