"""The emulator's fault injection and auth, as the gateway's failure tests use them."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import pytest

from tests.contract.emu_wire import CLIENT, metrics, sample, wait_for
from tests.procs import Proc, Procs, procs

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "ignore_eos": True}
KEY = {"Authorization": "Bearer sk-test"}


@pytest.fixture(scope="module")
def fleet() -> Iterator[dict[str, Proc]]:
    with procs() as ps:
        common = ("--model", "m", "--time-scale", "0.01")
        started = {
            "guarded": ps.emulator(
                "guarded",
                *common,
                "--api-key",
                "sk-test",
                "--fail-health",
                "--die-mid-stream-after",
                "3",
            ),
            "errors": ps.emulator("errors", *common, "--error-rate", "1.0"),
            "crash": ps.emulator("crash", *common, "--crash-after-requests", "1"),
            "dies": ps.emulator("dies", *common, "--die-mid-stream-after", "2", "--die-exits"),
            "sglang": ps.emulator(
                "sglang", *common, "--personality", "sglang", "--api-key", "sk-test"
            ),
        }
        for name, p in started.items():
            # /health fails on purpose on "guarded"; /metrics is always open.
            p.wait_ready("/metrics" if name == "guarded" else "/health")
        yield started


def _events_until_cut(url: str) -> tuple[int, bool]:
    """SSE events received before the connection died, and whether it died."""
    events = 0
    try:
        with CLIENT.stream("POST", url + CHAT, json={**BODY, "stream": True}, headers=KEY) as r:
            for line in r.iter_lines():
                events += line.startswith("data: ")
    except (httpx.RemoteProtocolError, httpx.ReadError):
        return events, True
    return events, False


def test_api_key_guards_v1_only(fleet: dict[str, Proc]) -> None:
    url = fleet["guarded"].url
    r = CLIENT.get(url + "/v1/models")
    assert r.status_code == 401 and r.content == b'{"error":"Unauthorized"}'
    assert CLIENT.get(url + "/v1/models", headers=KEY).status_code == 200
    assert CLIENT.get(url + "/metrics").status_code == 200
    assert CLIENT.get(url + "/version").status_code == 200
    s = fleet["sglang"].url  # SGLang guards everything but /health and /metrics
    assert CLIENT.get(s + "/server_info").status_code == 401
    assert CLIENT.get(s + "/health").status_code == 200


def test_fail_health_and_sigusr1_toggle(fleet: dict[str, Proc]) -> None:
    p = fleet["guarded"]
    r = CLIENT.get(p.url + "/health")
    assert r.status_code == 503 and r.content == b""
    assert p.popen is not None
    p.popen.send_signal(signal.SIGUSR1)
    assert wait_for(lambda: CLIENT.get(p.url + "/health").status_code == 200)
    p.popen.send_signal(signal.SIGUSR1)
    assert wait_for(lambda: CLIENT.get(p.url + "/health").status_code == 503)


def test_die_mid_stream_cuts_and_frees_the_engine(fleet: dict[str, Proc]) -> None:
    url = fleet["guarded"].url
    events, died = _events_until_cut(url)
    assert died and events == 3
    lab = {"engine": "0", "model_name": "m"}

    def idle() -> bool:
        fams = metrics(url)
        return (
            sample(fams, "vllm:num_requests_running", **lab)
            == 0
            == sample(fams, "vllm:num_requests_waiting", **lab)
        )

    assert wait_for(idle)
    r = CLIENT.post(url + CHAT, json=BODY, headers=KEY)  # non-streaming answers are unaffected
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 50


def test_error_rate_answers_500(fleet: dict[str, Proc]) -> None:
    r = CLIENT.post(fleet["errors"].url + CHAT, json=BODY)
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "Internal server error", "type": "InternalServerError",
                                  "param": None, "code": 500}}  # fmt: skip


def test_crash_after_requests_exits(fleet: dict[str, Proc]) -> None:
    p = fleet["crash"]
    assert CLIENT.post(p.url + CHAT, json=BODY).status_code == 200
    with pytest.raises(httpx.TransportError):
        CLIENT.post(p.url + CHAT, json=BODY)
    assert p.popen is not None and p.popen.wait(10) == 3


def test_die_exits_mid_stream(fleet: dict[str, Proc]) -> None:
    p = fleet["dies"]
    events, died = _events_until_cut(p.url)
    assert died and events == 2
    assert p.popen is not None and p.popen.wait(10) == 3


def test_sigterm_exits_cleanly() -> None:
    ps = Procs()
    try:
        p = ps.emulator("term", "--time-scale", "0.01").wait_ready()
        assert "serving" in p.output() and p.url in p.output()
        assert p.popen is not None
        p.popen.send_signal(signal.SIGTERM)
        assert p.popen.wait(10) == 0
    finally:
        ps.close()
