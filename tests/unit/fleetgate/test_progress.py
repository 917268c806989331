"""Progress bars (simulator/progress.py) appear where a person watches a terminal and
nowhere else: not when the output is piped or redirected (tests, CI, scripts), never in JSON
output. The terminal is a real pseudo-terminal (the pty module) around a real process."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.procs import ROOT, env


def _env() -> dict[str, str]:
    e = env()
    e.pop("FLEETGATE_PROGRESS", None)
    e["COLUMNS"] = "120"
    return e


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetgate", *args],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def at_a_terminal(*args: str) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal; (exit status, what it showed)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetgate", *args],
        cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    return proc.wait(120), b"".join(chunks).decode(errors="replace")


def test_simulate_has_no_bar_when_piped(tmp_path: Path) -> None:
    out = piped("simulate", "live-small", "--no-plots", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "s virtual" not in out.stderr + out.stdout
    assert "\r" not in out.stderr
    assert "metric (ms)" in out.stdout  # the report itself is unchanged


def test_simulate_shows_a_bar_at_a_terminal(tmp_path: Path) -> None:
    code, shown = at_a_terminal("simulate", "live-small", "--no-plots", "--out", str(tmp_path))
    assert code == 0, shown
    assert "simulate live-small:" in shown and "s virtual" in shown
    assert "metric (ms)" in shown
    code, shown = at_a_terminal(
        "simulate", "live-small", "--no-plots", "--out", str(tmp_path), "--no-progress"
    )
    assert code == 0 and "s virtual" not in shown


def test_train_predictor_bar_at_a_terminal_but_never_in_json(tmp_path: Path) -> None:
    model = tmp_path / "m.json"
    code, shown = at_a_terminal("train-predictor", "--synthetic", "3000", "-o", str(model))
    assert code == 0, shown
    assert "fit " in shown and "tree" in shown
    code, shown = at_a_terminal(
        "train-predictor", "--synthetic", "3000", "-o", str(model), "--json"
    )
    assert code == 0, shown
    assert json.loads(shown)["examples"] > 2000  # nothing but the JSON document
    out = piped("train-predictor", "--synthetic", "3000", "-o", str(model))
    assert out.returncode == 0 and "tree" not in out.stderr
