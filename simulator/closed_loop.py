"""Closed-loop load: N clients, each sending its next request only when its previous one is
answered (plus an optional think time). One definition, two drivers: the simulator
(`simulate`, in virtual time) and live runs (`drive`, in wall time; bench/quartz_live.py
--clients) both drive the same sans-I/O `ClosedLoop`, so client c's k-th request is the same
request in both, whatever the policy under test does to the timing.

- sequences: `deal` splits a workload's drawn requests into per-client sequences: clients
  by group (default: the SLO class, i.e. by application — chat clients send chat requests,
  RAG clients RAG ones, in proportion to the workload's mix), each group's requests dealt
  round-robin in draw order to its clients; a client's identity is its `client` field,
  which the gateway's entitlement (and so QUARTZ's fairness term) sees.
- ramp: client i starts at i/N × `ramp_s` (0: all at once);
- hold: no client starts a request after `ramp_s + hold_s`, nor once `requests` have been
  sent in all; a client whose sequence is used up stops;
- think time: exponential with mean `think_s` (0: the next request goes out at the answer),
  drawn from the client's own seeded stream, the k-th draw for its k-th answer, so it does
  not depend on the order answers come back in;
- bursts (Mixed Bursty): synchronised think-time drops — an answer that arrives inside a
  burst window ([j·every, j·every + duration)) gets its think time divided by `factor`;
- a spike (the Price-of-Anarchy paper's C = 32 → 128 → 32): the last `Spike.clients` of
  the N clients are extra — each starts at `at_s` (spread linearly over `ramp_s`) and sends
  nothing at or after `until_s`; the others follow the ramp and hold above.

An answer is any end of a request: completed, refused (413/429/503), timed out, failed.
In the simulator `on_complete` (policies/hooks.py) fires for every placed request; a
request refused before placement (no pool holds it) never reaches the hooks, so the
source checks, after handing a request to the gateway, whether it was placed, and if not
treats it as answered at once.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from policies.types import Outcome, RequestInfo
from simulator.kernel import PRIO_ARRIVAL, Kernel
from simulator.workloads import RequestSpec

if TYPE_CHECKING:
    from simulator.driver import Driver
    from simulator.run import RunResult
    from simulator.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Bursts:
    """Synchronised think-time drops: think time ÷ `factor` for answers inside a burst."""

    every_s: float = 20.0
    duration_s: float = 2.0
    factor: float = 4.0

    def __post_init__(self) -> None:
        if self.every_s <= 0 or not 0 < self.duration_s <= self.every_s or self.factor < 1:
            raise ValueError("bursts: every_s > 0, 0 < duration_s <= every_s, factor >= 1")

    def active(self, t: float) -> bool:
        return (t % self.every_s) < self.duration_s


@dataclass(frozen=True, slots=True)
class Spike:
    """Extra clients between `at_s` and `until_s` (module docstring)."""

    clients: int
    at_s: float
    until_s: float
    ramp_s: float = 0.0

    def __post_init__(self) -> None:
        if self.clients < 1 or not 0 <= self.at_s < self.until_s or self.ramp_s < 0:
            raise ValueError("spike: clients >= 1, 0 <= at_s < until_s, ramp_s >= 0")


@dataclass(frozen=True, slots=True)
class LoadShape:
    """How N closed-loop clients send (module docstring)."""

    clients: int
    think_s: float = 0.0
    ramp_s: float = 0.0
    hold_s: float = math.inf
    requests: int | None = None  # total requests sent across clients (None: no cap)
    bursts: Bursts | None = None
    seed: int = 0
    spike: Spike | None = None  # the last spike.clients of `clients` are the spike's

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError("closed loop: clients >= 1")
        if self.spike is not None and self.spike.clients >= self.clients:
            raise ValueError("closed loop: spike.clients < clients (the base clients)")
        if self.think_s < 0 or self.ramp_s < 0 or self.hold_s <= 0:
            raise ValueError("closed loop: think_s >= 0, ramp_s >= 0, hold_s > 0")
        if self.requests is not None and self.requests < 1:
            raise ValueError("closed loop: requests >= 1")


def deal(
    specs: Sequence[RequestSpec],
    clients: int,
    group: Callable[[RequestSpec], str] = lambda s: s.slo_class,
    names: dict[str, str] | None = None,
) -> list[list[RequestSpec]]:
    """Per-client sequences from a workload's draw (module docstring). Each group gets
    clients in proportion to its share of `specs` (largest remainder, at least one per
    group when there are enough clients); client ids are `{name}-{k:02d}`, `name` from
    `names` (default: the group key)."""
    groups: dict[str, list[RequestSpec]] = {}
    for s in specs:
        groups.setdefault(group(s), []).append(s)
    keys = sorted(groups)
    if not keys:
        return [[] for _ in range(clients)]
    share = {k: clients * len(groups[k]) / len(specs) for k in keys}
    count = {k: int(share[k]) for k in keys}
    if clients >= len(keys):
        for k in keys:
            count[k] = max(count[k], 1)
    while sum(count.values()) > clients:
        k = max((k for k in keys if count[k] > 1), key=lambda k: count[k] - share[k])
        count[k] -= 1
    for k in sorted(keys, key=lambda k: count[k] - share[k]):
        if sum(count.values()) >= clients:
            break
        count[k] += 1
    out: list[list[RequestSpec]] = []
    for k in keys:
        n = count[k]
        if n == 0:
            continue
        label = (names or {}).get(k, k)
        seqs: list[list[RequestSpec]] = [[] for _ in range(n)]
        for i, s in enumerate(groups[k]):
            seqs[i % n].append(replace(s, client=f"{label}-{i % n:02d}"))
        out += seqs
    return out


class ClosedLoop:
    """The clients' state, sans I/O: a driver asks `starts` when each client begins, `send`
    for a client's next request at a time, and tells `answered` when a request ended; it
    gets back when that client sends again (or None: it stops)."""

    def __init__(self, shape: LoadShape, sequences: Sequence[Sequence[RequestSpec]]) -> None:
        if len(sequences) != shape.clients:
            raise ValueError(f"closed loop: {shape.clients} clients, {len(sequences)} sequences")
        self.shape = shape
        self.sequences = [list(s) for s in sequences]
        self._next = [0] * shape.clients  # index of each client's next request
        self._think = [random.Random(f"{shape.seed}:think:{c}") for c in range(shape.clients)]
        self._client_of: dict[str, int] = {}  # outstanding request id → client
        self._busy = [False] * shape.clients  # a request outstanding
        self._stopped: set[int] = set()  # clients that will not send again
        self.sent = 0
        self.outstanding = 0
        self.max_outstanding = 0
        self.log: list[tuple[str, int, float, str]] = []  # (event, client, t, request id)

    @property
    def stop_at(self) -> float:
        return self.shape.ramp_s + self.shape.hold_s

    def starts(self) -> list[tuple[float, int]]:
        shape = self.shape
        spike = shape.spike
        n = shape.clients if spike is None else shape.clients - spike.clients
        out = [(shape.ramp_s * c / n, c) for c in range(n)]
        if spike is not None:
            k = spike.clients
            out += [(spike.at_s + spike.ramp_s * j / k, n + j) for j in range(k)]
        return out

    def _may_send(self, client: int, t: float) -> bool:
        cap = self.shape.requests
        spike = self.shape.spike
        if (
            spike is not None
            and client >= self.shape.clients - spike.clients
            and t >= spike.until_s
        ):
            return False
        return (
            t < self.stop_at
            and (cap is None or self.sent < cap)
            and self._next[client] < len(self.sequences[client])
        )

    def send(self, client: int, t: float) -> RequestSpec | None:
        """The client's next request, arriving at `t`; None when the client has stopped."""
        if self._busy[client]:
            raise RuntimeError(f"client {client} already has a request outstanding")
        if not self._may_send(client, t):
            self._stopped.add(client)
            return None
        k = self._next[client]
        self._next[client] = k + 1
        spec = replace(self.sequences[client][k], arrival=t)
        self._client_of[spec.id] = client
        self._busy[client] = True
        self.sent += 1
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        self.log.append(("send", client, t, spec.id))
        return spec

    def owns(self, request_id: str) -> bool:
        return request_id in self._client_of

    def answered(self, request_id: str, t: float) -> tuple[float, int] | None:
        """Request `request_id` ended at `t`: (when its client sends next, the client), or
        None when that client will not send again."""
        client = self._client_of.pop(request_id)
        self._busy[client] = False
        self.outstanding -= 1
        self.log.append(("answer", client, t, request_id))
        think = self.shape.think_s
        delay = self._think[client].expovariate(1.0 / think) if think > 0 else 0.0
        b = self.shape.bursts
        if b is not None and b.active(t):
            delay /= b.factor
        nxt = t + delay
        if self._may_send(client, nxt):
            return nxt, client
        self._stopped.add(client)
        return None

    def alive(self) -> int:
        """Clients that may still send (keeps the run's timers going while > 0)."""
        return self.shape.clients - len(self._stopped)


