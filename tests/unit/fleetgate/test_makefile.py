"""The Makefile's promises, read from `make -n` (what it would run; nothing is run): `make
run` installs the runtime dependencies only, with pip's progress, then starts the demo;
`make test` installs the test extra. bench/first_run.sh measures the real thing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.procs import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def dry_run(target: str, tmp_path: Path, *extra: str) -> str:
    venv = tmp_path / "venv"  # absent: make plans the whole install
    return subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), target, f"VENV={venv}", *extra],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip


def test_make_run_installs_what_serving_needs_and_starts_the_demo(tmp_path: Path) -> None:
    out = dry_run("run", tmp_path, "DEMO_ARGS=--port 9123")
    installs = [line for line in out.splitlines() if "pip install" in line]
    assert len(installs) == 1
    assert installs[0].rstrip().endswith(" -e .")  # no extras
    assert " -q" not in installs[0]  # pip's own progress shows
    assert "[test]" not in out
    assert out.strip().splitlines()[-1].endswith("-m fleetgate demo --port 9123")


def test_make_test_installs_the_test_extra(tmp_path: Path) -> None:
    out = dry_run("test", tmp_path)
    assert "-e '.[test]'" in out
    assert "apt-get install" in out  # redis-server and prometheus when missing
