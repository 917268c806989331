"""`pools.<name>.kind: dp_group` (policies/dp_config.py): what a data-parallel group pool
needs, refused at start naming the key; the core gets its group (GatewayConfig.core_spec)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import ConfigError, load_config
from policies.dp_group import DpGroupSpec


def _data(workers: int = 1, **dp: Any) -> dict[str, Any]:
    return {
        "pools": {
            "short": {
                "max_model_len": 8192,
                "models": ["m"],
                "kind": "dp_group",
                "dp_group": {"ranks": 4, "slots": 8, **dp},
                "workers": [{"url": f"http://127.0.0.1:{9000 + i}"} for i in range(workers)],
            }
        }
    }


def test_a_dp_group_pool_reaches_the_core():
    dp = {"assigner": {"policy": "bfio", "params": {"lookahead_steps": 2}}}
    spec = load_config(data=_data(**dp), environ={}).core_spec()
    assert spec.dp_groups == {
        "short": DpGroupSpec(4, 8, "bfio", {"lookahead_steps": 2}, 30.0, 4096)
    }
    assert load_config(data=_data(workers=4), environ={}).pools["short"].kind == "dp_group"


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_data(workers=2), r"pools\.short\b.*one endpoint .* or one per rank \(4"),
        (_data(assigner={"policy": "nope"}), r"pools\.short\.dp_group\.assigner.*unknown 'nope'"),
        (
            _data(assigner={"policy": "bfio", "params": {"horizon": 3}}),
            r"pools\.short\.dp_group\.assigner.*params",
        ),
        (_data(ranks=0), r"pools\.short\.dp_group\.ranks"),
    ],
)
def test_a_bad_dp_group_is_named(data: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(data=data, environ={})


def test_dp_group_needs_its_kind_and_the_kind_its_section():
    data = _data()
    data["pools"]["short"].pop("kind")
    with pytest.raises(ConfigError, match=r"pools\.short.*only for kind: dp_group"):
        load_config(data=data, environ={})
    data = _data()
    data["pools"]["short"].pop("dp_group")
    with pytest.raises(ConfigError, match=r"pools\.short.*needs its ranks"):
        load_config(data=data, environ={})
