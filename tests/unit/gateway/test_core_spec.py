"""One policy schema (policies/spec.py): the gateway's configuration carries `PolicySpec`'s
sections at its top level, a scenario under `policy:`; both take the one translation into
the composition root's terms (`core_spec` → policies/build.py `build_core`)."""

from __future__ import annotations

import pytest

from gateway.config import GatewayConfig, load_config
from policies.build import build_core
from policies.clock import ManualClock
from policies.spec import PolicySpec, RoutingSpec
from simulator.run import core_spec as scenario_spec
from simulator.scenario import PoolModel, Scenario
from tests.e2e.fleet import gateway_config
from tests.unit.simulator.conftest import small


def test_a_pool_may_route_with_its_own_policy():
    cfg = gateway_config(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    cfg["routing"] = {"policy": "least_loaded"}
    cfg["pools"]["long"]["routing"] = {"policy": "round_robin"}  # type: ignore[index]
    core, predictor = build_core(load_config(data=cfg, environ={}).core_spec(), ManualClock())
    assert predictor is None
    assert core.router_for("long").name == "round_robin"  # type: ignore[attr-defined]
    assert core.router_for("short").name == "least_loaded"  # type: ignore[attr-defined]


def test_the_policy_sections_are_one_type_in_both_schemas():
    from gateway.config import Pool

    assert issubclass(GatewayConfig, PolicySpec)  # the policy sections at its top level
    assert Scenario.model_fields["policy"].annotation is PolicySpec
    for pool in (Pool, PoolModel):  # a pool's own routing
        assert pool.model_fields["routing"].annotation == RoutingSpec | None


POLICY = {
    "placement": {"policy": "compress_and_route", "short_pool": "short", "b_short": 8192},
    "admission": {"policy": "concurrency", "params": {"limit": 3}},
    "dispatch": {"max_waiting": 10, "timeout_s": 5.0, "prefill_room": 4096},
    "routing": {"policy": "power_of_two"},
    "retry": {"max_retries": 0},
    "breaker": {"failures": 2, "open_s": 3.0},
    "budget": {"bytes_per_token": 3.5},
    "health": {"interval_s": 0.5, "unhealthy_after": 3},
}


def test_the_same_policy_yaml_is_the_same_policy_in_the_gateway_and_a_scenario():
    cfg = gateway_config(["http://127.0.0.1:1"], ["http://127.0.0.1:2"], **POLICY)
    cfg["pools"]["long"]["routing"] = {"policy": "round_robin"}  # type: ignore[index]
    gateway = load_config(data=cfg, environ={})
    pools = [
        {"name": "short", "workers": 1, "max_model_len": 8192},
        {
            "name": "long",
            "workers": 1,
            "max_model_len": 65536,
            "routing": {"policy": "round_robin"},
        },
    ]
    scenario = small(pools=pools, policy=POLICY)
    assert PolicySpec.model_validate(gateway.model_dump(include=set(PolicySpec.model_fields))) == (
        scenario.policy
    )
    assert gateway.core_spec() == scenario_spec(scenario)


def test_a_scenario_in_the_layout_before_the_shared_schema_still_loads():
    old = small(
        policy={
            "dispatch": {"capacity": "engine", "timeout_s": 9.0},
            "budget": {"estimate": "bytes", "bytes_per_token": {"chat": 3.0},
                       "prior_bytes_per_token": 5.0},
            "compression": {"shortenable": {"chat": {"mean": 0.5}}},
        }
    )  # fmt: skip
    assert old.fleet.capacity == "engine" and old.policy.dispatch.timeout_s == 9.0
    assert old.sim.budget == "bytes" and old.sim.bytes_per_token == {"chat": 3.0}
    assert old.policy.budget.bytes_per_token == 5.0
    assert old.sim.compression.shortenable["chat"].mean == 0.5  # type: ignore[index]
    # the simulator's own defaults where the scenario leaves the keys out
    assert old.policy.placement.policy == "short_long" and old.policy.placement.b_short == 8192
    assert old.policy.dispatch.max_waiting == 1_000_000


@pytest.mark.parametrize(
    ("policy", "where"),
    [
        ({"routing": {"policy": "nope"}}, r"policy\.routing\.policy: unknown 'nope'"),
        ({"breaker": {"failures": 0}}, r"policy\.breaker\.failures"),
        ({"retry": {"max_retries": 1, "extra": 1}}, r"policy\.retry\.extra: unknown key"),
    ],
)
def test_a_scenario_names_the_full_key_path_as_the_gateway_does(policy, where):
    from simulator.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=where):
        small(policy=policy)
