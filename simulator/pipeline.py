"""The simulated gateway: the request pipeline of ARCHITECTURE.md, steps 3–7 and 9.

For each arriving request, in virtual time, with the live gateway's policy objects:

    on_arrival hooks → placement (policies.pools) → [admission, queueing: later issues]
      → routing (policies.routing Router.choose over WorkerViews) → dispatch to the worker
      → on_dispatch hooks … on_first_token hooks … on_complete hooks (settle)

The budget step is exact here: the simulator knows each request's true prompt length, so
`RequestInfo.prompt_tokens` is the engine's count (a later issue can add estimation
error). Placement's ordered pools are tried in turn: a pool whose router returns None
(no eligible worker) spills to the next, as the gateway does.

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
from typing import Protocol

from emulator.engine import EngineRequest, FinishedRequest
from policies.leases import WorkerSlot
from policies.pools import ShortLongPlacement, Verdict
from policies.routing import Router
from policies.types import Outcome, PoolSpec, RequestInfo, Status, WorkerView
from simulator.cluster import Cluster, Worker
from simulator.kernel import PRIO_TIMER, Kernel
from simulator.records import Recorder, RequestRecord
from simulator.workloads import RequestSpec


class Hook(Protocol):
    """A policy's view of a request's life (ARCHITECTURE.md, "Policies are plug-ins")."""

    def on_arrival(self, request: RequestInfo, now: float) -> None: ...

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None: ...

    def on_first_token(self, request: RequestInfo, now: float) -> None: ...

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None: ...


class Gateway:
    """The gateway side of the simulation: pipeline, in-flight bookkeeping, hooks."""

    def __init__(
        self,
        kernel: Kernel,
        cluster: Cluster,
        pool_specs: Sequence[PoolSpec],
        placement: ShortLongPlacement,
        routers: Mapping[str, Router],
        recorder: Recorder,
        hooks: Sequence[Hook] = (),
        scrape_interval: float = 0.0,
    ) -> None:
        self.kernel = kernel
        self.cluster = cluster
        self.pool_specs = tuple(pool_specs)
        self.placement = placement
        self.routers = dict(routers)
        self.recorder = recorder
        self.hooks = tuple(hooks)
        self.scrape_interval = scrape_interval
        self._live: dict[str, tuple[RequestInfo, RequestRecord, WorkerSlot]] = {}
        self.arrivals_left = 0  # set by whoever feeds the workload; keeps timers alive
        self._order = 0
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
        info = RequestInfo(
            id=spec.id,
            model=spec.model,
            arrival=now,
            prompt_tokens=spec.prompt_tokens,
            max_tokens=spec.max_tokens,
            entitlement=spec.client,
            category=spec.category,
            prefix_hashes=spec.prefix_hashes,
            slo_class=spec.slo_class,
        )
        record = self.recorder.new(spec, now)
        for h in self.hooks:
            h.on_arrival(info, now)
        placed = self.placement.place(info, self.pool_specs)
        if placed.verdict is not Verdict.PLACED:
            record.status = "rejected_413" if placed.verdict is Verdict.TOO_LONG else "rejected_404"
            return
        for pool in placed.pools:
            chosen = self.routers[pool].choose(info, self.candidates(pool))
            if chosen is not None:
                self.dispatch(info, record, spec, self.cluster.workers[chosen.id])
                return
        record.status = "rejected_503"

    def dispatch(
        self, info: RequestInfo, record: RequestRecord, spec: RequestSpec, worker: Worker
    ) -> None:
        now = self.kernel.now()
        record.pool, record.worker, record.dispatch = worker.pool, worker.id, now
        request = EngineRequest(
            id=spec.id,
            prompt_tokens=spec.prompt_tokens,
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
        slot = WorkerSlot(worker.view, spec.prompt_tokens + spec.max_tokens)
        self._live[spec.id] = (info, record, slot)
        for h in self.hooks:
            h.on_dispatch(info, worker.id, now)

    # -- worker callbacks (cluster.Listener) ------------------------------------------
    def first_token(self, worker: Worker, request_id: str) -> None:
        now = self.kernel.now()
        info, record, _ = self._live[request_id]
        record.first_token = now
        for h in self.hooks:
            h.on_first_token(info, now)

    def finished(self, worker: Worker, done: FinishedRequest) -> None:
        now = self.kernel.now()
        info, record, slot = self._live.pop(done.id)
        slot.release()
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
        for h in self.hooks:
            h.on_complete(info, outcome, now)

    def in_flight(self) -> int:
        return len(self._live)

    def active(self) -> bool:
        """Anything left to happen: arrivals to come or requests in flight."""
        return self.arrivals_left > 0 or bool(self._live)