class Source:
    """The simulator's driver of a `ClosedLoop`: a core Hook (it hears every placed request
    end) that schedules its clients' arrivals on the kernel. Give it to `simulator.run.run`
    as both `hooks=(source,)` and `source=source.start`."""

    def __init__(self, loop: ClosedLoop) -> None:
        self.loop = loop
        self.kernel: Kernel | None = None
        self.gateway: Driver | None = None
        self._placed: set[str] = set()
        self._scheduled = 0  # sends scheduled on the kernel, not yet run
        self.specs: list[RequestSpec] = []  # what was sent, in order

    # -- run.py's source callback: the kernel and the gateway, before the kernel runs
    def start(self, kernel: Kernel, gateway: Driver) -> None:
        self.kernel, self.gateway = kernel, gateway
        for t, c in self.loop.starts():
            self._schedule(t, c)
        self._sync()

    def _schedule(self, t: float, client: int) -> None:
        assert self.kernel is not None
        self._scheduled += 1
        self.kernel.at(t, PRIO_ARRIVAL, self._send, client)

    def _sync(self) -> None:
        # the gateway's timers (scrapes, samples) run while a send is scheduled (a client
        # thinking); requests in flight keep them alive through the gateway's own count, so
        # a request that never ended could not keep the run going forever
        assert self.gateway is not None
        self.gateway.arrivals_left = self._scheduled

    def _send(self, client: int) -> None:
        assert self.kernel is not None and self.gateway is not None
        now = self.kernel.now()
        self._scheduled -= 1
        spec = self.loop.send(client, now)
        if spec is None:
            self._sync()
            return
        self.specs.append(spec)
        self.gateway.arrive(spec)
        if spec.id not in self._placed and self.loop.owns(spec.id):
            self._answer(spec.id, now)  # refused before placement: no hook will tell us
        self._placed.discard(spec.id)
        self._sync()

    def _answer(self, request_id: str, now: float) -> None:
        assert self.kernel is not None
        nxt = self.loop.answered(request_id, now)
        if nxt is not None:
            self._schedule(nxt[0], nxt[1])
        self._sync()

    # -- Hook
    def on_arrival(self, request: RequestInfo, now: float) -> None:
        self._placed.add(request.id)

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        pass

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        pass

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        if self.loop.owns(request.id):
            self._answer(request.id, now)


