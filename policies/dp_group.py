"""A `dp_group` pool: G data-parallel ranks of one engine, fed from a holding pool.

The ranks of a DP group (DP attention with expert parallelism) step in lockstep, so a step
lasts as long as the most loaded rank; the gateway chooses each request's rank. A request
for such a pool does not go through per-request routing: after admission it waits in the
group's holding pool, and the group's assignment policy (policies/assign/) decides which
pooled requests fill which free slots — on every arrival and every completion (a slot
only frees at a completion, so deciding on these events is deciding on every step, up to
the notification delay). The core (policies/core.py) turns each decision into
`Send(worker, rank=g)`; both drivers carry it out (the gateway: the rank's endpoint, or
the engine's per-request rank selector; the simulator: the lockstep engine's rank).

What the group keeps is the assignment policy's view, exactly: per rank the in-flight
requests with their prompt tokens and the tokens generated so far (the drivers report
the streamed count, `events.Streamed`), so L_g = Σ (prompt + generated); and the pool,
oldest first. At a request's end the engine's usage replaces the streamed count
(`Streamed(exact=True)`) and teaches the group its decode rate (tokens a second of one
running request: the ranks step in lockstep); a request answered whole, which streams
nothing, is counted at that rate times its time on the rank (at most its max_tokens)
while it runs, not at its prompt alone. A request holds a `Pooled` lease while it waits and a `Seat` lease while it
runs on a rank; `Finished` (or an eviction, a timeout, a client gone) releases them, and
a seat given back asks the policy again.

Pure: no I/O, no clock (the core passes `now`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.assign import Assigner, PooledRequest, RankState, Resident, make_assigner
from policies.leases import Releasing


@dataclass(frozen=True, slots=True)
class DpGroupSpec:
    """A dp_group pool as configuration gives it (gateway: `pools.<name>.dp_group`)."""

    ranks: int  # G
    slots: int  # B: requests a rank runs at once (the engine's max_num_seqs)
    assigner: str = "fcfs_maxfree"
    params: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 30.0  # longest a request waits in the holding pool (then 503)
    max_pooled: int = 4096  # beyond this a new request is refused at once (429)

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.slots < 1:
            raise ValueError("a dp_group needs ranks >= 1 and slots >= 1")
        if self.timeout_s <= 0 or self.max_pooled < 1:
            raise ValueError("a dp_group needs timeout_s > 0 and max_pooled >= 1")


@dataclass(slots=True)
class _Running:
    prompt_tokens: int
    max_tokens: int | None
    since: float = 0.0  # when it was given its rank
    whole: bool = False  # answered whole (not streamed): no progress is seen until it ends
    generated: int = 0
    reported: bool = False  # a driver reported progress (then `generated` is observed)

    def generated_at(self, now: float, rate: float | None) -> int:
        """Tokens generated so far: the reported count, or for a whole answer nothing
        reports, the group's decode rate times its time on the rank (≤ max_tokens)."""
        if self.reported or not self.whole or rate is None:
            return self.generated
        guess = int(rate * max(0.0, now - self.since))
        return guess if self.max_tokens is None else min(guess, self.max_tokens)


@dataclass(slots=True)
class Assignment:
    """One decision's pair: the request (the driver's object given to `hold`) and its rank."""

    token: object
    rank: int
    waited: float  # seconds in the holding pool


class Pooled(Releasing):
    """A request's place in the holding pool, until it is assigned or leaves."""

    __slots__ = ("group", "key", "released")

    def __init__(self, group: DpGroup, key: str) -> None:
        self.group = group
        self.key = key
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.group.drop(self.key)


class Seat(Releasing):
    """A request's slot on a rank, from its assignment until it ends; giving it back
    calls `on_free` (the core asks the policy again)."""

    __slots__ = ("group", "key", "on_free", "rank", "released")

    def __init__(
        self, group: DpGroup, key: str, rank: int, on_free: Callable[[DpGroup], object]
    ) -> None:
        self.group = group
        self.key = key
        self.rank = rank
        self.on_free = on_free
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.group.leave(self.key, self.rank)
            self.on_free(self.group)


