import json
from pathlib import Path

from simulator.cli import main

SCENARIO = """
name: tiny
description: a tiny scenario for the CLI test
seed: 4
fleet:
  engine: {max_num_seqs: 8}
  pools: [{name: short, workers: 2, max_model_len: 8192}]
workload:
  requests: 100
  arrivals: {kind: poisson, rate: 10}
  components: [{family: chat}]
"""


def test_simulate_writes_the_report_and_figures(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "tiny.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main([str(path), "--out", str(out), "--requests", "60", "--seed", "9"]) == 0
    printed = capsys.readouterr().out
    assert "scenario tiny  seed 9  requests 60" in printed
    assert "events/s" in printed
    rep = json.loads((out / "report.json").read_text())
    assert rep["requests"] == 60 and rep["seed"] == 9
    assert (out / "timeseries.png").stat().st_size > 0
    assert (out / "ttft_cdf.png").stat().st_size > 0


def test_a_bad_scenario_exits_2_naming_the_key(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.yaml"
    path.write_text(SCENARIO.replace("workers: 2", "workers: 2, colour: red"))
    assert main([str(path)]) == 2
    assert "fleet.pools.0.colour: unknown key" in capsys.readouterr().err


def test_list_names_the_shipped_scenarios(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--list"]) == 0
    assert "quartz-mixed" in capsys.readouterr().out
