"""A P/D decode's request (emulator/pd.py): its prompt's KV came from the prefill, so the
engine computes only the last prompt token before decoding (`EngineRequest.remote_tokens`),
and a preempted request recomputes everything, as vLLM's decode does."""

from __future__ import annotations

import math

from emulator.engine import Engine, EngineConfig, EngineRequest
from policies.clock import ManualClock

W, H = 0.008, 0.00065


def _first_token(prompt: int, remote: int) -> float:
    clock = ManualClock()
    engine = Engine(EngineConfig(), clock)
    engine.submit(EngineRequest("a", prompt, 4, 4, remote_tokens=remote))
    while engine.has_work():
        r = engine.step()
        clock.advance(r.duration)
        engine.check_invariants()
        for f in r.finished:
            assert f.first_token is not None
            assert f.cached_tokens == 0  # not a prefix-cache hit
            return f.first_token
    raise AssertionError("never finished")


def test_a_remote_prefill_leaves_one_step_before_the_first_token():
    t = W + H  # one request in the batch
    # locally: ⌈4000/512⌉ = 8 prefill chunks, then the first token a step later (Eq. 7)
    assert math.isclose(_first_token(4000, 0), (math.ceil(4000 / 512) + 1) * t)
    # its KV arrived: the last prompt token alone is computed, the first token follows
    assert math.isclose(_first_token(4000, 4000), 2 * t)
    # a partial transfer computes the rest
    assert math.isclose(_first_token(4000, 4000 - 1024), (2 + 1) * t)
