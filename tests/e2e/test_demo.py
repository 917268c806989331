"""`make run`'s demo, as a new user meets it: the gateway and its emulated fleet come up,
the printed SDK call works, Ctrl-C stops everything it started."""

from __future__ import annotations

import signal
import socket

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
