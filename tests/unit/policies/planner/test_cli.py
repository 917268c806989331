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
    args = ["--workload", "azure", "--rate", "1000", "--b-short", "4096", "--json"]
    assert main([*args, "--compressed-mass", "restricted"]) == 0  # the paper's pricing
    body = json.loads(capsys.readouterr().out)
    assert body["optimum"]["gamma"] == 2.0 and body["optimum"]["total_gpus"] == 50
    assert main(args) == 0  # compressed requests priced as served: 91 + 2
    served = json.loads(capsys.readouterr().out)
    assert served["options"]["compressed_mass"] == "band"
    assert served["optimum"]["gamma"] == 2.0 and served["optimum"]["total_gpus"] == 93
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


def test_unmet_slo_is_a_finding_not_a_failure(
    cdfs: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `fleetgate plan` exited 1 on the paper's own agent-heavy points (Table 3,
    Table 6), whose long prompts' prefill alone exceeds 500 ms in every fleet."""
    assert main(["--workload", "agent", "--b-short", "8192", "--exact"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    # what misses, by how much, and why: the long class's P99 request (46,937 tokens)
    assert "SLO not met" in captured.out
    assert "long pool's P99 TTFT is 879 ms, 379 ms over the 500 ms SLO" in captured.out
    assert "homogeneous fleet misses too" in captured.out
    # --strict keeps a non-zero exit for scripts that want one
    assert main(["--workload", "agent", "--b-short", "8192", "--strict"]) == 1
    capsys.readouterr()
    assert main(["--workload", "agent", "--b-short", "8192", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert not body["optimum"]["slo_met"] and len(body["slo_findings"]) == 1
    assert main(["--workload", "lmsys", "--strict"]) == 0  # met: --strict changes nothing
    capsys.readouterr()
    assert main(["--table6"]) == 0


def test_full_sweep_with_the_wait_only_budget(
    cdfs: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--workload", "agent", "--exact", "--slo-budget", "wait_only", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["optimum"]["b_short"] in {64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096,
                                          6144, 8192, 12288, 16384, 24576, 32768, 49152}  # fmt: skip


def test_b_candidates(cdfs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--workload", "lmsys", "--b-candidates", "1024,1536, 2048", "--json",
                 "--explain"]) == 0  # fmt: skip
    body = json.loads(capsys.readouterr().out)
    assert sorted({cell["b_short"] for cell in body["grid"]}) == [1024, 1536, 2048]
    assert body["optimum"]["b_short"] in (1024, 1536, 2048)
    # LMSYS's paper B (1,536) is the baselines' boundary, whatever the optimum's
    assert body["b_short_ref"] == 1536
    # a boundary with F(B) > 0.999 is refused, with the reason
    assert main(["--workload", "lmsys", "--b-candidates", "1536,32768"]) == 2
    assert "32768" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--workload", "lmsys", "--b-candidates", "15x36"])
    assert exc.value.code == 2


def test_slo_check_flag(cdfs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--workload", "lmsys", "--rate", "600", "--slo-ms", "250", "--b-short", "1536"]
    assert main([*args, "--json"]) == 0
    per_class = json.loads(capsys.readouterr().out)
    assert main([*args, "--json", "--slo-check", "paper"]) == 0
    paper = json.loads(capsys.readouterr().out)
    assert per_class["options"]["slo_check"] == "per_class"
    assert paper["options"]["slo_check"] == "paper"
    # 36 with the paper's pricing of compressed requests (test_check_points.py)
    assert per_class["optimum"]["total_gpus"] == 38 and paper["optimum"]["total_gpus"] == 50


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["--workload", "/nonexistent.json"]) == 2


def test_a_bad_profile_name_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `fleetgate plan --profile h100` died with a raw "No such file" error."""
    assert main(["--workload", "azure", "--profile", "h200"]) == 2
    err = capsys.readouterr().err
    assert "No such file" not in err and "unknown GPU profile 'h200'" in err
    for name in ("a100_80gb_llama3_70b", "h100_80gb_llama3_70b", "a10g_llama3_70b"):
        assert name in err
    assert main(["--workload", "azur"]) == 2
    err = capsys.readouterr().err
    assert "No such file" not in err and "azure, lmsys, agent" in err


def test_a_unique_prefix_names_a_builtin_profile(
    cdfs: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--workload", "azure", "--b-short", "4096", "--profile", "h100", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["profiles"]["short"] == "h100_80gb_llama3_70b"


def test_a_profile_file_is_read(cdfs: dict, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    shipped = ROOT / "simulator" / "data" / "gpu_profile_a100_llama3_70b.json"
    assert main(["--workload", "azure", "--b-short", "4096", "--profile", str(shipped)]) == 0
    capsys.readouterr()
    bad = tmp_path / "profile.json"
    bad.write_text("[1, 2]")
    assert main(["--workload", "azure", "--profile", str(bad)]) == 2
    assert "not a JSON object" in capsys.readouterr().err


def test_the_table_says_replicas_and_gpus(cdfs: dict, capsys: pytest.CaptureFixture[str]) -> None:
    """The planner's unit is the paper's "GPU": one 8-GPU replica priced at one GPU's rate."""
    assert main(["--workload", "azure", "--b-short", "4096"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("method"))
    assert header.split()[2:6] == ["repl_s", "repl_l", "repl", "GPUs"]
    homogeneous = next(line for line in out.splitlines() if line.startswith("Homogeneous"))
    assert homogeneous.split()[3:6] == ["284", "284", "2,272"]  # 284 replicas = 2,272 GPUs
    assert "8-GPU tensor-parallel replica" in out and "the 8 GPUs of a replica cost 8×" in out
    assert main(["--workload", "azure", "--b-short", "4096", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["profiles"]["gpus_per_replica_short"] == 8
