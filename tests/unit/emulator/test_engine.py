"""The engine model against FleetOpt Eq. 3–4, 7 and vLLM's scheduler semantics."""

from __future__ import annotations

import itertools
import math

import pytest

from emulator.engine import (
    Engine,
    EngineConfig,
    EngineRequest,
    FinishedRequest,
    StepResult,
)
from policies.clock import ManualClock

W, H = 0.008, 0.00065


def make(**kw: object) -> tuple[Engine, ManualClock]:
    clock = ManualClock()
    return Engine(EngineConfig(**kw), clock), clock  # type: ignore[arg-type]


def run(engine: Engine, clock: ManualClock, limit: int = 100_000) -> list[StepResult]:
    steps = []
    while engine.has_work():
        r = engine.step()
        clock.advance(r.duration)
        engine.check_invariants()
        steps.append(r)
        assert len(steps) < limit
    return steps


def finished_by_id(steps: list[StepResult]) -> dict[str, FinishedRequest]:
    out: dict[str, FinishedRequest] = {}
    for s in steps:
        for f in s.finished:
            assert f.id not in out
            out[f.id] = f
    return out


def req(i: int | str, prompt: int, out: int, max_tokens: int | None = None, **kw: object):
    return EngineRequest(str(i), prompt, max_tokens or out, out, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("l_in", "l_out"),
    [(1, 1), (16, 3), (512, 1), (513, 5), (1000, 10), (4096, 100), (7000, 1000)],
)
def test_single_request_matches_eq4_and_eq7(l_in: int, l_out: int) -> None:
    engine, clock = make()
    engine.submit(req("a", l_in, l_out))
    steps = run(engine, clock)
    t_iter = W + H * 1
    chunks = math.ceil(l_in / 512)
    assert len(steps) == chunks + l_out  # Eq. 4: slot occupancy in steps
    assert all(s.duration == pytest.approx(t_iter) and s.batch_size == 1 for s in steps)
    f = steps[-1].finished[0]
    assert f.first_token == pytest.approx((chunks + 1) * t_iter)  # Eq. 7 with W_queue = 0
    assert f.finished == pytest.approx((chunks + l_out) * t_iter)  # Eq. 4
    assert f.scheduled == 0.0 and f.arrival == 0.0
    assert f.completion_tokens == l_out and f.reason == "length"
    assert sum(s.prefill_tokens for s in steps) == l_in
    assert [len(s.tokens) for s in steps] == [0] * chunks + [1] * l_out


def test_queue_time_adds_to_ttft() -> None:
    engine, clock = make()
    clock.set(5.0)
    engine.submit(req("a", 600, 2))
    clock.set(7.5)  # the engine first steps 2.5 s after arrival
    f = finished_by_id(run(engine, clock))["a"]
    t_iter = W + H
    assert f.arrival == 5.0 and f.scheduled == 7.5
    assert f.first_token - f.arrival == pytest.approx(2.5 + 3 * t_iter)


def test_step_duration_grows_with_batch_size() -> None:
    durations = []
    for n in (1, 2, 8, 64, 256):
        engine, _ = make()
        for i in range(n):
            engine.submit(req(i, 100, 5))
        first = engine.step()
        assert first.batch_size == n
        assert first.duration == pytest.approx(W + H * n)
        durations.append(first.duration)
    assert durations == sorted(durations) and len(set(durations)) == len(durations)


def ttft_of(prompt: int, batch: int) -> float:
    engine, clock = make()
    for i in range(batch - 1):
        engine.submit(req(f"other{i}", 100, 50))
    engine.submit(req("probe", prompt, 3))
    f = finished_by_id(run(engine, clock))["probe"]
    assert f.first_token is not None
    return f.first_token - f.arrival


def test_ttft_grows_with_prompt_length_and_batch_size() -> None:
    by_prompt = [ttft_of(p, 1) for p in (100, 512, 513, 2000, 5000)]
    assert by_prompt == sorted(by_prompt)
    assert by_prompt[0] == by_prompt[1] < by_prompt[2] < by_prompt[3] < by_prompt[4]
    by_batch = [ttft_of(1000, b) for b in (1, 4, 32, 128)]
    assert all(a < b for a, b in itertools.pairwise(by_batch))


def test_max_num_seqs_bounds_the_batch() -> None:
    engine, clock = make(max_num_seqs=4)
    for i in range(10):
        engine.submit(req(i, 50, 20))
    first = engine.step()
    assert first.batch_size == 4
    assert engine.stats.running == 4 and engine.stats.waiting == 6
    clock.advance(first.duration)
    steps = [first, *run(engine, clock)]
    assert max(s.batch_size for s in steps) == 4
    done = finished_by_id(steps)
    assert sorted(done, key=int) == [str(i) for i in range(10)]
    # FCFS: later requests are scheduled no earlier than earlier ones.
    sched = [done[str(i)].scheduled for i in range(10)]
    assert sched == sorted(sched)


