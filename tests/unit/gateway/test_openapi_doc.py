"""/openapi.json: every answer with a body has its schema (no JSON body documented as a
plain string), every operation its own operationId, the same from one start to the next
(FastAPI's default names a GET+HEAD route after whichever method a set yields first, which
changes with the process's hash seed)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.procs import ROOT, env

_DUMP = """
import json
from gateway.app import create_app
from gateway.config import load_config
cfg = load_config(data={
    "pools": {"short": {"max_model_len": 8192, "models": ["m"],
                        "workers": [{"url": "http://127.0.0.1:9"}]}},
    "auth": {"admin_key": "a", "entitlements_admin_key": "e"},
}, environ={})
print(json.dumps(create_app(cfg).api.openapi()))
"""


def _doc(seed: str) -> dict:
    e = env()
    e["PYTHONHASHSEED"] = seed
    out = subprocess.run(
        [sys.executable, "-c", _DUMP], capture_output=True, text=True, cwd=ROOT, env=e, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _ops(doc: dict) -> dict[tuple[str, str], dict]:
    return {(m, p): op for p, ops in doc["paths"].items() for m, op in ops.items()}


def test_operation_ids_are_distinct_and_stable_between_starts() -> None:
    first, second = _ops(_doc("1")), _ops(_doc("2"))
    ids = {k: op["operationId"] for k, op in first.items()}
    assert len(set(ids.values())) == len(ids), ids
    assert ids == {k: op["operationId"] for k, op in second.items()}
    assert ids[("get", "/v1/models")] != ids[("head", "/v1/models")]


def test_every_answer_body_is_documented_by_its_model() -> None:
    ops = _ops(_doc("3"))
    for (method, path), op in ops.items():
        for status, answer in op["responses"].items():
            content = answer.get("content", {})
            if method == "head":
                assert not content, (method, path, status)  # HEAD answers carry no body
                continue
            for media, spec in content.items():
                if media == "application/json":
                    assert spec.get("schema", {}).get("type") != "string", (method, path, status)
                    assert spec["schema"], (method, path, status)
        ok = [s for s in op["responses"] if s.startswith("2")]
        assert ok, (method, path)
        if method != "head" and path not in ("/health", "/metrics"):
            assert any("application/json" in op["responses"][s].get("content", {}) for s in ok), (
                method,
                path,
            )
