"""The fleet: pools of workers, each one `emulator.engine.Engine` stepped in virtual time.

One engine model, two drivers: the emulator steps an `Engine` in (scaled) real time behind
HTTP, and a `Worker` here steps the very same class on the kernel's clock, exactly as the
engine's docstring prescribes:

- a step is planned with ``engine.step()`` at ``now`` and its outputs (tokens, finished
  requests) are delivered by an event at ``now + duration``;
- at that event, if the engine still has work, the next step is planned at once;
- a request submitted to a stepping worker joins its next step; a submission to an idle
  worker starts it stepping immediately.

So there is one event per worker step, never one per token. A step's slot occupancy
(``batch_size × duration``) is summed per worker: Σ over workers / (n · max_num_seqs · T)
is the pool's slot-time busy fraction, the utilisation FleetOpt's DES reports (§7.3).

Failure posture: `submit` raising ValueError (a request that can never fit the engine)
propagates to the caller, which records the request as failed; a step that makes no
progress (no batch, no time) parks the worker until the next submission instead of
spinning at one instant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from emulator.dp_engine import DpConfig, DpEngine
from emulator.engine import Engine, EngineConfig, EngineRequest, FinishedRequest, StepResult
from policies.health import HealthState, routable
from policies.types import WorkerView
from simulator.kernel import PRIO_STEP, Kernel

EngineFactory = Callable[[EngineConfig, Kernel], Engine | DpEngine]


@dataclass(slots=True)
class SimWorkerView(WorkerView):
    """A worker as routing sees it, with what the gateway keeps beside it (its
    `WorkerState`): whether it is in service (scenario `workers` events) and its health
    (policies/health.py): the circuit breaker's state, counted by the core on every
    attempt's outcome, and the health checks' hysteresis, as in the gateway. Routing's
    `healthy` is all of it: in service, healthy by the checks, its circuit not open."""

    in_service: bool = True
    health: HealthState = field(default_factory=HealthState)

    # the breaker's state (`BreakerState`, which the core's breaker counts on the slot's
    # load: this view) is the health state's
    @property
    def breaker_fails(self) -> int:
        return self.health.breaker_fails

    @breaker_fails.setter
    def breaker_fails(self, value: int) -> None:
        self.health.breaker_fails = value

    @property
    def open_until(self) -> float:
        return self.health.open_until

    @open_until.setter
    def open_until(self, value: float) -> None:
        self.health.open_until = value

    def routable(self, now: float) -> bool:
        return self.in_service and routable(self.health, now)

    def route_check(self, now: float) -> None:
        """`healthy` as of `now` (a circuit's open period ends with time alone)."""
        self.healthy = self.routable(now)


def default_engine(config: EngineConfig, kernel: Kernel) -> Engine:
    return Engine(config, kernel.clock)


def dp_engine(dp: DpConfig) -> EngineFactory:
    """A dp_group pool's engine: G ranks stepping in lockstep (emulator/dp_engine.py)."""

    def build(config: EngineConfig, kernel: Kernel) -> DpEngine:
        return DpEngine(config, kernel.clock, dp)

    return build


class Listener(Protocol):
    """Who hears about a worker's outputs (the simulated gateway)."""

    def first_token(self, worker: Worker, request_id: str) -> None: ...

    def finished(self, worker: Worker, done: FinishedRequest) -> None: ...

    def streamed(self, worker: Worker, tokens: tuple[str, ...]) -> None:
        """A data-parallel worker's step made these tokens (its ranks' loads follow)."""


class Worker:
    """One engine replica and its step loop."""

    __slots__ = (
        "_awaiting",
        "_kernel",
        "_listener",
        "_step_batch",
        "_step_start",
        "busy_slot_seconds",
        "busy_time",
        "config",
        "dirty",
        "dp",
        "engine",
        "fails_health",
        "hashed",
        "id",
        "pool",
        "refuses",
        "stepping",
        "steps",
        "tokens_out",
        "view",
    )

    def __init__(
        self,
        worker_id: str,
        pool: str,
        config: EngineConfig,
        kernel: Kernel,
        listener: Listener,
        factory: EngineFactory = default_engine,
    ) -> None:
        self.id = worker_id
        self.pool = pool
        self.config = config
        self.engine = factory(config, kernel)
        self._kernel = kernel
        self._listener = listener
        self._awaiting: dict[str, int] = {}  # submitted, no first token yet → submit order
        self.stepping = False
        self._step_start = 0.0  # the running step's start and batch, for `slot_seconds_at`
        self._step_batch = 0
        self.dirty = True  # engine state changed since the routing view last read it
        self.hashed = False  # some request brought prefix hashes: hit rates are worth reading
        self.view = SimWorkerView(id=worker_id, pool=pool, max_model_len=config.max_model_len)
        self.busy_slot_seconds = 0.0  # Σ batch_size · duration over steps
        self.busy_time = 0.0  # Σ duration: time the worker was stepping
        self.steps = 0
        self.tokens_out = 0
        # drops every connection (a dead engine the health checks have not caught yet):
        # the gateway's attempt fails before a response (scenario pool `refuse_connections`,
        # or a `fault` event for a period)
        self.refuses = False
        self.dp = isinstance(self.engine, DpEngine)
        self.fails_health = False  # fails its health checks (a `fault` with `health: fails`)

    def submit(self, request: EngineRequest, order: int) -> None:
        self.engine.submit(request)
        self._awaiting[request.id] = order
        if request.block_hashes:
            self.hashed = True
        self.dirty = True
        if not self.stepping:
            self._plan()

    def abort(self, request_id: str) -> FinishedRequest | None:
        self._awaiting.pop(request_id, None)
        self.dirty = True
        return self.engine.abort(request_id)

    def _plan(self) -> None:
        result = self.engine.step()
        if result.duration <= 0.0 and result.batch_size == 0:
            self.stepping = False  # nothing could run: wait for the next submission
            return
        self.stepping = True
        self._step_start = self._kernel.clock.t
        self._step_batch = result.batch_size
        self._kernel.at(self._kernel.clock.t + result.duration, PRIO_STEP, self._done, result)

    def _done(self, result: StepResult) -> None:
        self.steps += 1
        self.busy_time += result.duration
        self.busy_slot_seconds += result.batch_size * result.duration
        self.tokens_out += len(result.tokens)
        self.dirty = True
        awaiting = self._awaiting
        if awaiting and result.tokens:
            hits = awaiting.keys() & result.tokens
            if hits:
                # Submit order, not set order: the same run delivers in the same order.
                for rid in sorted(hits, key=awaiting.__getitem__):
                    del awaiting[rid]
                    self._listener.first_token(self, rid)
        if self.dp and result.tokens:
            self._listener.streamed(self, result.tokens)
        for done in result.finished:
            awaiting.pop(done.id, None)
            self._listener.finished(self, done)
        if self.engine.has_work():
            self._plan()
        else:
            self.stepping = False

    def slot_seconds_at(self, now: float) -> float:
        """Σ batch·duration up to `now`, counting the running step's elapsed part."""
        if self.stepping:
            return self.busy_slot_seconds + self._step_batch * (now - self._step_start)
        return self.busy_slot_seconds

    def refresh_view(self, now: float) -> None:
        """Copy the engine's telemetry into the routing view (what a scrape would read)."""
        engine = self.engine
        view = self.view
        view.running = engine.num_running
        view.waiting = engine.num_waiting
        view.kv_usage = engine.kv_usage
        if self.hashed:  # the full snapshot costs more; without hashes the hit rate is 0
            stats = engine.stats
            q = stats.prefix_queries_tokens
            view.prefix_hit_rate = stats.prefix_hits_tokens / q if q else 0.0
        self.dirty = False

    def kv_tokens(self) -> float:
        """Tokens resident in the KV cache of running requests (block granularity)."""
        return self.engine.kv_usage * self.config.num_kv_blocks * self.config.block_size


class Cluster:
    """Named pools of workers."""

    def __init__(self) -> None:
        self.pools: dict[str, list[Worker]] = {}
        self.workers: dict[str, Worker] = {}

    def add_pool(
        self,
        name: str,
        count: int,
        config: EngineConfig,
        kernel: Kernel,
        listener: Listener,
        factory: EngineFactory = default_engine,
    ) -> list[Worker]:
        if name in self.pools:
            raise ValueError(f"pool {name!r} defined twice")
        workers = [
            Worker(f"{name}-{i}", name, config, kernel, listener, factory) for i in range(count)
        ]
        self.pools[name] = workers
        for w in workers:
            self.workers[w.id] = w
        return workers