def test_preemption_when_blocks_run_out_and_everyone_still_finishes() -> None:
    # 40 blocks of 16 tokens = 640 tokens; 8 requests each growing to 32 + 120 tokens.
    engine, clock = make(num_kv_blocks=40, enable_prefix_caching=False)
    for i in range(8):
        engine.submit(req(i, 32, 120))
    steps = run(engine, clock)
    done = finished_by_id(steps)
    stats = engine.stats
    assert stats.preemptions > 0
    assert any(s.preempted for s in steps)
    assert sum(f.num_preemptions for f in done.values()) == stats.preemptions
    assert len(done) == 8
    assert all(f.completion_tokens == 120 and f.reason == "length" for f in done.values())
    assert stats.generation_tokens == 8 * 120
    # Recomputation: more prefill than the prompts alone.
    assert sum(s.prefill_tokens for s in steps) > 8 * 32
    assert stats.kv_usage == 0.0 and stats.running == 0 and stats.waiting == 0


def test_preemption_takes_the_most_recently_admitted() -> None:
    engine, clock = make(num_kv_blocks=6, enable_prefix_caching=False, block_size=16)
    engine.submit(req("old", 32, 60))
    engine.submit(req("new", 32, 60))
    steps = run(engine, clock)
    first_preemption = next(s for s in steps if s.preempted)
    assert first_preemption.preempted == ("new",)
    done = finished_by_id(steps)
    assert done["old"].num_preemptions == 0 and done["new"].num_preemptions >= 1


