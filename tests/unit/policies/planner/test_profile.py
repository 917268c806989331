"""Hardware profiles: the paper's slot counts and the shared profile file."""

from __future__ import annotations

import pytest

from policies.planner import A100_LLAMA3_70B
from policies.planner.profile import HardwareProfile, profile_from_dict


def test_paper_slot_counts() -> None:
    # §2.2 / §7.1: n_max = 16 at 64K, 128 at 8K, 256 at 4K, 682 at 1.5K
    p = A100_LLAMA3_70B
    assert [p.n_slots(c) for c in (65536, 8192, 4096, 1536)] == [16, 128, 256, 682]


def test_slot_table_of_the_profile_file(profile_doc: dict) -> None:
    table = profile_doc["simulator_profile"]["n_slots_by_max_ctx"]
    for ctx, slots in table.items():
        assert A100_LLAMA3_70B.n_slots(int(ctx)) == slots


def test_profile_file_builds_the_builtin(profile_doc: dict) -> None:
    built = profile_from_dict(profile_doc, name=A100_LLAMA3_70B.name)
    assert built == A100_LLAMA3_70B


def test_kv_per_slot_is_the_cost_cliff() -> None:
    # Table 1: a 64K slot reserves 20 GiB, an 8K slot 2.5 GiB: the 8× cliff
    p = A100_LLAMA3_70B
    assert p.kv_bytes_per_slot(65536) == 20 * 2**30
    assert p.kv_bytes_per_slot(65536) / p.kv_bytes_per_slot(8192) == 8
    assert p.annual_cost(284) == pytest.approx(5_498_000, rel=1e-3)  # Table 3, Azure homogeneous


def test_flat_profile_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="unknown profile keys"):
        profile_from_dict({"name": "x", "w_ms": 8})
    assert profile_from_dict({"name": "x", "w_s": 0.004}).w_s == 0.004
    with pytest.raises(ValueError):
        HardwareProfile(name="bad", max_slots=0)
