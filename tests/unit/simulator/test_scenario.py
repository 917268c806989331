from pathlib import Path

import pytest

from simulator.run import build_workload
from simulator.scenario import SCENARIO_DIR, ScenarioError, load, parse


def _doc(**over):
    doc = {
        "name": "x",
        "fleet": {"pools": [{"name": "short", "workers": 1}]},
        "workload": {
            "arrivals": {"kind": "poisson", "rate": 1},
            "components": [{"family": "chat"}],
        },
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_scenario_loads_and_builds_its_workload(path: Path) -> None:
    sc = load(path.stem)
    assert sc.name == path.stem
    assert sc.description
    specs = build_workload(sc, requests=20)
    assert len(specs) == 20
    for pool in sc.fleet.pools:
        sc.engine_config(pool)


def test_unknown_keys_are_named_with_their_path() -> None:
    doc = _doc(fleet={"pools": [{"name": "short", "workers": 1, "wrokers": 2}]})
    with pytest.raises(ScenarioError, match=r"fleet\.pools\.0\.wrokers: unknown key"):
        parse(doc)
    with pytest.raises(ScenarioError, match=r"seeed: unknown key"):
        parse(_doc(seeed=3))


def test_a_bad_policy_parameter_is_named_with_its_path() -> None:
    bad = {"policy": "quartz", "params": {"wait_bound_slo": 0.5, "slo_s": {"long": 0}}}
    with pytest.raises(ScenarioError, match=r"policy\.dispatch\.params\.slo_s\.long: must be"):
        parse(_doc(policy={"dispatch": bad}))
    with pytest.raises(
        ScenarioError, match=r"policy\.dispatch\.params: unknown parameter\(s\) theta"
    ):
        parse(_doc(policy={"dispatch": {"policy": "quartz", "params": {"theta": 1}}}))


def test_engine_and_family_parameters_are_checked_against_their_dataclasses() -> None:
    with pytest.raises(ScenarioError, match="max_num_seq"):
        parse(_doc(fleet={"engine": {"max_num_seq": 3}, "pools": [{"name": "a", "workers": 1}]}))
    bad = _doc(
        workload={
            "arrivals": {"kind": "poisson", "rate": 1},
            "components": [{"family": "rag", "params": {"pasages_min": 2}}],
        }
    )
    with pytest.raises(ScenarioError, match="pasages_min"):
        parse(bad)
    with pytest.raises(ScenarioError, match="needs `cdf`"):
        parse(
            _doc(
                workload={
                    "arrivals": {"kind": "poisson", "rate": 1},
                    "components": [{"family": "cdf"}],
                }
            )
        )


def test_workload_needs_arrivals_and_components_or_a_trace() -> None:
    with pytest.raises(ScenarioError, match="needs `arrivals`"):
        parse(_doc(workload={"components": [{"family": "chat"}]}))
    with pytest.raises(ScenarioError, match="neither"):
        parse(_doc(workload={"trace": {"path": "x"}, "components": [{"family": "chat"}]}))
    with pytest.raises(ScenarioError, match="defined twice"):
        parse(_doc(fleet={"pools": [{"name": "a", "workers": 1}, {"name": "a", "workers": 1}]}))


def test_a_missing_scenario_lists_the_shipped_ones() -> None:
    with pytest.raises(ScenarioError, match="quartz-mixed"):
        load("no-such-scenario")


def test_trace_paths_are_relative_to_the_scenario_file(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(
        '{"ts": 1763700000.5, "request_id": "a", "status": 200, "prompt_tokens": 10, "completion_tokens": 5}\n'
    )
    (tmp_path / "s.yaml").write_text(
        "name: s\nfleet: {pools: [{name: short, workers: 1}]}\nworkload: {trace: {path: t.jsonl}}\n"
    )
    sc = load(str(tmp_path / "s.yaml"))
    assert sc.workload.trace is not None and Path(sc.workload.trace.path) == tmp_path / "t.jsonl"
    assert len(build_workload(sc)) == 1


def _tenant_doc(**extra: object) -> dict:
    doc = {
        "name": "t",
        "fleet": {"pools": [{"name": "main", "workers": 2}]},
        "workload": {
            "components": [{"family": "uniform"}],
            "tenants": [{"name": "a", "arrivals": {"kind": "poisson", "rate": 1}, "leave": 10}],
        },
    }
    doc.update(extra)
    return doc


def test_tenant_workloads_and_events_validate() -> None:
    from simulator.scenario import ScenarioError, parse

    parse(_tenant_doc(events=[{"kind": "workers", "at": 3, "pool": "main", "workers": 1}]))
    with pytest.raises(ScenarioError, match="workers"):
        parse(_tenant_doc(events=[{"kind": "workers", "at": 3, "pool": "main", "workers": 3}]))
    with pytest.raises(ScenarioError, match="token pool"):
        parse(
            _tenant_doc(
                events=[
                    {"kind": "workers", "at": 3, "pool": "main", "workers": 1, "token_pool": "p"}
                ]
            )
        )
    with pytest.raises(ScenarioError, match="entitlement"):
        parse(_tenant_doc(events=[{"kind": "entitlement", "at": 3, "name": "a", "state": "bound"}]))
    bad = _tenant_doc()
    bad["workload"]["arrivals"] = {"kind": "poisson", "rate": 1}
    with pytest.raises(ScenarioError, match="tenants"):
        parse(bad)


def test_a_fault_event_names_a_worker_that_exists() -> None:
    fault = {"kind": "fault", "at": 1, "pool": "main", "worker": 1, "for_s": 5}
    assert parse(_tenant_doc(events=[fault])).events[0].for_s == 5  # type: ignore[union-attr]
    with pytest.raises(ScenarioError, match=r"events\.0\.worker: 2, but pool 'main' has 2"):
        parse(_tenant_doc(events=[{**fault, "worker": 2}]))
    with pytest.raises(ScenarioError, match=r"events\.0: no pool 'nope'"):
        parse(_tenant_doc(events=[{**fault, "pool": "nope"}]))
    with pytest.raises(ScenarioError, match=r"for_s"):
        parse(_tenant_doc(events=[{**fault, "for_s": 0}]))


def test_shipped_token_pool_scenarios_load() -> None:
    from simulator.scenario import load

    for name in ("token-pools-exp1", "token-pools-exp1-off", "token-pools-exp2"):
        assert load(name).workload.tenants
