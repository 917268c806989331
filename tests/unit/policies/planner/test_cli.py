"""`fleetgate plan` as a user runs it: a real process for the table, main() for the rest."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fleetgate.plan import main
from tests.procs import ROOT, env


def test_plan_process_prints_table3(cdfs: dict) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fleetgate", "plan", "--table3"],
        cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    lines = [line for line in out.splitlines() if line.startswith("azure_2023")]
    assert any("48+2=50" in line and line.count("48+2=50") == 2 for line in lines)


def test_plan_json_for_a_named_workload(cdfs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workload", "azure", "--rate", "1000", "--b-short", "4096", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["optimum"]["gamma"] == 2.0 and body["optimum"]["total_gpus"] == 50
    methods = [r["method"] for r in body["rows"]]
    assert methods == ["homogeneous", "pool_routing", "pr_cr", "fleetopt"]
    assert body["rows"][0]["annual_cost_usd"] == pytest.approx(284 * 2.21 * 8760)


def test_explain_prints_every_gamma(cdfs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workload", "lmsys", "--b-short", "1536", "--explain"]) == 0
    out = capsys.readouterr().out
    sweep_lines = [
        ln for ln in out.splitlines() if ln[:4].strip() in {f"{g / 10:.1f}" for g in range(10, 21)}
    ]
    assert len(sweep_lines) == 11


def test_full_sweep_and_infeasible_exit(cdfs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    # agent-heavy's long pool cannot meet 500 ms under Eq. 8: exit 1 and say why
    assert main(["--workload", "agent", "--b-short", "8192", "--exact"]) == 1
    assert "cannot be met" in capsys.readouterr().err
    assert main(["--workload", "agent", "--exact", "--slo-budget", "wait_only", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["optimum"]["b_short"] in {64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096,
                                          6144, 8192, 12288, 16384, 24576, 32768, 49152}  # fmt: skip


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["--workload", "/nonexistent.json"]) == 2
