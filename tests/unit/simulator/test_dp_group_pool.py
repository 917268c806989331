"""A scenario's dp_group pool (simulator/scenario.py → the core's group, the lockstep engine
of emulator/dp_engine.py): validated, run through the core, every lease back."""

from __future__ import annotations

import pytest

from emulator.dp_engine import DpEngine
from policies.actions import ActionLog
from simulator.run import run
from simulator.scenario import ScenarioError
from tests.unit.simulator.conftest import small


def _pool(**kw: object) -> dict[str, object]:
    return {"name": "short", "workers": 1, "max_model_len": 8192, "kind": "dp_group",
            "dp_group": {"ranks": 3, "slots": 4,
                         "assigner": {"policy": "bfio", "params": {"lookahead_steps": 0}}},
            "dp_step": {"k": 1e-6}, **kw}  # fmt: skip


def test_a_dp_group_runs_through_the_core_and_gives_everything_back():
    log = ActionLog()
    res = run(small(rate=20.0, requests=60, pools=[_pool()]), log=log)
    assert {r.status for r in res.records} == {"ok"}
    core = res.core
    assert core is not None
    group = core.groups["short"]
    assert group.loads() == [0, 0, 0] and not group.pooled and sum(group.assigned) == 60
    sends = [d for _, what, d in log.entries if what == "send"]
    assert len(sends) == 60 and all(d.rsplit("#", 1)[1] in {"0", "1", "2"} for d in sends)
    assert all(v.in_flight == v.outstanding_tokens == 0 for v in core.views("short"))


def test_the_engine_is_the_lockstep_group_with_b_slots_a_rank():
    from simulator.cluster import Cluster, dp_engine
    from simulator.kernel import Kernel

    sc = small(pools=[_pool()])
    pool = sc.fleet.pools[0]
    dp = pool.dp_config()
    assert dp is not None and dp.ranks == 3 and dp.k == 1e-6
    assert sc.engine_config(pool).max_num_seqs == 4
    kernel = Kernel()
    (w,) = Cluster().add_pool("short", 1, sc.engine_config(pool), kernel, None, dp_engine(dp))  # type: ignore[arg-type]
    assert isinstance(w.engine, DpEngine) and w.dp


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"workers": 2}, "one engine of its G ranks"), ({"kind": "workers"}, "exactly when"),
     ({"dp_step": {"kk": 1.0}}, "unknown dp_step")],
)  # fmt: skip
def test_a_bad_dp_group_pool_is_refused(kw: dict[str, object], match: str) -> None:
    with pytest.raises((ScenarioError, ValueError), match=match):
        small(pools=[_pool(**kw)])
