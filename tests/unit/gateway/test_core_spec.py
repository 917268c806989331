"""The gateway's configuration in the composition root's terms (gateway/proxy.py
`core_spec` → policies/build.py `build_core`): the same core the simulator builds from a
scenario, per-pool routing included."""

from __future__ import annotations

from gateway.config import load_config
from gateway.proxy import core_spec
from policies.build import build_core
from policies.clock import ManualClock
from simulator.run import core_spec as scenario_spec
from tests.e2e.fleet import gateway_config
from tests.unit.simulator.conftest import small


def test_a_pool_may_route_with_its_own_policy():
    cfg = gateway_config(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    cfg["routing"] = {"policy": "least_loaded"}
    cfg["pools"]["long"]["routing"] = {"policy": "round_robin"}  # type: ignore[index]
    core, predictor = build_core(core_spec(load_config(data=cfg, environ={})), ManualClock())
    assert predictor is None
    assert core.router_for("long").name == "round_robin"  # type: ignore[attr-defined]
    assert core.router_for("short").name == "least_loaded"  # type: ignore[attr-defined]


def test_the_gateway_and_a_scenario_with_the_same_policies_build_the_same_spec():
    cfg = gateway_config(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    cfg["placement"] = {"policy": "compress_and_route", "short_pool": "short", "b_short": 8192}
    cfg["pools"]["long"]["routing"] = {"policy": "round_robin"}  # type: ignore[index]
    cfg["admission"] = {"policy": "concurrency", "params": {"limit": 3}}
    cfg["dispatch"] = {"max_waiting": 10, "timeout_s": 5.0}
    gateway = core_spec(load_config(data=cfg, environ={}))
    pools = [
        {"name": "short", "workers": 1, "max_model_len": 8192},
        {
            "name": "long",
            "workers": 1,
            "max_model_len": 65536,
            "routing": {"policy": "round_robin"},
        },
    ]
    policy = {
        "placement": {"policy": "compress_and_route", "short_pool": "short", "b_short": 8192},
        "admission": {"policy": "concurrency", "params": {"limit": 3}},
        "dispatch": {"max_waiting": 10, "timeout_s": 5.0},
    }
    scenario = scenario_spec(small(pools=pools, policy=policy))
    # the breaker is the gateway's alone (simulated workers keep no breaker state)
    for field in ("placement", "short_pool", "b_short", "gamma", "verify_margin", "routing",
                  "pool_routing", "admission", "dispatch", "prefill_room", "retry"):  # fmt: skip
        assert getattr(gateway, field) == getattr(scenario, field), field
