"""Engine invariants over random workloads: conservation, block accounting, determinism."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import event, given, settings
from hypothesis import strategies as st

from emulator.engine import Engine, EngineConfig, EngineRequest, FinishedRequest, StepResult
from policies.clock import ManualClock


@dataclass(frozen=True)
class Submit:
    prompt: int
    out: int
    slack: int  # max_tokens - out
    prefix: int  # which of a few shared prefixes it starts with
    shared_blocks: int  # how many of its leading blocks belong to that prefix


@dataclass(frozen=True)
class Steps:
    n: int


@dataclass(frozen=True)
class Abort:
    index: int  # into the submitted ids, modulo


configs = st.builds(
    EngineConfig,
    max_model_len=st.just(2048),
    block_size=st.sampled_from([4, 16]),
    num_kv_blocks=st.integers(16, 120),
    max_num_seqs=st.integers(1, 16),
    prefill_chunk=st.sampled_from([16, 64, 512]),
    enable_prefix_caching=st.booleans(),
)
submits = st.builds(
    Submit,
    prompt=st.integers(1, 150),
    out=st.integers(1, 80),
    slack=st.integers(0, 3),
    prefix=st.integers(0, 2),
    shared_blocks=st.one_of(st.just(1000), st.integers(0, 40)),
)
ops = st.lists(
    st.one_of(
        submits,
        submits,
        submits,
        st.builds(Steps, st.integers(1, 20)),
        st.builds(Abort, st.integers(0, 1000)),
    ),
    min_size=8,
    max_size=60,
)


def hashes_for(op: Submit, i: int, block_size: int) -> tuple[int, ...]:
    """Chained-hash stand-ins: a shared prefix's blocks, then blocks unique to request i."""
    full = op.prompt // block_size
    k = min(op.shared_blocks, full)
    return tuple(op.prefix * 10_000 + b for b in range(k)) + tuple(
        (i + 1) * 1_000_000 + b for b in range(k, full)
    )


def drive(config: EngineConfig, script: list[object]) -> tuple[list[object], Engine, dict]:
    """Play the script, then run to idle; check the block accounting after every call."""
    clock = ManualClock()
    engine = Engine(config, clock)
    trace: list[object] = []
    submitted: dict[str, Submit] = {}
    ids: list[str] = []

    def step() -> StepResult:
        r = engine.step()
        clock.advance(r.duration)
        engine.check_invariants()
        stats = engine.stats
        assert 0.0 <= stats.kv_usage <= 1.0
        assert r.batch_size <= config.max_num_seqs
        trace.append(r)
        return r

    for op in script:
        if isinstance(op, Submit):
            rid = f"r{len(ids)}"
            er = EngineRequest(
                rid,
                op.prompt,
                op.out + op.slack,
                op.out,
                hashes_for(op, len(ids), config.block_size),
            )
            try:
                engine.submit(er)
            except ValueError:
                trace.append(("rejected", rid))
                continue
            ids.append(rid)
            submitted[rid] = op
        elif isinstance(op, Steps):
            for _ in range(op.n):
                if engine.has_work():
                    step()
        elif isinstance(op, Abort) and ids:
            rid = ids[op.index % len(ids)]
            f = engine.abort(rid)
            engine.check_invariants()
            trace.append(("abort", rid, f))
    guard = 0
    while engine.has_work():
        step()
        guard += 1
        assert guard < 200_000, "engine does not make progress"
    return trace, engine, submitted


def finished_records(trace: list[object]) -> list[FinishedRequest]:
    out: list[FinishedRequest] = []
    for t in trace:
        if isinstance(t, StepResult):
            out.extend(t.finished)
        elif isinstance(t, tuple) and t[0] == "abort" and t[2] is not None:
            out.append(t[2])
    return out


@settings(max_examples=150, deadline=None)
@given(configs, ops)
def test_every_request_finishes_exactly_once_with_its_tokens(
    config: EngineConfig, script: list[object]
) -> None:
    check_conservation(config, script)


pressure_configs = st.builds(
    EngineConfig,
    max_model_len=st.just(2048),
    block_size=st.just(16),
    num_kv_blocks=st.integers(14, 40),
    max_num_seqs=st.integers(2, 16),
    prefill_chunk=st.sampled_from([16, 64]),
    enable_prefix_caching=st.booleans(),
)


@settings(max_examples=80, deadline=None)
@given(pressure_configs, st.lists(submits, min_size=4, max_size=20), st.integers(0, 5))
def test_conservation_under_kv_pressure(
    config: EngineConfig, burst: list[Submit], aborts: int
) -> None:
    """Everything arrives at once into a cache far too small: preemption is the norm."""
    script: list[object] = [*burst, Steps(30), *(Abort(7 * i) for i in range(aborts))]
    check_conservation(config, script)


def check_conservation(config: EngineConfig, script: list[object]) -> None:
    trace, engine, submitted = drive(config, script)
    records = finished_records(trace)
    ids = [f.id for f in records]
    assert len(ids) == len(set(ids)) == len(submitted)
    produced: dict[str, int] = {}
    for t in trace:
        if isinstance(t, StepResult):
            for rid in t.tokens:
                produced[rid] = produced.get(rid, 0) + 1
    for f in records:
        op = submitted[f.id]
        assert produced.get(f.id, 0) == f.completion_tokens
        if f.reason == "abort":
            assert f.completion_tokens <= op.out
        else:
            assert f.completion_tokens == op.out
            assert f.reason == ("stop" if op.slack else "length")
            assert f.scheduled is not None and f.first_token is not None
            assert f.arrival <= f.scheduled < f.first_token <= f.finished
        assert 0 <= f.cached_tokens < f.prompt_tokens or f.cached_tokens == 0
    stats = engine.stats
    event(f"preempted: {stats.preemptions > 0}")
    event(f"prefix hits: {stats.prefix_hits_tokens > 0}")
    event(
        f"aborted a started request: {any(f.reason == 'abort' and f.scheduled is not None for f in records)}"
    )
    assert stats.running == stats.waiting == 0 and stats.kv_usage == 0.0
    assert sum(stats.finished_by_reason.values()) == len(submitted)
    assert stats.generation_tokens == sum(produced.values())
    assert stats.preemptions == sum(f.num_preemptions for f in records)
    assert stats.prefix_hits_tokens <= stats.prefix_queries_tokens
    if not config.enable_prefix_caching:
        assert stats.prefix_queries_tokens == 0 and stats.kv_blocks_cached == 0


@settings(max_examples=60, deadline=None)
@given(configs, ops)
def test_same_inputs_give_the_same_steps(config: EngineConfig, script: list[object]) -> None:
    first, _, _ = drive(config, script)
    second, _, _ = drive(config, script)
    assert first == second


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3000),
    st.integers(1, 200),
    st.sampled_from([64, 512]),
)
def test_a_lone_request_takes_ceil_chunks_plus_outputs_steps(
    prompt: int, out: int, chunk: int
) -> None:
    config = EngineConfig(prefill_chunk=chunk, enable_prefix_caching=False)
    trace, _, _ = drive(config, [Submit(prompt, out, 0, 0, 0)])
    steps = [t for t in trace if isinstance(t, StepResult)]
    chunks = -(-prompt // chunk)
    assert len(steps) == chunks + out
    f = steps[-1].finished[0]
    t_iter = config.w + config.h
    assert abs(f.finished - (chunks + out) * t_iter) < 1e-9
    assert f.first_token is not None
    assert abs(f.first_token - (chunks + 1) * t_iter) < 1e-9
