"""Shared fixtures: the paper-input CDFs, read the way the CLI reads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgate.plan import data_dir, load_workload
from policies.planner import LengthCdf


def _dir() -> Path | None:
    try:
        return data_dir()
    except FileNotFoundError:
        return None


DATA = _dir()
needs_data = pytest.mark.skipif(DATA is None, reason="simulator/data (paper CDFs) not found")


@pytest.fixture(scope="session")
def cdfs() -> dict[str, LengthCdf]:
    if DATA is None:
        pytest.skip("simulator/data (paper CDFs) not found")
    return {name: load_workload(name)[0] for name in ("azure_2023", "lmsys_chat_1m", "agent_heavy")}


@pytest.fixture(scope="session")
def profile_doc() -> dict[str, object]:
    if DATA is None:
        pytest.skip("simulator/data not found")
    doc: dict[str, object] = json.loads((DATA / "gpu_profile_a100_llama3_70b.json").read_text())
    return doc
