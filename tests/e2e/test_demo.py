"""`make run`'s demo, as a new user meets it: the gateway and its emulated fleet come up,
the printed SDK call works, Ctrl-C stops everything it started, and however else it ends
(SIGHUP, SIGTERM then SIGKILL, SIGKILL) no emulator outlives it."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import openai
import pytest

from tests.e2e.fleet import wait_until

pytestmark = pytest.mark.e2e


def test_demo_serves_and_stops_cleanly(fresh_procs, monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETGATE_DEMO_LOGS", str(tmp_path))
    demo = fresh_procs.fleetgate("demo", "demo", "--port", "{port}", "--time-scale", "0.02")
    demo.wait_ready("/readyz", timeout=60)
    client = openai.OpenAI(base_url=demo.url + "/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "Hello!"}], max_tokens=8
    )
    assert reply.choices[0].message.content
    assert "curl -s" in demo.output()  # it told the user how to call it
    demo.popen.send_signal(signal.SIGINT)
    assert demo.popen.wait(20) == 0
    ports = [int(p.stem.split("-")[1]) for p in tmp_path.glob("emulator-*.log")]
    assert len(ports) == 3
    assert wait_until(lambda: not any(_listening(p) for p in ports), timeout=10)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`, with their command lines (from /proc)."""
    found: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found[int(stat.parent.name)] = _cmdline(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int, cmdline: str) -> bool:
    """Still running as the same program (a zombie or a reused pid does not count)."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and _cmdline(pid) == cmdline


def _kill_9(demo) -> None:
    demo.popen.send_signal(signal.SIGKILL)


def _hangup(demo) -> None:  # the terminal closed
    demo.popen.send_signal(signal.SIGHUP)


def _term_then_kill(demo) -> None:  # what supervisors and test harnesses do
    demo.popen.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # the supervisor's grace period, not a synchronisation
    if demo.popen.poll() is None:
        demo.popen.send_signal(signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
@pytest.mark.parametrize("end", [_kill_9, _hangup, _term_then_kill], ids=lambda f: f.__name__)
def test_demo_leaves_no_emulator_behind(fresh_procs, monkeypatch, tmp_path, end):
    """However the demo ends, its emulators end with it (issue 29: orphans piled up)."""
    monkeypatch.setenv("FLEETGATE_DEMO_LOGS", str(tmp_path))
    demo = fresh_procs.fleetgate("demo", "demo", "--port", "{port}", "--time-scale", "0.02")
    demo.wait_ready("/readyz", timeout=60)
    emulators = {p: c for p, c in _children(demo.popen.pid).items() if " emulate " in c}
    assert len(emulators) == 3, _children(demo.popen.pid)
    end(demo)
    demo.popen.wait(20)
    assert wait_until(lambda: not any(_alive(p, c) for p, c in emulators.items()), timeout=15), {
        p: c for p, c in emulators.items() if _alive(p, c)
    }
    ports = [int(p.stem.split("-")[1]) for p in tmp_path.glob("emulator-*.log")]
    assert wait_until(lambda: not any(_listening(p) for p in ports), timeout=10)
