"""A walk through the README: every command block a reader copies is run, as written, against
loopback, so a command that stopped working fails `make test`.

Each shell or Python block of README.md carries a marker on the line before it,
`<!-- walk: ID ... -->`, and this file runs the block of each ID (a block without a marker, or
a marker without a walk here, fails `test_every_command_block_is_walked`). The blocks' own
text is what runs, with only these changes, each because this machine is shared and only
loopback may be reached:
- the gateway's port 8080 and the emulators' 8101–8103 become free ports (in the commands,
  and for `fleetgate serve --config config/gateway.yaml` through the environment overrides
  the README documents: FLEETGATE_LISTEN__PORT, FLEETGATE_POOLS__<POOL>__WORKERS__<I>__URL);
- `--upstream http://10.0.0.5:8000 --model NAME` points at an emulator on loopback;
- `make run` runs with this interpreter's virtualenv and without its install step (`make -o`
  the install stamp: installing is measured by bench/first_run.sh, not here);
- `make test` is not run: it is what runs this walk;
- gateways are stopped without their drain delay (FLEETGATE_LISTEN__DRAIN_DELAY_S=0), to keep
  the walk short.
A long-running command (`make run`, `fleetgate serve`) is started, polled for its first answer
and stopped; `make run` is stopped with SIGINT, the Ctrl-C the README tells the reader to use.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.procs import ROOT, Proc, Procs, env, free_port

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
BLOCK = re.compile(
    r"^<!-- walk: (?P<id>[\w-]+)[^>]*-->\n```(?P<lang>\w*)\n(?P<body>.*?)^```", re.M | re.S
)
FENCE = re.compile(r"^```(sh|bash|shell|console|python|py)\n", re.M)
WALKED = {"two-commands", "quick-start-python", "quick-start-curl", "real-engines", "gateway-yaml"}


def blocks() -> dict[str, str]:
    return {m["id"]: m["body"] for m in BLOCK.finditer(README.read_text())}


def commands(block: str) -> list[str]:
    """The block's command lines: comments dropped, `\\` continuations joined."""
    text = block.replace("\\\n", " ")
    lines = [line.split("  #", 1)[0].strip() for line in text.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture
def use_venv_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleetgate`, `make run`'s interpreter: this virtualenv's, first on PATH."""
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("FLEETGATE_LISTEN__DRAIN_DELAY_S", "0")


def start(ps: Procs, name: str, argv: list[str], port: int) -> Proc:
    proc = Proc(name, argv, port, ps.dir / f"{name}.log")
    ps.procs.append(proc)
    return proc.start()


def test_every_command_block_is_walked() -> None:
    text = README.read_text()
    marked = blocks()
    assert len(FENCE.findall(text)) == len(marked), "a README command block has no walk marker"
    assert set(marked) == WALKED


def test_make_run_then_the_quick_start(
    fresh_procs: Procs, use_venv_path: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = blocks()
    assert commands(b["two-commands"]) == ["make run", "make test"]
    monkeypatch.setenv("FLEETGATE_DEMO_LOGS", str(tmp_path))
    port = free_port()
    venv = Path(sys.prefix)
    demo = start(
        fresh_procs,
        "make-run",
        [
            "make",
            "--no-print-directory",
            "-o",
            str(venv / ".fleetgate-run"),
            "run",
            f"VENV={venv}",
            f"DEMO_ARGS=--port {port} --time-scale 0.05",
        ],
        port,
    )
    demo.wait_ready("/readyz", timeout=90)

    def here(block: str) -> str:
        return block.replace("127.0.0.1:8080", f"127.0.0.1:{port}")

    python = subprocess.run(
        [sys.executable, "-c", here(b["quick-start-python"])],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert python.returncode == 0, python.stderr
    # the reply, the streamed count, then "<pool> <worker>" from the headers (on the stream's line)
    assert python.stdout.split()[-2].endswith("short"), python.stdout
    curl = subprocess.run(
        ["bash", "-c", here(b["quick-start-curl"])], capture_output=True, text=True, timeout=60
    )
    assert curl.returncode == 0, curl.stderr
    assert json.loads(curl.stdout)["choices"][0]["message"]["content"]
    # Ctrl-C: the terminal sends SIGINT to the foreground process group (make and the demo)
    assert demo.popen is not None
    os.killpg(demo.popen.pid, signal.SIGINT)
    demo.popen.wait(30)
    assert "curl -s" in demo.output()


def test_against_real_engines_block(
    fresh_procs: Procs, use_venv_path: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    check, serve_file, serve_upstream = commands(blocks()["real-engines"])
    assert check.startswith("fleetgate check-config ")
    run = subprocess.run(shlex.split(check), cwd=ROOT, env=env(), capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr

    # its workers (8101–8103) are not started by this block: the gateway starts and says so
    port = free_port()
    monkeypatch.setenv("FLEETGATE_LISTEN__PORT", str(port))
    gw = start(fresh_procs, "serve-file", shlex.split(serve_file), port)
    gw.wait_ready("/healthz", timeout=60)
    assert httpx.get(gw.url + "/readyz").status_code == 503
    gw.stop()

    emulator = fresh_procs.emulator("engine", "--model", "llama-3.1-8b", "--time-scale", "0.05")
    emulator.wait_ready("/health", timeout=60)
    argv = shlex.split(serve_upstream.replace("http://10.0.0.5:8000", emulator.url))
    argv[argv.index("NAME")] = "llama-3.1-8b"
    port = free_port()
    monkeypatch.setenv("FLEETGATE_LISTEN__PORT", str(port))
    gw = start(fresh_procs, "serve-upstream", argv, port)
    gw.wait_ready("/readyz", timeout=60)
    reply = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}]},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text


def test_gateway_yaml_with_its_emulators_block(
    fresh_procs: Procs, use_venv_path: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = blocks()["gateway-yaml"]
    config = yaml.safe_load((ROOT / "config" / "gateway.yaml").read_text())
    for pool, p in config["pools"].items():
        for i, worker in enumerate(p["workers"]):
            old = worker["url"].rsplit(":", 1)[1]
            new = free_port()
            assert f"--port {old} " in block
            block = block.replace(f"--port {old} ", f"--port {new} ")
            monkeypatch.setenv(
                f"FLEETGATE_POOLS__{pool.upper()}__WORKERS__{i}__URL", f"http://127.0.0.1:{new}"
            )
    port = free_port()
    monkeypatch.setenv("FLEETGATE_LISTEN__PORT", str(port))
    gw = start(fresh_procs, "gateway-yaml", ["bash", "-c", block], port)
    gw.wait_ready("/readyz", timeout=90)
    assert httpx.get(gw.url + "/readyz").status_code == 200
    reply = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "Hi"}]},
        timeout=30,
    )
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-fleetgate-pool"] == "short"
