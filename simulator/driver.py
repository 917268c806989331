"""The simulator's driver of the request pipeline core (policies/core.py), in virtual time.

For each arriving request the kernel calls `arrive`; everything between arrival and
completion is the core's state machine, with the live gateway's policy objects. This
module only carries out its actions on the kernel and the simulated engines, as
gateway/proxy.py and gateway/forward.py carry them out over HTTP:

    core.start → Fit: the scenario's compression model → core.on(Fitted)
               → Send: submit to the engine model (it drops the connection: UpstreamFailed;
                 it refuses a context too long: ContextRefused) … first token: FIRST_TOKEN
                 … finished: Finished
               → Wait: a kernel timer at the deadline (DEADLINE), unless a wake first
               → Refuse / Fail: the record's status, and Finished
    core.on_action: a woken request's Send or Wait, an evicted request's Evict
               → SendPair (a `pd` pool, simulator/pd_topology.py): the prefill (one output
                 token) on the prefill worker … it ends: HANDED_OFF → (SendDecode, or
                 PROCEED for SGLang's) the decode on the decode worker after the KV's
                 transfer, its prompt computed already … first token, finished as any

The budget is exact by default (`budget: exact`:
the workload knows each prompt's length) or estimated from bytes as the gateway does
(`budget: bytes`: a prompt's bytes are its tokens times its category's bytes per token,
and ĉ_k learns from the engine's counts). A compressed request reaches the engine with
its compressed length.

Telemetry (scenario ``telemetry.scrape_interval``):
- 0 (default) — *fresh*: a worker's engine stats are copied into its `WorkerView` just
  before a routing decision reads it (only workers whose engine changed are re-read);
- s > 0 — *scraped*: every s virtual seconds all views are refreshed at once, as the
  gateway's scraper polls /metrics; between scrapes routing sees the last scrape.
The engine's figures describe the step it is running (planned at its start), so they
already exclude requests that finish at that step's end, which the gateway still counts
in flight until the step's outputs arrive: fresh engine counts can trail `in_flight`
by those (as a live /metrics scrape mid-step would). `WorkerView.load` takes the max.
Either way `in_flight` and `outstanding_tokens` are the core's worker-slot leases.
Views are long-lived objects updated in place: a router must not keep them past `choose`.

With QUARTZ's predictor (simulator/run.py builds it when the scenario or a policy asks)
each record gets the feature vector and calibrated prediction at dispatch for the worker
chosen, and the observed prefill (first token − dispatch): the same fields the gateway's
request log carries.

Clients given a `Retry` (scenario tenants' `retry`) send a request refused at admission
again after its Retry-After, capped; each attempt is a record of its own (id `r…~2`, …)
carrying its attempt number and its first attempt's arrival.

Eviction (token pools): a grant that names preemptible holds to evict
(`TokenCharge.evict`) makes the core hand each of those requests an `Evict` — aborted on
their engine (or already out of the wait queue), completed through the core (settled with what they used, every
lease released, once) and recorded as `evicted` with the code `preempted`, as the gateway
answers them.

Failure posture: a request no pool can hold is recorded as rejected (413), one refused
admission as rejected (429), one no worker can take as rejected (503), one that waited
past the queue's timeout as `queue_timeout`, one the engine refuses (ValueError on submit)
as an error — unless its context was the reason and a longer pool takes it (the core's
safety net); a worker that drops connections (scenario pool `refuse_connections`, or a
`fault` event for a period) costs a retry on another worker, and counts against its
circuit breaker (`policy.breaker`), which the core applies as in the gateway: an open
circuit keeps the worker out of routing for `open_s`, and a pool with no routable worker
is down for placement (as the gateway's `Fleet.live_pools`). Every placed request gets exactly one on_complete, whatever its
outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from emulator.engine import EngineRequest, FinishedRequest
from policies.actions import (
    PROCEED,
    Action,
    Evict,
    Fail,
    Fit,
    Proceed,
    Refuse,
    Send,
    SendDecode,
    SendPair,
    Wait,
)
from policies.budget import ChatSize
from policies.core import Core
from policies.events import (
    ANSWERED,
    DEADLINE,
    FIRST_TOKEN,
    HANDED_OFF,
    ContextRefused,
    Finished,
    Fitted,
    Request,
    Streamed,
    UpstreamFailed,
)
from policies.health import Hysteresis
from policies.intake import CHAT, Prompt
from policies.ticket import Ticket
from policies.types import Category, Outcome, PoolSpec, Status
from simulator.cluster import Cluster, SimWorkerView, Worker
from simulator.compression import CompressionModel
from simulator.kernel import PRIO_ARRIVAL, PRIO_TIMER, Kernel
from simulator.records import Recorder, RequestRecord
from simulator.workloads import RequestSpec, Retry

if TYPE_CHECKING:  # only annotated here (simulator/run.py builds it)
    from policies.quantile.predictor import Predictor


# how a refusal after placement is recorded, by the core's code
_REFUSED = {
    "too_long": "rejected_413",
    "queue_full": "rejected_429",
    "queue_timeout": "queue_timeout",
    "no_healthy_worker": "rejected_503",
}


class _Live:
    """The driver's handle on a request (`Ticket.token`): its record, its spec and, while
    it waits for room, its deadline timer."""

    __slots__ = ("deadline", "record", "spec")

    def __init__(self, record: RequestRecord, spec: RequestSpec) -> None:
        self.record = record
        self.spec = spec
        self.deadline: int | None = None


def _live(ticket: Ticket) -> _Live:
    """The driver's handle on a ticket's request: `arrive` gives every ticket one."""
    live = ticket.token
    assert isinstance(live, _Live)
    return live


class Driver:
    """The gateway side of the simulation: the core, driven by the kernel's events."""

    def __init__(
        self,
        kernel: Kernel,
        cluster: Cluster,
        pool_specs: Sequence[PoolSpec],
        core: Core,
        recorder: Recorder,
        scrape_interval: float = 0.0,
        compression: CompressionModel | None = None,
        bytes_per_token: dict[Category, float] | None = None,
        retries: Mapping[str, Retry] | None = None,
        predictor: Predictor | None = None,
        health_checks: tuple[Hysteresis, float] | None = None,
    ) -> None:
        self.kernel = kernel
        self.cluster = cluster
        self.pool_specs = tuple(pool_specs)
        self._context = {p.name: p.max_model_len for p in self.pool_specs}
        self.core = core
        core.on_action = self.act  # a wake or an eviction: an action for another request
        core.views = self.candidates
        core.load_of = self._load_of
        core.clock = kernel.clock
        self.compression = compression or CompressionModel()
        # None: the budget is exact; else a prompt's bytes per token, by category
        self.bytes_per_token = bytes_per_token
        self.recorder = recorder
        self.predictor = predictor  # QUARTZ's: records get its features and prediction
        self.scrape_interval = scrape_interval
        # every interval each worker's health check, its result through the hysteresis
        # (None: no worker can fail one: a check would change nothing)
        self.health_checks = health_checks
        # clients that retry an admission refusal (429) after its Retry-After, by client
        self.retries = dict(retries or {})
        self._retrying = 0  # retries scheduled, not yet arrived (they keep the run alive)
        # on an engine: its ticket, by request id
        self._live: dict[str, Ticket] = {}
        self._streamed: dict[str, int] = {}  # dp_group requests: tokens streamed so far
        self.evictions = 0
        self.arrivals_left = 0  # set by whoever feeds the workload; keeps timers alive
        self._order = 0
        self._waiting = 0  # requests queued for room (they keep the run alive)
        self._views: dict[str, list[SimWorkerView]] = {}
        self._breaker = core.breaker is not None  # views' `healthy` follows their circuits
        # `pd` pools: the KV's transfer time per block, by pool; prefills on an engine
        # (their engine id → ticket); each request's hand-off and decode dispatch times
        self.transfer_s_per_block: dict[str, float] = {}
        self._prefills: dict[str, Ticket] = {}
        self.handoffs: dict[str, tuple[float, float]] = {}

    def bind(self) -> None:
        """Take the cluster's pools as they now stand (workers are built with us as listener)."""
        self._views = {
            name: [w.view for w in workers] for name, workers in self.cluster.pools.items()
        }

    def start(self) -> None:
        """Begin periodic scrapes (scraped-telemetry mode) and health checks, once the
        workload is queued."""
        if self.scrape_interval > 0:
            self._scrape(None)
        if self.health_checks is not None:
            self.kernel.after(self.health_checks[1], PRIO_TIMER, self._check_health)

    # -- telemetry -------------------------------------------------------------------
    def _scrape(self, _: object) -> None:
        now = self.kernel.now()
        for w in self.cluster.workers.values():
            w.refresh_view(now)
        if self.active():
            self.kernel.after(self.scrape_interval, PRIO_TIMER, self._scrape)

    def _check_health(self, _: object) -> None:
        """Every worker's health check now (as the gateway's health loop): a worker in a
        fault that fails them answers no; the hysteresis decides (policies/health.py)."""
        assert self.health_checks is not None
        hysteresis, interval = self.health_checks
        now = self.kernel.now()
        for w in self.cluster.workers.values():
            hysteresis.checked(w.view.health, not w.fails_health)
            w.view.route_check(now)
        if self.active():
            self.kernel.after(interval, PRIO_TIMER, self._check_health)

    def _load_of(self, worker: str) -> SimWorkerView:
        return self.cluster.workers[worker].view

    def candidates(self, pool: str) -> list[SimWorkerView]:
        """The pool's workers as routing sees them now (with a circuit breaker, a worker
        whose circuit is open is not healthy until its open period ends, as the
        gateway's `WorkerState.view` says)."""
        views = self._views[pool]
        if self.scrape_interval <= 0:
            now = self.kernel.now()
            for w in self.cluster.pools[pool]:
                if w.dirty:
                    w.refresh_view(now)
        if self._breaker:
            now = self.kernel.now()
            for v in views:
                v.route_check(now)
        return views

    def _live_pools(self, now: float) -> frozenset[str] | None:
        """The pools with a routable worker (in service, its circuit not open), as the
        gateway's `Fleet.live_pools` tells placement; None while every pool has one (the
        same placement: the scan stops at each pool's first routable worker)."""
        live = [name for name, views in self._views.items() if any(v.routable(now) for v in views)]
        return None if len(live) == len(self._views) else frozenset(live)

    # -- the pipeline: carrying out the core's actions ----------------------------------
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
        core = self.core
        request = Request(
            prompt,
            spec.id,
            self.pool_specs,
            self._live_pools(now),
            entitlement=spec.client,
            slo_class=spec.slo_class,
            prefix_hashes=spec.prefix_hashes,
            known_prompt_tokens=spec.prompt_tokens,
            session=spec.session,
        )
        action = core.start(request, now)
        assert not isinstance(action, Proceed)  # start names the request, or refuses it
        ticket = action.ticket
        if ticket is None:  # refused at placement
            assert isinstance(action, Refuse)
            record.status = "rejected_413" if action.code == "too_long" else "rejected_404"
            return
        ticket.token = _Live(record, spec)
        if isinstance(action, Fit):
            placed = ticket.placed
            # what the gateway's exact count and compression give, from the true length
            result = self.compression.fit(
                ticket.info.category,
                spec.prompt_tokens,
                action.target,
                placed.placement.may_compress,
            )
            compressed = result.fits and result.changed
            action = core.on(ticket, Fitted(result), now)
            if compressed and placed.compressed is not None:
                record.compressed_to = placed.compressed[1]
        self.act(action)

    def act(self, action: Action) -> None:
        """Carry out one of the core's actions (for the request it names)."""
        if isinstance(action, Proceed):  # PROCEED, the one instance
            return
        ticket = action.ticket
        assert ticket is not None
        live = _live(ticket)
        if live.deadline is not None:  # it was waiting: whatever comes now ends that
            self.kernel.cancel(live.deadline)
            live.deadline = None
            self._waiting -= 1
        if isinstance(action, Send):
            self._submit(action, live)
        elif isinstance(action, SendPair):
            self._prefill(action, live)
        elif isinstance(action, SendDecode):
            self._transfer(ticket, live, action.worker)
        elif isinstance(action, Wait):
            self._waiting += 1
            live.deadline = self.kernel.at(action.deadline, PRIO_TIMER, self._expire, ticket)
        elif isinstance(action, Refuse):
            if ticket.admission not in (None, "admitted"):  # refused at admission
                record = live.record
                record.refusal, record.refusal_reason = ticket.admission, action.reason
                self._end(ticket, "rejected_429")
                self._retry(live.spec, action.retry_after or 0.0)
            else:
                self._end(ticket, _REFUSED.get(action.code, f"rejected_{action.status}"))
        elif isinstance(action, Fail):
            self._end(ticket, "error")
        elif isinstance(action, Evict):
            self._evicted(ticket, live)
        else:
            raise TypeError(f"the simulator cannot carry out {action!r}")

    def _retry(self, spec: RequestSpec, retry_after: float) -> None:
        """The client sends the refused request again after Retry-After (capped), as a new
        attempt with its own record, until it has made `max_attempts` attempts."""
        policy = self.retries.get(spec.client)
        if policy is None or spec.attempt >= policy.max_attempts:
            return
        now = self.kernel.now()
        again = dataclasses.replace(
            spec,
            id=f"{spec.id.split('~')[0]}~{spec.attempt + 1}",
            arrival=now + min(max(retry_after, 0.0), policy.max_wait_s),
            attempt=spec.attempt + 1,
            first_arrival=spec.arrival if spec.first_arrival is None else spec.first_arrival,
        )
        self._retrying += 1
        self.kernel.at(again.arrival, PRIO_ARRIVAL, self._retried, again)

    def _retried(self, spec: RequestSpec) -> None:
        self._retrying -= 1
        self.arrive(spec)

    def _end(self, ticket: Ticket, status: str) -> None:
        """A placed request that never reached an engine, or failed on it."""
        live = _live(ticket)
        live.record.status = status
        self._live.pop(live.spec.id, None)
        self.core.on(ticket, Finished(Outcome(Status.ERROR)), self.kernel.now())

    def _evicted(self, ticket: Ticket, live: _Live) -> None:
        """A protected request was admitted in its place: aborted on its engine (or out of
        the wait queue already), settled with what it used, recorded as evicted."""
        now = self.kernel.now()
        record, spec = live.record, live.spec
        record.refusal = "preempted"
        record.refusal_reason = "evicted for a protected service class"
        self.evictions += 1
        if self._live.pop(spec.id, None) is None:  # still waiting for room
            self._end(ticket, "evicted")
            return
        assert record.worker is not None  # set when it was sent, before it went live
        done = self.cluster.workers[record.worker].abort(spec.id)
        record.status = "evicted"
        record.finish = now
        if done is not None:
            record.completion_tokens = done.completion_tokens
        outcome = Outcome(
            Status.ERROR,
            prompt_tokens=done.prompt_tokens if done is not None else 0,
            completion_tokens=done.completion_tokens if done is not None else 0,
            latency=now - record.arrival,
        )
        self.core.on(ticket, Finished(outcome), now)

    def _expire(self, ticket: Ticket) -> None:
        live = _live(ticket)
        live.deadline = None
        self._waiting -= 1
        self.act(self.core.on(ticket, DEADLINE, self.kernel.now()))

    def _submit(self, send: Send, live: _Live) -> None:
        now = self.kernel.now()
        ticket = send.ticket
        record, spec = live.record, live.spec
        worker = self.cluster.workers[send.worker]
        record.pool, record.worker, record.dispatch = worker.pool, worker.id, now
        sent = self.core.prompt_sent(ticket)
        request = EngineRequest(
            id=spec.id,
            prompt_tokens=sent,
            max_tokens=spec.max_tokens,
            output_tokens=spec.output_tokens,
            block_hashes=spec.prefix_hashes,
            dp_rank=send.rank,  # a dp_group's rank (the one engine's rank selector)
        )
        if worker.refuses:  # the connection dropped before any answer
            self.act(self.core.on(ticket, UpstreamFailed("reset", retryable=True), now))
            return
        self._order += 1
        try:
            worker.submit(request, self._order)
        except ValueError:
            # the engine refuses it; too long for its context: the core's safety net may
            # place it again on a longer pool, as the gateway's does on an engine's 400
            if sent + spec.max_tokens > worker.config.max_model_len:
                # the context its pool is configured with, as the gateway knows a worker's
                action = self.core.on(ticket, ContextRefused(self._context[worker.pool]), now)
                if action is not PROCEED:
                    self.act(action)
                    return
            self._end(ticket, "error")
            return
        self._live[spec.id] = ticket
        if self.predictor is not None:
            p = self.predictor.pending(spec.id)
            if p is not None:
                record.features = p.features
                record.predicted = p.q

    # -- a `pd` pool's pair ---------------------------------------------------------------
    def _prefill(self, send: SendPair, live: _Live) -> None:
        """The prefill part: the prompt and one output token on the prefill worker."""
        now = self.kernel.now()
        ticket = send.ticket
        record, spec = live.record, live.spec
        worker = self.cluster.workers[send.prefill]
        record.pool, record.worker, record.dispatch = worker.pool, send.decode, now
        if worker.refuses:  # the connection dropped before any answer
            event = UpstreamFailed("reset", retryable=True, side="prefill")
            self.act(self.core.on(ticket, event, now))
            return
        request = EngineRequest(
            id=spec.id + "#prefill",
            prompt_tokens=self.core.prompt_sent(ticket),
            max_tokens=1,
            output_tokens=1,
            block_hashes=spec.prefix_hashes,
        )
        self._order += 1
        try:
            worker.submit(request, self._order)
        except ValueError:
            self._end(ticket, "error")
            return
        self._prefills[request.id] = ticket

    def _prefilled(self, done: FinishedRequest) -> None:
        """A prefill ended: the hand-off, then the KV's transfer to its decode worker."""
        ticket = self._prefills.pop(done.id)
        if ticket.completed:
            return
        now = self.kernel.now()
        action = self.core.on(ticket, HANDED_OFF, now)
        leg = ticket.pd
        if leg is None:
            return
        live = _live(ticket)
        if isinstance(action, SendDecode) or (action is PROCEED and leg.concurrent):
            self._transfer(ticket, live, leg.decode)

    def _transfer(self, ticket: Ticket, live: _Live, decode: str) -> None:
        now = self.kernel.now()
        worker = self.cluster.workers[decode]
        blocks = -(-self.core.prompt_sent(ticket) // worker.config.block_size)
        delay = blocks * self.transfer_s_per_block.get(worker.pool, 0.0)
        self.handoffs[live.spec.id] = (now, now + delay)
        self._waiting += 1  # in transfer: keeps the run alive
        self.kernel.at(now + delay, PRIO_TIMER, self._decode, (ticket, decode))

    def _decode(self, arg: tuple[Ticket, str]) -> None:
        """The KV arrived: the decode part on the decode worker, its prompt computed."""
        ticket, decode = arg
        self._waiting -= 1
        if ticket.completed:
            return
        now = self.kernel.now()
        live = _live(ticket)
        spec = live.spec
        worker = self.cluster.workers[decode]
        sent = self.core.prompt_sent(ticket)
        if worker.refuses:
            event = UpstreamFailed("reset", retryable=True, side="decode")
            self.act(self.core.on(ticket, event, now))
            return
        request = EngineRequest(
            id=spec.id,
            prompt_tokens=sent,
            max_tokens=spec.max_tokens,
            output_tokens=spec.output_tokens,
            # the prompt's hashes, as the emulator's decode role gets them: the decode engine
            # caches what arrived by prefix (shared blocks; a preempted request's recompute)
            block_hashes=spec.prefix_hashes,
            remote_tokens=sent,
        )
        self._order += 1
        try:
            worker.submit(request, self._order)
        except ValueError:
            self._end(ticket, "error")
            return
        self._live[spec.id] = ticket

    # -- worker callbacks (cluster.Listener) ------------------------------------------
    def first_token(self, worker: Worker, request_id: str) -> None:
        now = self.kernel.now()
        ticket = self._live.get(request_id)
        if ticket is None:
            return  # evicted during the step that gave it its first token
        record = _live(ticket).record
        record.first_token = now
        if record.dispatch is not None:
            record.prefill_s = now - record.dispatch
        self.core.on(ticket, FIRST_TOKEN, now)

    def streamed(self, worker: Worker, tokens: tuple[str, ...]) -> None:
        """A dp_group's step: each request's streamed count, as the gateway reports it."""
        now = self.kernel.now()
        counts = self._streamed
        for rid in tokens:
            ticket = self._live.get(rid)
            if ticket is not None:
                n = counts[rid] = counts.get(rid, 0) + 1
                self.core.on(ticket, Streamed(n), now)

    def finished(self, worker: Worker, done: FinishedRequest) -> None:
        if done.id in self._prefills:
            self._prefilled(done)
            return
        now = self.kernel.now()
        ticket = self._live.pop(done.id, None)
        self._streamed.pop(done.id, None)
        if ticket is None:
            return  # evicted during the step that finished it
        record = _live(ticket).record
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
        if outcome.status is Status.OK:  # the worker answered: its breaker hears it
            self.core.on(ticket, ANSWERED, now)
        # the slot goes back first (the core's Finished): a request waiting for this
        # worker's pool is woken and dispatched at this same instant, as the gateway does
        self.core.on(ticket, Finished(outcome), now)

    def in_flight(self) -> int:
        return len(self._live)

    def active(self) -> bool:
        """Anything left to happen: arrivals to come or requests in flight."""
        return (
            self.arrivals_left > 0
            or bool(self._live)
            or bool(self._prefills)
            or self._waiting > 0
            or self._retrying > 0
        )