def test_prefix_cache_hits_skip_prefill() -> None:
    engine, clock = make()
    hashes = tuple(range(1000, 1000 + 2048 // 16))
    engine.submit(req("cold", 2048 + 5, 2, block_hashes=hashes))
    cold_steps = run(engine, clock)
    engine.submit(req("warm", 2048 + 5, 2, block_hashes=hashes))
    warm_steps = run(engine, clock)
    cold = finished_by_id(cold_steps)["cold"]
    warm = finished_by_id(warm_steps)["warm"]
    assert cold.cached_tokens == 0 and warm.cached_tokens == 2048
    assert len(warm_steps) == 1 + 2 < len(cold_steps) == 5 + 2
    assert warm.first_token - warm.arrival < cold.first_token - cold.arrival
    assert sum(s.prefill_tokens for s in warm_steps) == 5
    stats = engine.stats
    assert stats.prefix_queries_tokens == 2 * 2053
    assert stats.prefix_hits_tokens == 2048
    assert stats.prompt_tokens == 2 * 2053  # vLLM counts computed + cached
    # Cached but free blocks are not "in use".
    assert stats.kv_usage == 0.0 and stats.kv_blocks_cached == len(hashes)


def test_fully_cached_prompt_recomputes_its_last_block() -> None:
    engine, clock = make()
    hashes = tuple(range(64))
    engine.submit(req("a", 1024, 1, block_hashes=hashes))
    run(engine, clock)
    engine.submit(req("b", 1024, 1, block_hashes=hashes))
    steps = run(engine, clock)
    assert finished_by_id(steps)["b"].cached_tokens == 1024 - 16
    assert sum(s.prefill_tokens for s in steps) == 16


def test_partial_prefix_and_divergent_suffix() -> None:
    engine, clock = make()
    engine.submit(req("a", 640, 1, block_hashes=tuple(range(40))))
    run(engine, clock)
    engine.submit(req("b", 640, 1, block_hashes=(*range(10), *range(500, 530))))
    f = finished_by_id(run(engine, clock))["b"]
    assert f.cached_tokens == 160


def test_cached_blocks_are_evicted_lru_when_space_is_needed() -> None:
    engine, clock = make(num_kv_blocks=8)
    engine.submit(req("a", 64, 1, block_hashes=(1, 2, 3, 4)))
    run(engine, clock)
    engine.submit(req("b", 64, 1, block_hashes=(5, 6, 7, 8)))
    run(engine, clock)
    assert engine.stats.kv_blocks_cached == 8
    engine.submit(req("c", 64, 1, block_hashes=(9, 10, 11, 12)))  # evicts a's blocks
    run(engine, clock)
    engine.submit(req("b2", 64, 1, block_hashes=(5, 6, 7, 8)))
    assert finished_by_id(run(engine, clock))["b2"].cached_tokens == 48
    engine.submit(req("a2", 64, 1, block_hashes=(1, 2, 3, 4)))
    assert finished_by_id(run(engine, clock))["a2"].cached_tokens == 0


def test_concurrent_requests_share_prefix_blocks() -> None:
    engine, clock = make(num_kv_blocks=100)
    shared = tuple(range(32))  # 512 tokens
    engine.submit(req("first", 520, 50, block_hashes=shared))
    r = engine.step()  # computes the first chunk: its 32 blocks become cached
    clock.advance(r.duration)
    used_alone = engine.stats.kv_blocks_used
    engine.submit(req("second", 520, 50, block_hashes=shared))
    r = engine.step()
    clock.advance(r.duration)
    # The second request holds only its own last block beyond the shared 32.
    assert engine.stats.kv_blocks_used == used_alone + 1
    done = finished_by_id(run(engine, clock))
    assert done["second"].cached_tokens == 512


def test_abort_frees_blocks() -> None:
    engine, clock = make(max_num_seqs=1)
    engine.submit(req("run", 1000, 100))
    engine.submit(req("wait", 1000, 100))
    for _ in range(5):
        clock.advance(engine.step().duration)
    assert engine.stats.kv_usage > 0 and engine.stats.waiting == 1
    f = engine.abort("run")
    assert f is not None and f.reason == "abort" and f.completion_tokens == 3
    assert f.finished == clock.now()
    assert engine.stats.kv_usage == 0.0 and engine.stats.running == 0
    w = engine.abort("wait")
    assert w is not None and w.scheduled is None and w.first_token is None
    assert engine.abort("wait") is None and engine.abort("nobody") is None
    assert not engine.has_work()
    assert engine.stats.finished_by_reason == {"abort": 2}
    engine.check_invariants()


def test_kv_usage_stays_in_unit_interval_under_load() -> None:
    engine, clock = make(num_kv_blocks=64, max_num_seqs=16)
    for i in range(40):
        engine.submit(req(i, 20 + 7 * i, 30 + i, block_hashes=tuple(range(i % 3, i % 3 + 1))))
    seen = []
    while engine.has_work():
        clock.advance(engine.step().duration)
        stats = engine.stats
        assert (engine.kv_usage, engine.num_running, engine.num_waiting) == (
            stats.kv_usage,
            stats.running,
            stats.waiting,
        )
        seen.append(stats.kv_usage)
    assert all(0.0 <= u <= 1.0 for u in seen) and max(seen) > 0.5


def test_stop_versus_length() -> None:
    engine, clock = make()
    engine.submit(req("eos", 10, 3, max_tokens=50))
    engine.submit(req("cap", 10, 4, max_tokens=4))
    done = finished_by_id(run(engine, clock))
    assert done["eos"].reason == "stop" and done["eos"].completion_tokens == 3
    assert done["cap"].reason == "length" and done["cap"].completion_tokens == 4
    assert engine.stats.finished_by_reason == {"stop": 1, "length": 1}


def test_request_finish_reason_overrides_and_timing_follows_output_tokens() -> None:
    """A stop string on the last allowed token is a "stop" (vLLM); an early stop ends the
    request at that token, so it holds a slot and makes tokens exactly that long."""
    engine, clock = make()
    engine.submit(req("stop-at-cap", 10, 4, max_tokens=4, finish_reason="stop"))
    engine.submit(req("early", 10, 2, max_tokens=40, finish_reason="stop"))
    engine.submit(req("sglang-cap", 10, 4, max_tokens=4, finish_reason="length"))
    steps = run(engine, clock)
    done = finished_by_id(steps)
    assert done["stop-at-cap"].reason == "stop" and done["stop-at-cap"].completion_tokens == 4
    assert done["early"].reason == "stop" and done["early"].completion_tokens == 2
    assert done["sglang-cap"].reason == "length"
    assert sum(t == "early" for s in steps for t in s.tokens) == 2
    assert engine.stats.finished_by_reason == {"stop": 2, "length": 1}
    with pytest.raises(ValueError, match="finish_reason"):
        engine.submit(req("bad", 10, 2, max_tokens=4, finish_reason="abort"))


def test_tokens_are_in_submit_order_even_after_preemption() -> None:
    engine, clock = make(num_kv_blocks=12, enable_prefix_caching=False)
    for i in range(5):
        engine.submit(req(i, 16, 40))
    steps = run(engine, clock)
    assert engine.stats.preemptions > 0
    for s in steps:
        assert [int(t) for t in s.tokens] == sorted(int(t) for t in s.tokens)


def test_submit_rejects_what_can_never_run() -> None:
    engine, _ = make(max_model_len=1000, num_kv_blocks=10)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.submit(req("long", 900, 101))
    with pytest.raises(ValueError, match="KV blocks"):
        engine.submit(req("big", 150, 20))  # 169 tokens of KV > 160
    engine.submit(req("fits", 150, 11))  # 160 tokens: exactly the cache
    with pytest.raises(ValueError, match="already"):
        engine.submit(req("fits", 1, 1))
    with pytest.raises(ValueError):
        engine.submit(req("none", 0, 1))
    with pytest.raises(ValueError):
        engine.submit(EngineRequest("over", 10, 5, 6))
    with pytest.raises(ValueError):
        EngineConfig(block_size=0)


def test_step_without_work_is_empty_and_instant() -> None:
    engine, clock = make()
    clock.set(3.0)
    r = engine.step()
    assert r == StepResult(3.0, 0.0, 0, 0, (), ())
    assert engine.stats.steps == 0 and not engine.has_work()


def test_counters() -> None:
    engine, clock = make()
    for i in range(3):
        engine.submit(req(i, 100, 10))
    steps = run(engine, clock)
    stats = engine.stats
    assert stats.steps == len(steps)
    assert stats.generation_tokens == 30 == sum(len(s.tokens) for s in steps)
    assert stats.prompt_tokens == 300
    assert stats.prefix_queries_tokens == 300 and stats.prefix_hits_tokens == 0


# --- compute-bound prefill (prefill_token_s, max_num_batched_tokens), off by default ---------
def test_a_step_lasts_longer_by_the_prompt_tokens_it_computes() -> None:
    engine, clock = make(prefill_token_s=0.0001)
    engine.submit(req("a", 1200, 2))
    durations = [s.duration for s in run(engine, clock)]
    # chunks of 512, 512, 176 prompt tokens, then two decode steps
    expected = [W + H + 0.0001 * c for c in (512, 512, 176, 0, 0)]
    assert durations == pytest.approx(expected)


def _first_tokens(**kw: object) -> dict[str, float]:
    engine, clock = make(**kw)
    engine.submit(req("long", 8000, 1))
    engine.submit(req("short", 100, 1))
    return {f.id: f.first_token for f in finished_by_id(run(engine, clock)).values()}


def test_a_token_budget_puts_a_short_prompt_behind_a_long_prefill() -> None:
    """Head-of-line blocking: with a per-step budget the long prompt admitted first takes
    it, and the short one's first token waits for the long prefill; without a budget each
    request prefills its own chunk side by side, as FleetOpt's model has it."""
    free = _first_tokens()
    budget = _first_tokens(max_num_batched_tokens=512)
    assert free["short"] < free["long"]
    assert budget["short"] > free["short"]
    # the short prompt's chunk runs once the long prompt's 16 chunks of 512 are done
    steps_before = math.ceil(8000 / 512)
    assert budget["short"] >= steps_before * (W + 2 * H)


def test_defaults_keep_fleetopts_step() -> None:
    config = EngineConfig()
    assert config.prefill_token_s == 0.0 and config.max_num_batched_tokens is None
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(max_num_seqs=64, max_num_batched_tokens=32)
    with pytest.raises(ValueError, match="prefill_token_s"):
        EngineConfig(prefill_token_s=-1.0)


def test_kv_events_tell_every_cached_block_and_every_eviction():
    """The engine's KV events (--kv-events-config) replayed in order give exactly the
    cached blocks the engine holds, and each stored run's first index and hashes are the
    prompt's own (what the publisher turns into vLLM's BlockStored token_ids and parent)."""
    from emulator.prefix import block_hashes

    engine, clock = make(num_kv_blocks=24, block_size=4, max_num_seqs=2, max_model_len=64)
    events: list[tuple[object, ...]] = []
    engine.kv_events = events
    prompts = {f"r{i}": [i * 1000 + t for t in range(40)] for i in range(4)}
    for rid, ids in prompts.items():
        hashes = block_hashes(ids, 4)
        engine.submit(EngineRequest(rid, len(ids), 4, 4, hashes, token_ids=ids))
    run(engine, clock)
    held: set[int] = set()
    for e in events:
        if e[0] == "stored":
            _, req, first, run_hashes = e
            assert run_hashes == req.block_hashes[first : first + len(run_hashes)]  # type: ignore[attr-defined]
            held.update(run_hashes)  # type: ignore[arg-type]
        else:
            held.difference_update(e[1])  # type: ignore[arg-type]
    assert any(e[0] == "removed" for e in events)  # 4 × 10 blocks do not fit in 24
    assert held == set(engine._cache)