class DpGroup:
    """One dp_group pool's state: the holding pool, the ranks' residents, the policy."""

    def __init__(self, pool: str, spec: DpGroupSpec, assigner: Assigner | None = None) -> None:
        self.pool = pool
        self.spec = spec
        self.assigner = assigner or make_assigner(spec.assigner, dict(spec.params))
        self.running: list[dict[str, _Running]] = [{} for _ in range(spec.ranks)]
        # insertion order is arrival order: the policies take the pool oldest first
        self.pooled: dict[str, tuple[PooledRequest, object]] = {}
        self.decisions = 0
        self.assigned = [0] * spec.ranks  # requests each rank was given (a counter)
        self.whole: set[str] = set()  # pooled requests that will be answered whole
        # decode tokens per second of one running request (lockstep: every running request
        # makes one token a step), learnt from the engine's usage at each completion
        self.rate: float | None = None
        self.now = 0.0  # the latest time the group was told (metrics read loads then)

    # --- what the drivers observed, through the core ---------------------------------
    def hold(self, request: PooledRequest, token: object, whole: bool = False) -> bool:
        """Into the pool; False when it is full (the request is refused). `whole`: it will
        be answered whole, so no progress is seen until it ends (its load is estimated)."""
        if len(self.pooled) >= self.spec.max_pooled:
            return False
        self.pooled[request.id] = (request, token)
        if whole:
            self.whole.add(request.id)
        return True

    def drop(self, key: str) -> bool:
        """Out of the pool without a rank (timed out, evicted, its client gone)."""
        self.whole.discard(key)
        return self.pooled.pop(key, None) is not None

    def progress(self, key: str, rank: int, generated: int, prompt_tokens: int | None) -> None:
        """Tokens generated so far (the streamed count), and the engine's exact prompt
        count when it reported one: the rank's load follows."""
        r = self.running[rank].get(key)
        if r is not None:
            r.reported = True
            if generated > r.generated:
                r.generated = generated
            if prompt_tokens:
                r.prompt_tokens = prompt_tokens

    def reconcile(
        self, key: str, rank: int, completion_tokens: int, prompt_tokens: int | None, now: float
    ) -> None:
        """The engine's usage at the end of a request: its exact counts replace what was
        streamed or estimated (an SSE event is not a token: a role-only first event, a
        usage event, several tokens in one chunk), and its tokens over its time on the
        rank teach the group's decode rate, which estimates whole answers still running."""
        r = self.running[rank].get(key)
        if r is None:
            return
        r.reported = True
        r.generated = max(0, completion_tokens)
        if prompt_tokens:
            r.prompt_tokens = prompt_tokens
        self.now = max(self.now, now)
        took = now - r.since
        if completion_tokens > 1 and took > 0:
            seen = completion_tokens / took
            self.rate = seen if self.rate is None else 0.8 * self.rate + 0.2 * seen

    def leave(self, key: str, rank: int) -> None:
        self.running[rank].pop(key, None)

    # --- the decision ------------------------------------------------------------------
    def ranks(self, now: float | None = None) -> list[RankState]:
        B = self.spec.slots
        at = self.now if now is None else now
        return [
            RankState(
                str(g),
                B,
                tuple(
                    Resident(k, r.prompt_tokens, r.generated_at(at, self.rate), r.max_tokens)
                    for k, r in running.items()
                ),
            )
            for g, running in enumerate(self.running)
        ]

    def free(self) -> int:
        B = self.spec.slots
        return sum(max(0, B - len(r)) for r in self.running)

    def decide(self, now: float) -> list[Assignment]:
        """Ask the policy which pooled requests go where now; they leave the pool and
        become residents of their ranks. Nothing to decide (no pool, no free slot): []."""
        if not self.pooled or self.free() == 0:
            return []
        self.decisions += 1
        self.now = max(self.now, now)
        pool = [p for p, _ in self.pooled.values()]
        out: list[Assignment] = []
        for p, rank in self.assigner.assign(pool, self.ranks(now), now):
            g = int(rank.id)
            _, token = self.pooled.pop(p.id)
            whole = p.id in self.whole
            self.whole.discard(p.id)
            self.running[g][p.id] = _Running(p.prompt_tokens, p.max_tokens, now, whole)
            self.assigned[g] += 1
            out.append(Assignment(token, g, max(0.0, now - p.arrival)))
        return out

    # --- what metrics read ---------------------------------------------------------------
    def loads(self, now: float | None = None) -> list[int]:
        """L_g = Σ over rank g's in-flight requests of (prompt + generated so far), at
        `now` (default: the latest time the group was told)."""
        at = self.now if now is None else now
        return [
            sum(r.prompt_tokens + r.generated_at(at, self.rate) for r in rs.values())
            for rs in self.running
        ]

    def counts(self) -> list[int]:
        return [len(r) for r in self.running]

    def imbalance(self) -> int:
        """Imb = G·max_g L_g − Σ_g L_g (the paper's eq. 2), now."""
        loads = self.loads()
        return len(loads) * max(loads) - sum(loads)
