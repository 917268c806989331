"""The lockstep data-parallel group (emulator/dp_engine.py): a step lasts
T_sync + max_g (W + H·n_g + K·L_g), requests run on the rank they name, and the rank a
request names is read as each engine reads it."""

from __future__ import annotations

import pytest

from emulator.dp_engine import DpConfig, DpEngine, requested_rank
from emulator.engine import EngineConfig, EngineRequest
from policies.clock import ManualClock

CFG = EngineConfig(w=0.005, h=0.001, prefill_chunk=100_000, max_num_seqs=4)
DP = DpConfig(ranks=3, t_sync=0.002, k=1e-5)


def _req(rid: str, prompt: int, out: int, rank: int | None) -> EngineRequest:
    return EngineRequest(rid, prompt, out, out, dp_rank=rank)


def test_a_step_waits_for_the_most_loaded_rank():
    clock = ManualClock()
    g = DpEngine(CFG, clock, DP)
    g.submit(_req("a", 1000, 3, 0))
    g.submit(_req("b", 100, 3, 1))
    g.submit(_req("c", 200, 3, 1))
    first = g.step()  # prefill: every rank's context is still empty
    assert first.duration == pytest.approx(0.002 + 0.005 + 0.001 * 2)
    clock.t = first.start + first.duration
    second = g.step()  # decode: rank 0 reads 1000 tokens, rank 1 reads 300, rank 2 idles
    t = [0.005 + 0.001 + 1e-5 * 1000, 0.005 + 0.002 + 1e-5 * 300, 0.005]
    assert g.last_rank_times == pytest.approx(t)
    assert second.duration == pytest.approx(0.002 + max(t))
    assert g.loads() == [1001, 302, 0] and g.counts() == [1, 2, 0]
    assert 0.0 < g.barrier_idle < 1.0


def test_requests_run_on_their_rank_and_finish_at_the_barrier():
    clock = ManualClock()
    g = DpEngine(CFG, clock, DP)
    g.submit(_req("a", 10, 2, 2))
    g.submit(_req("b", 10, 1, None))  # no rank named: the least busy (0)
    assert (g.rank_of("a"), g.rank_of("b")) == (2, 0)
    done = []
    while g.has_work():
        r = g.step()
        clock.t = r.start + r.duration
        done.extend(r.finished)
    for f in done:  # the group's times, not a rank's own
        assert f.finished in {clock.t, done[0].finished}
        assert f.first_token is not None and f.first_token <= f.finished
    assert g.stats.generation_tokens == 3 and g.rank_stats(2).generation_tokens == 2
    with pytest.raises(ValueError, match="out of range"):
        g.submit(_req("z", 10, 1, 3))


def test_the_rank_a_request_names():
    h = {"X-Data-Parallel-Rank": "2"}
    assert requested_rank(h, {}, vllm=True) == 2
    assert requested_rank({"X-Data-Parallel-Rank": "x"}, {}, vllm=True) is None  # vLLM ignores
    assert requested_rank({}, {"data_parallel_rank": 1}, vllm=True) is None  # vLLM: header only
    assert requested_rank(h, {"routed_dp_rank": 1}, vllm=False) == 2  # SGLang: header wins
    assert requested_rank({}, {"routed_dp_rank": 1, "data_parallel_rank": 0}, vllm=False) == 1
    assert requested_rank({}, {"data_parallel_rank": 0}, vllm=False) == 0
    with pytest.raises(ValueError, match="must be an integer"):
        requested_rank({"X-Data-Parallel-Rank": "x"}, {}, vllm=False)


def test_per_rank_series_as_the_engines_export_them():
    from emulator.engine import EngineStats
    from emulator.metrics_sglang import SglangMetrics
    from emulator.metrics_vllm import VllmMetrics

    ranks = [EngineStats(running=1), EngineStats(running=2)]
    vllm, _ = VllmMetrics("m", CFG).render(EngineStats(running=3), "", 0.0, ranks)
    assert b'vllm:num_requests_running{engine="1",model_name="m"} 2.0' in vllm
    sgl, _ = SglangMetrics("m", CFG).render(EngineStats(running=3), "", 0.0, ranks)
    running = [line for line in sgl.splitlines() if line.startswith(b"sglang:num_running_reqs{")]
    assert len(running) == 2 and all(b'dp_rank="' in line for line in running)


def test_rank_ports_are_checked_at_start():
    from emulator.cli import config_from, parser

    def cfg(*argv: str) -> object:
        return config_from(parser().parse_args(["--port", "8000", *argv]))

    ok = cfg("--data-parallel-size", "4", "--data-parallel-rank-ports", "9000")
    assert ok.dp_rank_ports == 9000  # type: ignore[attr-defined]
    assert cfg("--data-parallel-size", "4").dp_rank_ports is None  # type: ignore[attr-defined]
    for bad in (
        ("--data-parallel-rank-ports", "9000"),  # one rank: no group to split
        ("--data-parallel-size", "4", "--data-parallel-rank-ports", "7998"),  # 8000 inside
        ("--data-parallel-size", "4", "--data-parallel-rank-ports", "65534"),
        ("--data-parallel-size", "4", "--data-parallel-rank-ports", "0"),
    ):
        with pytest.raises(ValueError, match="rank-ports"):
            cfg(*bad)
