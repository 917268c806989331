"""The lockstep DP group simulator (simulator/dp_group.py) and its length sources."""

import numpy as np
import pytest

from policies.assign import make_assigner
from simulator.dp_group import GroupConfig, StepModel, run_group
from simulator.dp_lengths import load_burstgpt_csv, synthetic_burstgpt

SMALL = GroupConfig(ranks=8, slots=16, pool_target=32, steps=600, warmup=400, seed=3)


def test_step_time_is_the_slowest_rank_plus_the_barrier():
    m = StepModel(t_sync=1.0, w=2.0, h=0.5, k=0.01)
    running = np.array([2, 4])
    loads = np.array([100.0, 50.0])
    assert list(m.rank_times(running, loads)) == [2 + 1 + 1, 2 + 2 + 0.5]
    assert m.step_time(running, loads) == 1.0 + 4.5


def test_runs_repeat_under_a_seed_and_differ_across_seeds():
    a = run_group(make_assigner("bfio"), SMALL)
    b = run_group(make_assigner("bfio"), SMALL)
    c = run_group(make_assigner("bfio"), GroupConfig(**{**SMALL.__dict__, "seed": 4}))
    assert a.row() == b.row() and a.row() != c.row()


def test_metrics_are_consistent():
    r = run_group(
        make_assigner("fcfs_maxfree"), GroupConfig(**{**SMALL.__dict__, "record_loads": True})
    )
    assert r.loads is not None and r.loads.shape == (SMALL.steps, SMALL.ranks)
    loads = r.loads.astype(float)
    imb = (SMALL.ranks * loads.max(axis=1) - loads.sum(axis=1)).mean()
    assert imb == pytest.approx(r.avg_imbalance, rel=1e-5)
    assert 0 <= r.idle_fraction < 1 and r.finished > 0
    # backlogged: every slot is busy every step, so tokens/s = G·B / mean step time
    assert r.throughput == pytest.approx(SMALL.ranks * SMALL.slots / r.step_time, rel=1e-9)
    assert r.tpot >= r.step_time * 0.5


def test_bfio_balances_better_than_fcfs():
    fcfs = run_group(make_assigner("fcfs_maxfree"), SMALL)
    bfio = run_group(make_assigner("bfio"), SMALL)
    assert bfio.avg_imbalance * 2 < fcfs.avg_imbalance  # ~2.9× at this small B
    assert bfio.throughput > fcfs.throughput


def test_synthetic_lengths_have_the_documented_shape():
    s, o = synthetic_burstgpt().draw(np.random.default_rng(0), 200_000)
    assert np.median(s) == pytest.approx(500, rel=0.03)
    assert o.mean() == pytest.approx(280, rel=0.03)
    assert s.min() >= 1 and o.min() >= 1


def test_burstgpt_csv_loader(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,GPT-4,1087,230,1317,Conversation log\n"
        "1106,ChatGPT,0,0,0,Conversation log\n"  # a failure: dropped
        "1200,ChatGPT,300,0,300,API log\n"  # a failure: dropped
    )
    lengths = load_burstgpt_csv(path)
    assert sorted(lengths.prompts.tolist()) == [472, 1087]
    assert load_burstgpt_csv(path, model="GPT-4").outputs.tolist() == [230]
    s, o = lengths.draw(np.random.default_rng(1), 50)
    assert set(zip(s.tolist(), o.tolist(), strict=True)) <= {(472, 18), (1087, 230)}
    bad = tmp_path / "other.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="missing column"):
        load_burstgpt_csv(bad)
