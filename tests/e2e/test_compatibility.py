"""What third-party tools do with the gateway: schemathesis fuzzing the live /openapi.json,
guidellm's backend check, and the official openai SDK against the app run by plain
`uvicorn --factory` (no fleetgate CLI)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.e2e.fleet import MODEL, emulator, gateway_config, start_gateway
from tests.procs import ROOT, Proc, env, free_port

pytestmark = pytest.mark.e2e

SCHEMATHESIS_CONFIG = ROOT / "tests" / "e2e" / "schemathesis" / "schemathesis.toml"


def test_schemathesis_fuzzes_both_proxy_routes(fresh_procs):
    """Examples, coverage and fuzzing (valid and invalid data) against the documented
    schema: no 5xx, every status documented, every body and SSE event conforming, what
    the schema calls valid never refused by the gateway's validation, what it calls
    invalid refused with a 4xx."""
    emu = emulator(fresh_procs, "st-emu", 8192, "--time-scale", "0.005").wait_ready()
    gw = start_gateway(fresh_procs, gateway_config([emu.url], []))
    st = Path(sys.executable).with_name("st")
    out = subprocess.run(
        [
            str(st),
            "--config-file",
            str(SCHEMATHESIS_CONFIG),
            "run",
            gw.url + "/openapi.json",
            "--phases",
            "examples,coverage,fuzzing",
            "--checks",
            "all",
            "--mode",
            "all",
            "--include-path-regex",
            "^/v1/(chat/)?completions$",
            "--max-examples",
            "80",
            "--seed",
            "20261123",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=fresh_procs.dir,
    )
    report = out.stdout[-6000:] + out.stderr[-2000:]
    assert out.returncode == 0, report
    assert "passed" in out.stdout and "2/" in out.stdout, report  # both operations ran


def test_guidellm_backend_check(fleet):
    """guidellm's OpenAI backend validates a target with GET /health, then lists
    /v1/models (guidellm itself is not installed here: it pulls in torch and CUDA)."""
    with httpx.Client(base_url=fleet.url, timeout=10) as c:
        c.get("/health").raise_for_status()
        models = c.get("/v1/models").raise_for_status().json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_openai_sdk_against_uvicorn_factory(fresh_procs):
    emu = emulator(fresh_procs, "factory-emu", 8192).wait_ready()
    path = fresh_procs.dir / "factory.yaml"
    path.write_text(yaml.safe_dump(gateway_config([emu.url], [])))
    port = free_port()
    e = env()
    e["FLEETGATE_CONFIG"] = str(path)
    argv = [
        sys.executable, "-m", "uvicorn", "--factory", "gateway.app:create_app",
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    proc = Proc("uvicorn", argv, port, fresh_procs.dir / "uvicorn.log")
    proc.popen = subprocess.Popen(
        argv, cwd=ROOT, env=e, stdout=proc.log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    fresh_procs.procs.append(proc)
    proc.wait_ready("/healthz")
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=30)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content and reply.usage.completion_tokens >= 1
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None
    assert [m.id for m in client.models.list()] == [MODEL]


def test_schemathesis_fuzzes_every_other_route(fresh_procs):
    """Every route outside the two proxy routes (the admin API, models, health, metrics,
    reload) against its documented schema, with a key good for all of them: no 5xx,
    every status documented, every body conforming to its response model (response
    schema conformance), schema-valid input not refused by validation, schema-invalid
    input refused with a 4xx. POST /admin/workers is left out: a generated worker URL
    would send health checks and scrapes off loopback (its tests are in test_live_fleet)."""
    emu = emulator(fresh_procs, "st-emu", 8192, "--time-scale", "0.005").wait_ready()
    key = "admin-fuzz-key"
    ent = {"pool": "p", "class": "guaranteed", "tokens_per_s": 1000.0, "kv_bytes": 1 << 40,
           "concurrency": 8}  # fmt: skip
    cfg = gateway_config(
        [emu.url], [],
        auth={"admin_key": key, "entitlements_admin_key": key, "key_secret": "s" * 24,
              "api_keys": [key]},
        admission={"policy": "token_pools", "params": {
            "pools": {"p": {"slots": 64, "tokens_per_s": 1e9, "kv_bytes": 1 << 50,
                            "bytes_per_token": 1}},
            "entitlements": {"team": ent}, "default_entitlement": "team"}},
    )  # fmt: skip
    gw = start_gateway(fresh_procs, cfg)
    # a little traffic, so /admin/plan has something to plan on
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
    for max_tokens in (16, 300):
        c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens
        )
    st = Path(sys.executable).with_name("st")
    out = subprocess.run(
        [
            str(st), "--config-file", str(SCHEMATHESIS_CONFIG), "run", gw.url + "/openapi.json",
            "--phases", "examples,coverage,fuzzing", "--checks", "all", "--mode", "all",
            "--exclude-path-regex", "^/v1/(chat/)?completions$",
            "--exclude-operation-id", "post_admin_workers",
            "-H", f"Authorization: Bearer {key}",
            "--max-examples", "30", "--seed", "20261124",
        ],
        capture_output=True, text=True, timeout=300, cwd=fresh_procs.dir,
    )  # fmt: skip
    report = out.stdout[-8000:] + out.stderr[-2000:]
    assert out.returncode == 0, report
    assert "passed" in out.stdout, report
    # every operation ran (24 in all: the two proxy routes and POST /admin/workers aside)
    assert re.search(r"Tested:\s+21\b", out.stdout), report