def simulate(
    scenario: Scenario,
    shape: LoadShape,
    sequences: Sequence[Sequence[RequestSpec]],
    seed: int | None = None,
    **run_kwargs: Any,
) -> tuple[RunResult, ClosedLoop]:
    """Run `scenario` under closed-loop load; the result's `specs` are the requests sent."""
    from simulator.run import run

    loop = ClosedLoop(shape, sequences)
    src = Source(loop)
    hooks = (*run_kwargs.pop("hooks", ()), src)
    result = run(scenario, seed=seed, specs=[], hooks=hooks, source=src.start, **run_kwargs)
    result.specs = src.specs
    return result, loop


async def drive(
    loop: ClosedLoop,
    send: Callable[[RequestSpec], Awaitable[Any]],
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> list[tuple[RequestSpec, Any]]:
    """The live driver of a `ClosedLoop`: one task per client; `send(spec)` makes the
    request (e.g. over HTTP: bench/quartz_live.py `drive_closed`) and returns when it is
    answered, whatever the answer (it must not raise). Times are `clock()` seconds since the start.
    Returns (request, what `send` returned) in the order answers came back."""
    t0 = clock()
    answers: list[tuple[RequestSpec, Any]] = []

    async def client(c: int, at: float) -> None:
        while True:
            await sleep(max(0.0, at - (clock() - t0)))
            spec = loop.send(c, clock() - t0)
            if spec is None:
                return
            out = await send(spec)
            answers.append((spec, out))
            nxt = loop.answered(spec.id, clock() - t0)
            if nxt is None:
                return
            at = nxt[0]

    await asyncio.gather(*(client(c, t) for t, c in loop.starts()))
    return answers
