"""The simulated gateway: the request pipeline of ARCHITECTURE.md, steps 3–7 and 9.

For each arriving request, in virtual time, with the live gateway's policy objects:

    on_arrival hooks → budget and placement (policies/intake.py, the gateway's own Intake)
      → [compression: the scenario's compression model, where placement asks for it]
      → [admission, queueing: later issues]
      → routing (policies.routing Router.choose over WorkerViews) → dispatch to the worker
      → on_dispatch hooks … on_first_token hooks … on_complete hooks (settle: ĉ_k learns)

The budget is exact by default (`budget: exact`: the workload knows each prompt's length)
or estimated from bytes as the gateway does (`budget: bytes`: a prompt's bytes are its
tokens times its category's bytes per token, and ĉ_k learns from the engine's counts).
Placement's ordered pools are tried in turn: a pool whose router returns None (no
eligible worker) spills to the next, as the gateway does. A compressed request reaches
the engine with its compressed length.

Telemetry (scenario ``telemetry.scrape_interval``):
- 0 (default) — *fresh*: a worker's engine stats are copied into its `WorkerView` just
  before a routing decision reads it (only workers whose engine changed are re-read);
- s > 0 — *scraped*: every s virtual seconds all views are refreshed at once, as the
  gateway's scraper polls /metrics; between scrapes routing sees the last scrape.
The engine's figures describe the step it is running (planned at its start), so they
already exclude requests that finish at that step's end, which the gateway still counts
in flight until the step's outputs arrive: fresh engine counts can trail `in_flight`
by those (as a live /metrics scrape mid-step would). `WorkerView.load` takes the max.
Either way `in_flight` and `outstanding_tokens` are the gateway's own exact counts,
updated at dispatch and completion, as in the live gateway. Views are long-lived objects
updated in place: a router must not keep them past `choose`.

Failure posture: a request no pool can hold is recorded as rejected (413), one no worker
can take as rejected (503), one the engine refuses (ValueError on submit) as an error;
every dispatched request gets exactly one on_complete, whatever its outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from emulator.engine import EngineRequest, FinishedRequest
from policies.budget import ChatSize
from policies.dispatch import FifoDispatcher, Waiter
from policies.hooks import Hook
from policies.intake import CHAT, Intake, Intaken, Prompt, Refusal
from policies.leases import WorkerSlot
from policies.routing import Router
from policies.types import Category, Outcome, PoolSpec, Status, WorkerView
from simulator.cluster import Cluster, Worker
from simulator.compression import CompressionModel
from simulator.kernel import PRIO_TIMER, Kernel
from simulator.records import Recorder, RequestRecord
from simulator.workloads import RequestSpec


class Gateway:
    """The gateway side of the simulation: pipeline, in-flight bookkeeping, hooks."""

    def __init__(
        self,
        kernel: Kernel,
        cluster: Cluster,
        pool_specs: Sequence[PoolSpec],
        intake: Intake,
        routers: Mapping[str, Router],
        recorder: Recorder,
        hooks: Sequence[Hook] = (),
        scrape_interval: float = 0.0,
        compression: CompressionModel | None = None,
        dispatcher: FifoDispatcher | None = None,
        bytes_per_token: Mapping[Category, float] | None = None,
    ) -> None:
        self.kernel = kernel
        self.cluster = cluster
        self.pool_specs = tuple(pool_specs)
        self.intake = intake
        self.compression = compression or CompressionModel()
        # (an empty dispatcher is falsy: it has a length)
        self.dispatcher = (
            dispatcher if dispatcher is not None else FifoDispatcher(1_000_000, 3600.0)
        )
        # None: the budget is exact; else a prompt's bytes per token, by category
        self.bytes_per_token = bytes_per_token
        self.routers = dict(routers)
        self.recorder = recorder
        self.hooks = tuple(hooks)
        self.scrape_interval = scrape_interval
        self._live: dict[str, tuple[Intaken, RequestRecord, WorkerSlot]] = {}
        self.arrivals_left = 0  # set by whoever feeds the workload; keeps timers alive
        self._order = 0
        self._waiting = 0  # requests queued for room (they keep the run alive)
        self._views: dict[str, list[WorkerView]] = {}

    def bind(self) -> None:
        """Take the cluster's pools as they now stand (workers are built with us as listener)."""
        self._views = {
            name: [w.view for w in workers] for name, workers in self.cluster.pools.items()
        }

    def start(self) -> None:
        """Begin periodic scrapes (scraped-telemetry mode), once the workload is queued."""
        if self.scrape_interval > 0:
            self._scrape(None)

    # -- telemetry -------------------------------------------------------------------
    def _scrape(self, _: object) -> None:
        now = self.kernel.now()
        for w in self.cluster.workers.values():
            w.refresh_view(now)
        if self.active():
            self.kernel.after(self.scrape_interval, PRIO_TIMER, self._scrape)

    def candidates(self, pool: str) -> list[WorkerView]:
        """The pool's workers as routing sees them now."""
        if self.scrape_interval <= 0:
            now = self.kernel.now()
            for w in self.cluster.pools[pool]:
                if w.dirty:
                    w.refresh_view(now)
        return self._views[pool]

    # -- the pipeline ----------------------------------------------------------------
    def arrive(self, spec: RequestSpec) -> None:
        now = self.kernel.now()
        bpt = self.bytes_per_token
        prompt = Prompt(
            CHAT,
            spec.model,
            ChatSize(round(spec.prompt_tokens * bpt[spec.category]) if bpt else 0, 1),
            spec.max_tokens,
            category=spec.category,
            exact_tokens=None if bpt else spec.prompt_tokens,
        )
        record = self.recorder.new(spec, now)
        taken = self.intake.take(prompt, spec.id, now, self.pool_specs)
        if isinstance(taken, Refusal):
            record.status = "rejected_413" if taken.kind == "too_long" else "rejected_404"
            return
        info = taken.info
        info.entitlement = spec.client
        info.prefix_hashes = spec.prefix_hashes
        info.slo_class = spec.slo_class
        for h in self.hooks:
            h.on_arrival(info, now)
        if taken.fit_target is not None:
            # what the gateway's exact count and compression give, from the true length
            result = self.compression.fit(
                info.category, spec.prompt_tokens, taken.fit_target, taken.placement.may_compress
            )
            refused = self.intake.fitted(taken, result)
            if refused is not None:
                record.status = "rejected_413"
                return
            if taken.compressed is not None:
                record.compressed_to = taken.compressed[1]
        d = self.dispatcher
        if len(d) and any(d.waiting(p) for p in taken.pools):
            self._wait(taken, record, spec)  # first come, first served
        elif not self._route(taken, record, spec):
            if any(w.view.healthy for p in taken.pools for w in self.cluster.pools[p]):
                self._wait(taken, record, spec)  # every healthy worker is at capacity
            else:
                record.status = "rejected_503"

    def _route(self, taken: Intaken, record: RequestRecord, spec: RequestSpec) -> bool:
        for pool in taken.pools:
            chosen = self.routers[pool].choose(taken.info, self.candidates(pool))
            if chosen is not None:
                self.dispatch(taken, record, spec, self.cluster.workers[chosen.id])
                return True
        return False

    # -- step 6: waiting for room (policies/dispatch.py) ------------------------------
    def _wait(self, taken: Intaken, record: RequestRecord, spec: RequestSpec) -> None:
        now = self.kernel.now()
        waiter = self.dispatcher.wait(spec.id, taken.pools, now)
        if waiter is None:
            record.status = "rejected_429"
            return
        waiter.token = (taken, record, spec)
        self._waiting += 1
        self.kernel.at(waiter.deadline, PRIO_TIMER, self._expire, waiter)

    def _expire(self, waiter: Waiter) -> None:
        if not waiter.done:
            self.dispatcher.cancel(waiter)
            self._waiting -= 1
            _, record, _ = waiter.token  # type: ignore[misc]
            record.status = "queue_timeout"

    def _room_freed(self, pool: str) -> None:
        if not len(self.dispatcher):
            return
        waiter = self.dispatcher.wake(pool)
        if waiter is not None:
            self._waiting -= 1
            taken, record, spec = waiter.token  # type: ignore[misc]
            if not self._route(taken, record, spec):
                self._wait(taken, record, spec)  # the room went elsewhere: wait again

    def dispatch(
        self, taken: Intaken, record: RequestRecord, spec: RequestSpec, worker: Worker
    ) -> None:
        now = self.kernel.now()
        info = taken.info
        record.pool, record.worker, record.dispatch = worker.pool, worker.id, now
        sent = spec.prompt_tokens if taken.compressed is None else taken.compressed[1]
        request = EngineRequest(
            id=spec.id,
            prompt_tokens=sent,
            max_tokens=spec.max_tokens,
            output_tokens=spec.output_tokens,
            block_hashes=spec.prefix_hashes,
        )
        self._order += 1
        try:
            worker.submit(request, self._order)
        except ValueError:
            record.status = "error"
            outcome = Outcome(Status.ERROR)
            for h in self.hooks:
                h.on_complete(info, outcome, now)
            return
        slot = WorkerSlot(worker.view, sent + spec.max_tokens)
        self._live[spec.id] = (taken, record, slot)
        for h in self.hooks:
            h.on_dispatch(info, worker.id, now)

    # -- worker callbacks (cluster.Listener) ------------------------------------------
    def first_token(self, worker: Worker, request_id: str) -> None:
        now = self.kernel.now()
        taken, record, _ = self._live[request_id]
        record.first_token = now
        for h in self.hooks:
            h.on_first_token(taken.info, now)

    def finished(self, worker: Worker, done: FinishedRequest) -> None:
        now = self.kernel.now()
        taken, record, slot = self._live.pop(done.id)
        info = taken.info
        slot.release()
        self._room_freed(worker.pool)
        record.finish = now
        record.scheduled = done.scheduled
        record.completion_tokens = done.completion_tokens
        record.cached_tokens = done.cached_tokens
        record.preemptions = done.num_preemptions
        record.status = "ok" if done.reason in ("stop", "length") else done.reason
        ttft = None if record.first_token is None else record.first_token - record.arrival
        prefill = None
        if record.first_token is not None and done.scheduled is not None:
            prefill = record.first_token - done.scheduled
        outcome = Outcome(
            Status.OK if record.status == "ok" else Status.ERROR,
            prompt_tokens=done.prompt_tokens,
            completion_tokens=done.completion_tokens,
            ttft=ttft,
            prefill_time=prefill,
            latency=now - record.arrival,
        )
        if outcome.status is Status.OK:
            self.intake.learn(taken, done.prompt_tokens)
        for h in self.hooks:
            h.on_complete(info, outcome, now)

    def in_flight(self) -> int:
        return len(self._live)

    def active(self) -> bool:
        """Anything left to happen: arrivals to come or requests in flight."""
        return self.arrivals_left > 0 or bool(self._live) or self._waiting > 0
