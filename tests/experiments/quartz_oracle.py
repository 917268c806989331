"""The Oracle method of the QUARTZ protocol (the QUARTZ paper, §5.3: "an offline upper
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emulator.engine import Engine, EngineConfig, StepResult
from policies.quantile.features import Quantiles
from policies.quantile.predictor import Prediction, Predictor
from policies.routing import make_router
from policies.types import RequestInfo, WorkerView
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

    def idle_prefill_s(self, prompt_tokens: int, hashes: tuple[int, ...]) -> float:
        """The request's prefill on an idle worker holding the longest prefix of it any
        worker's cache holds now: the oracle's ŝ(r) for the queue's key (what QUARTZ's
        `Predictor.size` estimates)."""
        best = 0
        cfg = None
        for eng in self.engines.values():
            cfg = eng.config
            hit = 0
            cache = eng._cache
            for h in hashes[: max(prompt_tokens - 1, 0) // cfg.block_size]:
                if h not in cache:
                    break
                hit += 1
            best = max(best, hit)
        if cfg is None:
            return 0.0
        todo = max(prompt_tokens - best * cfg.block_size, 1)
        return (math.ceil(todo / cfg.prefill_chunk) + 1) * (cfg.w + cfg.h)


def _oracle_predictor(oracle: EngineOracle) -> type[Predictor]:
    """QUARTZ's predictor with every prediction replaced by the oracle's exact value (all
    quantiles equal: no spread) and no calibration (nothing to correct). Same slots as
    `Predictor`, so the run's predictor object can take this class in place."""

    class OraclePredictor(Predictor):
        __slots__ = ()

        def predict(self, request: RequestInfo, view: WorkerView) -> Prediction:
            x = self.features(request, view)
            exact = oracle.prefill_s(
                view.id, request.prompt_tokens, request.prefix_hashes, request.id
            )
            q = Quantiles(exact, exact, exact)
            return Prediction(view.id, x, q, q, self.calibration.regime(x))

        def size(self, request: RequestInfo) -> Quantiles:
            exact = oracle.idle_prefill_s(request.prompt_tokens, request.prefix_hashes)
            return Quantiles(exact, exact, exact)

        def on_first_token(self, request: RequestInfo, now: float) -> None:
            self._now = now
            if self._forget(request.id) is not None:
                self.observed += 1

    return OraclePredictor


@dataclass
class OracleRouter:
    """QUARTZ's router (`quartz`, its parameters) whose predictor is made the oracle's
    when the run binds it (simulator.run attaches the run's predictor to every router
    passed in `routers=`): the hook that puts the oracle in without touching the policies."""

    oracle: EngineOracle
    params: dict[str, Any] = field(default_factory=dict)
    name: str = "oracle"
    inner: Any = None

    def __post_init__(self) -> None:
        self.inner = make_router("quartz", self.params)

    def bind_predictor(self, predictor: Predictor) -> None:
        predictor.__class__ = _oracle_predictor(self.oracle)
        self.inner.bind_predictor(predictor)

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        chosen: WorkerView | None = self.inner.choose(request, candidates)
        return chosen


def oracle_extras(pools: tuple[tuple[str, int], ...]) -> dict[str, Any]:
    """Arguments for simulator.run.run that make a QUARTZ run the Oracle."""
    oracle = EngineOracle(pools)
    return {
        "engine_factory": oracle.factory,
        "routers": {pool: OracleRouter(oracle) for pool, _ in pools},
    }
