"""The Oracle method of the QUARTZ protocol (../shared/seeds/003 §5.3: "an offline upper
bound using observed prefill costs"), in the simulator only.

What "oracle" means here: QUARTZ's router and queue with the predictor replaced by the
simulated engine's own state, read at decision time. For request r on worker w:

    hit      = the prompt's leading full blocks that are in w's prefix cache *now*
               (the engine's cache, not the gateway's locality proxy)
    ahead    = requests in w's engine queue, FCFS, before r gets a batch slot
    free     = max_num_seqs − running(w)
    rest     = what is left of the step w is running (a new request joins the next one)
    slot     = 0 if ahead < free, else the (ahead − free + 1)-th smallest remaining
               slot-holding steps of w's running requests (their prefill chunks left
               plus the output tokens they will still generate — known to the oracle)
    t_iter   = W + H · min(running + waiting + 1, max_num_seqs)
    prefill  = rest + (slot + ⌈max(p − hit, 1) / C_chunk⌉ + 1) · t_iter

so every quantile is that one number (no spread): the oracle knows the engine's future
except for requests that arrive after the decision (which can still widen the batch or
take the freed slot first). It is an upper bound on *what a predictor can know* at the
router, not on any schedule: the order and routing are still QUARTZ's.

It reads the engine's private state (`_cache`, `_running`, `_waiting`): a simulator
privilege, which is the point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from emulator.engine import Engine, EngineConfig, StepResult
from simulator.kernel import Kernel


class _Engine(Engine):
    """The engine model, remembering when its running step ends."""

    step_end = 0.0

    def step(self) -> StepResult:
        result = super().step()
        self.step_end = self.clock.now() + result.duration
        return result


@dataclass
class EngineOracle:
    """The engines of a run, by worker id, and the exact prefill time on each."""

    pools: tuple[tuple[str, int], ...]  # (pool, workers) in the scenario's order
    engines: dict[str, _Engine] = field(default_factory=dict)
    _made: int = 0

    def factory(self, config: EngineConfig, kernel: Kernel) -> Engine:
        """An `EngineFactory` for simulator.run.run: builds the engine and remembers it
        under the id the cluster gives its worker (`<pool>-<i>`, in creation order)."""
        engine = _Engine(config, kernel.clock)
        i = self._made
        for pool, count in self.pools:
            if i < count:
                self.engines[f"{pool}-{i}"] = engine
                break
            i -= count
        self._made += 1
        return engine

    def prefill_s(
        self, worker: str, prompt_tokens: int, hashes: tuple[int, ...], request_id: str = ""
    ) -> float:
        """The request's prefill time (dispatch → first token) if sent to `worker` now;
        `request_id`: the request itself, when it is already in the engine's queue."""
        eng = self.engines[worker]
        cfg = eng.config
        bs = cfg.block_size
        hit = 0
        if cfg.enable_prefix_caching:
            cache = eng._cache
            for h in hashes[: max(prompt_tokens - 1, 0) // bs]:
                if h not in cache:
                    break
                hit += 1
        running = eng._running
        ahead = sum(1 for s in eng._waiting if s.id != request_id)
        free = cfg.max_num_seqs - len(running)
        slot = 0
        if ahead >= free:
            remaining = sorted(
                math.ceil(s.todo / cfg.prefill_chunk) + (s.out - s.gen) for s in running
            )
            k = ahead - free  # index of the slot r gets
            slot = remaining[k] if k < len(remaining) else (remaining[-1] if remaining else 0)
        n = min(len(running) + ahead + 1, cfg.max_num_seqs)
        t_iter = cfg.w + cfg.h * n
        todo = max(prompt_tokens - hit * bs, 1)
        rest = max(eng.step_end - eng.clock.now(), 0.0)
        return rest + (slot + math.ceil(todo / cfg.prefill_chunk) + 1) * t_iter
