"""config/gateway.yaml is runnable as its header says: the emulator commands written there
start the workers it lists, and `fleetgate serve --config config/gateway.yaml` answers.

The commands are read from the file's own comments (so the test follows what a user copies);
each emulator runs on a free port instead of 8101–8103 (other tests and sessions share this
machine), and the workers' URLs are pointed there with the environment overrides the file
documents (FLEETGATE_POOLS__<POOL>__WORKERS__<I>__URL)."""

from __future__ import annotations

import re
import shlex

import openai
import pytest
import yaml

from tests.procs import ROOT, free_port

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "config" / "gateway.yaml"


def _commands() -> list[list[str]]:
    return [
        shlex.split(m[1])
        for m in re.finditer(r"^#\s+fleetgate (emulate .*)$", EXAMPLE.read_text(), re.M)
    ]


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_header_starts_every_worker_the_file_lists() -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    commands = {int(_flag(c, "--port")): c for c in _commands()}
    listed = [(pool, w) for pool, p in config["pools"].items() for w in p["workers"]]
    assert len(commands) == len(listed) == 3
    for pool, worker in listed:
        port = int(worker["url"].rsplit(":", 1)[1])
        argv = commands[port]
        assert int(_flag(argv, "--max-model-len")) == config["pools"][pool]["max_model_len"]
        assert _flag(argv, "--model") in config["pools"][pool]["models"]
    assert "then: fleetgate serve --config config/gateway.yaml" in EXAMPLE.read_text()


def test_the_example_serves(fresh_procs, monkeypatch) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())
    by_port = {int(_flag(c, "--port")): c for c in _commands()}
    for pool, p in config["pools"].items():
        for i, worker in enumerate(p["workers"]):
            argv = by_port[int(worker["url"].rsplit(":", 1)[1])]
            port = free_port()
            argv = [a if a != _flag(argv, "--port") else str(port) for a in argv]
            fresh_procs.fleetgate(f"emu-{pool}-{i}", *argv, "--time-scale", "0.02", port=port)
            monkeypatch.setenv(
                f"FLEETGATE_POOLS__{pool.upper()}__WORKERS__{i}__URL", f"http://127.0.0.1:{port}"
            )
    for proc in fresh_procs.procs:
        proc.wait_ready("/health", timeout=60)
    gw = fresh_procs.fleetgate("gateway", "serve", "--config", str(EXAMPLE), "--port", "{port}")
    gw.wait_ready("/readyz", timeout=60)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0)
    # beyond γ·B_short (1.5 × 8,192 tokens): too long to compress into the short pool
    for content, pool in (("Hello!", "short"), ("word " * 16000, "long")):
        raw = client.chat.completions.with_raw_response.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": content}], max_tokens=8
        )
        assert raw.parse().choices[0].message.content
        assert raw.headers["x-fleetgate-pool"] == pool
