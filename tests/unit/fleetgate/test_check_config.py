"""`fleetgate check-config`, run as a user runs it (a real process): every configuration the
repository ships is valid, broken ones name every problem by its key path, exit 0/1.

Shipped gateway configurations: config/*.yaml and every Kubernetes ConfigMap under deploy/
with a *.yaml entry. The simulator's scenarios (simulator/scenarios/) are not gateway
configurations (their pools are worker counts for the engine model) and are not checked
here; `fleetgate simulate` validates them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.procs import ROOT, env

MINIMAL = """\
pools:
  short:
    max_model_len: 8192
    models: [m]
    workers: [{url: "http://127.0.0.1:9"}]
"""


def check(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = env()
    for k in [k for k in e if k.startswith("FLEETGATE_")]:
        del e[k]
    e.update(environ or {})
    return subprocess.run(
        [sys.executable, "-m", "fleetgate", "check-config", *args],
        cwd=ROOT, env=e, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def shipped() -> list[Path]:
    files = sorted((ROOT / "config").glob("*.yaml"))
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        if any(
            d.get("kind") == "ConfigMap"
            and any(str(k).endswith(".yaml") for k in d.get("data") or {})
            for d in docs
        ):
            files.append(path)
    return files


def test_the_shipped_configs_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in shipped()}
    assert {"config/gateway.yaml", "config/compose.yaml",
            "deploy/kubernetes/base/configmap.yaml"} <= names  # fmt: skip


@pytest.mark.parametrize("path", shipped(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_shipped_config_is_valid(path: Path) -> None:
    out = check(str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert ": valid" in out.stdout and "invalid" not in out.stdout
    assert "drain_delay_s:" in out.stdout  # the effective configuration, defaults included


def test_defaults_are_filled_in_and_secrets_hidden(tmp_path: Path) -> None:
    f = tmp_path / "g.yaml"
    f.write_text(
        MINIMAL + "auth: {api_keys: [sk-secret-1], admin_key: adm-secret}\n"
        "admission:\n  policy: token_pools\n  params:\n"
        "    store: redis\n    redis_url: redis://:hunter2@127.0.0.1:6379/0\n"
        "    pools: {m: {slots: 4, tokens_per_s: 100, kv_bytes: 1000000, bytes_per_token: 10}}\n"
        "    entitlements: {a: {pool: m, class: spot}}\n"
    )
    out = check("--json", str(f))
    assert out.returncode == 0, out.stdout + out.stderr
    body = json.loads(out.stdout)
    cfg = body["config"]
    assert cfg["listen"]["drain_delay_s"] == 5.0 and cfg["routing"]["policy"] == "least_loaded"
    assert cfg["pools"]["short"]["workers"][0]["engine"] == "vllm"
    for secret in ("sk-secret-1", "adm-secret", "hunter2"):
        assert secret not in out.stdout
    assert cfg["auth"]["api_keys"] == ["***"]
    assert cfg["admission"]["params"]["redis_url"] == "redis://:***@127.0.0.1:6379/0"


def test_environment_overrides_apply_and_are_named(tmp_path: Path) -> None:
    f = tmp_path / "g.yaml"
    f.write_text(MINIMAL)
    out = check(str(f), environ={"FLEETGATE_LISTEN__PORT": "9123"})
    assert out.returncode == 0 and "port: 9123" in out.stdout
    assert "FLEETGATE_LISTEN__PORT" in out.stdout
    out = check("--no-env", str(f), environ={"FLEETGATE_LISTEN__PORT": "9123"})
    assert "port: 8080" in out.stdout
    out = check(str(f), environ={"FLEETGATE_LISTEN__PORT": "-5"})
    assert out.returncode == 1 and "listen.port:" in out.stdout


BROKEN = {
    "every problem, each by its key path": (
        "pools:\n  short:\n    max_model_len: -1\n    models: []\n"
        "    workers: [{url: 'ftp://x', bogus: 1}]\nlisten: {port: 99999}\n",
        [
            "listen.port:",
            "pools.short.max_model_len:",
            "pools.short.models:",
            "pools.short.workers.0.url:",
            "pools.short.workers.0.bogus: unknown key",
        ],
    ),
    "no pools": ("listen: {port: 8080}\n", ["pools:"]),
    "an unknown section": (MINIMAL + "listn: {port: 1}\n", ["listn: unknown key"]),
    "a check across sections": (
        MINIMAL + "placement: {short_pool: shrot}\n",
        ["placement.short_pool: no pool named"],
    ),
    "a policy's parameter": (
        MINIMAL + "routing: {policy: least_loaded, params: {bogus: 1}}\n",
        ["routing.params"],
    ),
    "an unknown policy": (MINIMAL + "dispatch: {policy: lifo}\n", ["dispatch.policy"]),
    "a token-pools parameter": (
        MINIMAL + "admission:\n  policy: token_pools\n  params:\n"
        "    pools: {m: {slots: 0, tokens_per_s: 1, kv_bytes: 1, bytes_per_token: 1}}\n",
        ["admission.params.pools.m.slots"],
    ),
    "not YAML": ("pools: [\n", ["not valid YAML"]),
    "not a mapping": ("- 1\n- 2\n", ["the top level must be a mapping"]),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_configs_name_every_problem(case: str, tmp_path: Path) -> None:
    text, expected = BROKEN[case]
    f = tmp_path / "broken.yaml"
    f.write_text(text)
    out = check(str(f))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{f}: invalid" in out.stdout
    for needle in expected:
        assert needle in out.stdout, out.stdout
    assert "Traceback" not in out.stderr


def test_several_files_one_bad_a_configmap_and_a_missing_file(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL)
    cm = tmp_path / "cm.yaml"
    inner = MINIMAL.replace("8192", "0")
    cm.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "data": {"gateway.yaml": inner}})
    )
    out = check("-q", str(good), str(cm), str(tmp_path / "absent.yaml"))
    assert out.returncode == 1
    assert f"{good}: valid" in out.stdout
    assert f"{cm} (data.gateway.yaml): invalid" in out.stdout
    assert "pools.short.max_model_len:" in out.stdout
    assert f"{tmp_path / 'absent.yaml'}: invalid" in out.stdout and "cannot read" in out.stdout
    assert check("-q", str(good)).returncode == 0
    assert check().returncode == 2  # usage
