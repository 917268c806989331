"""`fleetgate serve`'s uvicorn options, each as a user turns it on."""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config
from tests.procs import Procs

pytestmark = pytest.mark.e2e

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def serve(procs: Procs, name: str, cfg: dict, *flags: str, scheme: str = "http"):
    import yaml

    path = procs.dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = procs.fleetgate(name, "serve", "--config", str(path), "--port", "{port}", *flags)
    proc.wait_ready("/healthz") if scheme == "http" else _wait_tls(proc)
    return proc


def _wait_tls(proc) -> None:
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"https://127.0.0.1:{proc.port}/healthz", verify=False, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(proc.output())


@pytest.fixture(scope="module")
def emu():
    ps = Procs()
    try:
        yield ps, emulator(ps, "opts-emu", 8192).wait_ready()
    finally:
        ps.close()


def test_several_worker_processes_share_the_port(emu, fresh_procs):
    _, e = emu
    g = serve(fresh_procs, "workers", gateway_config([e.url], []), "--workers", "2")
    with httpx.Client(timeout=10) as c:  # new connections land on either process
        for _ in range(10):
            with httpx.Client(timeout=10) as one:
                assert one.post(g.url + "/v1/chat/completions", json=CHAT).status_code == 200
        assert c.get(g.url + "/metrics").status_code == 200


def test_root_path_behind_a_prefix_stripping_proxy(emu, fresh_procs):
    _, e = emu
    g = serve(fresh_procs, "rooted", gateway_config([e.url], []), "--root-path", "/llm")
    client = openai.OpenAI(base_url=g.url + "/v1", api_key="x", max_retries=0)
    assert client.chat.completions.create(**CHAT).choices[0].message.content
    assert "/llm/openapi.json" in httpx.get(g.url + "/docs").text


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(emu, fresh_procs):
    _, e = emu
    cert, key = fresh_procs.dir / "cert.pem", fresh_procs.dir / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    g = serve(
        fresh_procs,
        "tls",
        gateway_config([e.url], []),
        "--ssl-certfile",
        str(cert),
        "--ssl-keyfile",
        str(key),
        scheme="https",
    )
    r = httpx.post(f"https://127.0.0.1:{g.port}/v1/chat/completions", json=CHAT, verify=False)
    assert r.status_code == 200 and r.json()["choices"]


def test_a_bad_flag_value_names_the_key(fresh_procs, emu):
    _, e = emu
    import sys

    from tests.procs import ROOT, env

    out = subprocess.run(
        [sys.executable, "-m", "fleetgate", "serve", "--upstream", e.url, "--workers", "0"],
        capture_output=True, text=True, cwd=ROOT, env=env(), timeout=30,
    )  # fmt: skip
    assert out.returncode == 2 and "listen.workers" in out.stderr


def test_concurrency_limit_refuses_in_the_openai_shape(emu, fresh_procs):
    _, e = emu
    g = serve(fresh_procs, "limited", gateway_config([e.url], []), "--limit-concurrency", "2")
    from tests.e2e.rawhttp import Conn, request

    # the readiness probe's connection may still be closing on a loaded machine: it counts
    # toward the limit until it has, so retry until one connection alone is answered, and
    # keep that connection open as the first of the two
    deadline = time.monotonic() + 10
    while True:
        a = Conn(g.port)
        a.send(request("GET", "/healthz"))
        if a.read().status == 200:
            break
        a.close()
        assert time.monotonic() < deadline, "one connection alone was never under the limit"
        time.sleep(0.05)
    with a, Conn(g.port) as b:
        b.send(request("GET", "/healthz"))  # two open connections: at the limit
        refused = b.read()
    assert refused.status == 503
    assert refused.headers["retry-after"] == "1"
    assert orjson_loads(refused.body)["error"]["code"] == "overloaded"


def orjson_loads(data: bytes):
    import orjson

    return orjson.loads(data)


def test_json_logs(emu, fresh_procs):
    import json

    _, e = emu
    g = serve(fresh_procs, "jsonlogs", gateway_config([e.url], []), "--log-format", "json")
    assert httpx.post(g.url + "/v1/chat/completions", json=CHAT).status_code == 200
    g.stop()
    lines = [ln for ln in g.output().splitlines() if ln.strip()]
    assert lines, "no log lines"
    for line in lines:
        obj = json.loads(line)
        assert {"ts", "level", "logger", "message"} <= set(obj), line
    assert any(json.loads(ln)["logger"].startswith("uvicorn") for ln in lines)


def test_cors_from_configuration(emu, fresh_procs):
    _, e = emu
    origin = "https://app.example"
    cfg = gateway_config([e.url], [], cors={"allow_origins": [origin]})
    g = serve(fresh_procs, "cors", cfg)
    pre = httpx.options(
        g.url + "/v1/chat/completions",
        headers={
            "origin": origin,
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type, authorization",
        },
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == origin
    r = httpx.post(g.url + "/v1/chat/completions", json=CHAT, headers={"origin": origin})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == origin
    assert "x-fleetgate-pool" in r.headers["access-control-expose-headers"]
    other = httpx.post(
        g.url + "/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in other.headers
