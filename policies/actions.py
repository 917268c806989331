"""What the core (policies/core.py) tells a driver to do for one request: plain values.

    Fit(target)           count the prompt exactly and compress it to `target` tokens,
                          then report `Fitted`
    Admit                 ask the shared admission store (one round trip), then report
                          `Admitted` (an admitter without a store is asked by the core)
    Send(worker, slot)    forward the request to `worker`; its slot is taken already;
                          `rank`: the data-parallel rank a dp_group pool assigned (the
                          rank's own endpoint, or the engine's per-request rank selector)
    SendPair(p, d)        a `pd` pool: forward to prefill worker `p` (vLLM: its prefill call
                          alone; SGLang: the prefill and the decode call at once, decode
                          worker `d`); both slots are taken already
    SendDecode(d)         vLLM's `pd` pool, after `HANDED_OFF`: the decode call to `d`, with
                          the prefill's `kv_transfer_params`
    Wait(waiter)          hold the request until the core gives it another action (a
                          wake, through `Core.on_action`) or `waiter.deadline` (`DEADLINE`)
    Refuse(status, code)  answer the client with this refusal (no engine was asked, or no
                          retry is left); `retry_after` seconds, where one helps
    Fail                  give the client the upstream failure the driver observed
    Evict                 cancel this request for a protected class (through `on_action`)
    PROCEED               nothing to decide: carry on (relay the answer as it comes)

The driver's side of each is I/O: a thread for `Fit`, a socket for `Send`, a timer for
`Wait`; the simulator's is its kernel and engine model. What the core decided along the
way (a retry on another worker, a re-placement on longer pools) is in the action log
(`ActionLog`, when one is attached) but needs nothing more of the driver than `Send`.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.dispatch import Waiter
from policies.leases import Load, WorkerSlot
from policies.ticket import Ticket
from policies.types import RequestInfo


@dataclass(slots=True, eq=False)
class Fit:
    ticket: Ticket
    target: int


@dataclass(slots=True, eq=False)
class Admit:
    ticket: Ticket


@dataclass(slots=True, eq=False)
class Send:
    ticket: Ticket
    worker: str
    pool: str
    load: Load  # the driver's object the slot counts on (gateway: its WorkerState)
    slot: WorkerSlot
    spilled: bool = False  # not the placement's first pool
    attempt: int = 0  # 0 the first; 1 a retry on another worker or a re-placement
    rank: int | None = None  # a dp_group pool's rank for it (None: not a dp_group)


@dataclass(slots=True, eq=False)
class SendPair:
    ticket: Ticket
    pool: str
    protocol: str  # "vllm" | "sglang" (policies/pd/pool.py)
    prefill: str  # the prefill worker
    decode: str  # the decode worker
    prefill_load: Load  # the driver's objects the two slots count on
    decode_load: Load
    attempt: int = 0  # 0 the first; 1 a retry of the whole pair


@dataclass(slots=True, eq=False)
class SendDecode:
    ticket: Ticket
    worker: str  # the decode worker of the ticket's pair (its slot is held already)
    load: Load


@dataclass(slots=True, eq=False)
class Wait:
    ticket: Ticket
    waiter: Waiter

    @property
    def deadline(self) -> float:
        return self.waiter.deadline


@dataclass(slots=True, eq=False)
class Refuse:
    ticket: Ticket | None  # None: refused at placement (policies never heard of it)
    status: int  # 400/404/413 placement, 403/429 admission, 429 queue full, 503 no room
    code: str  # no_model, too_long, queue_full, queue_timeout, no_healthy_worker, …
    reason: str = ""
    retry_after: float | None = None
    param: str | None = None  # the request field at fault (OpenAI's `param`)
    limit: int = 0  # too_long: the largest context that serves the model
    info: RequestInfo | None = None  # refused at placement: the request as estimated


@dataclass(slots=True, eq=False)
class Fail:
    ticket: Ticket


@dataclass(slots=True, eq=False)
class Evict:
    ticket: Ticket


class Proceed:
    __slots__ = ()


PROCEED = Proceed()

Action = Fit | Admit | Send | SendPair | SendDecode | Wait | Refuse | Fail | Evict | Proceed


class ActionLog:
    """A recorder of what the core decided, one line per decision: (request id, what,
    detail). Attached as `Core.log` (None, the default, costs one attribute test)."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[str, str, str]] = []

    def __call__(self, rid: str, what: str, detail: str = "") -> None:
        self.entries.append((rid, what, detail))

    def of(self, rid: str) -> list[str]:
        return [f"{w} {d}".rstrip() for r, w, d in self.entries if r == rid]
