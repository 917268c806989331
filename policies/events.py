"""What a driver tells the core (policies/core.py) about one request: plain values.

A driver starts a request with a `Request` (`Core.start`) and reports what it observed
with `Core.on(ticket, event, now)`; the core answers with an action (policies/actions.py).
Events that carry nothing are singletons (`FIRST_TOKEN`, `WHOLE_ANSWER`, `ANSWERED`,
`DEADLINE`): the hot path allocates no event it does not need.

    Fitted(result)        the exact count / compression the driver ran for a `Fit`
    Admitted(verdict)     the shared store's admission verdict the driver awaited for `Admit`
    FIRST_TOKEN           the first token of a stream came back
    WHOLE_ANSWER          a whole (non-streamed) answer came back: its prompt leaves the
                          prefill backlog, but no first token was seen (no hook hears one:
                          the time to it is the whole answer's, not a prefill)
    ANSWERED              the worker answered well (its circuit breaker hears a success)
    UpstreamFailed(...)   the attempt failed: before any response (a retry may cure it)
                          or after (an error frame ends the stream, or an engine 5xx)
    ContextRefused(len)   the engine refused the prompt as too long for its context
    HANDED_OFF            a `pd` pool's prefill is done and its KV left the prefill worker
                          (vLLM: the prefill call answered with `kv_transfer_params`;
                          SGLang: the prefill call answered): its prefill slot goes back
    DEADLINE              a `Wait`'s deadline passed
    Finished(outcome)     the request is over, whatever the outcome (ok, error, gone)
    Streamed(generated)   tokens generated so far on a data-parallel rank (a dp_group
                          pool's load accounting), with the engine's exact prompt count
                          when it reported one
"""

from __future__ import annotations

from dataclasses import dataclass

from compressor.compress import Compression
from policies.admission import AdmissionRefused, Reservation
from policies.intake import Prompt
from policies.types import Outcome, PoolSpec


@dataclass(slots=True)
class Request:
    """A request as a driver hands it to `Core.start`: everything a hook may read is set
    here, before placement, the same way in both drivers."""

    prompt: Prompt
    id: str
    pools: tuple[PoolSpec, ...] | list[PoolSpec]  # the fleet's pools now
    healthy: frozenset[str] | None = None  # pools with a routable worker (None: all)
    entitlement: str | None = None  # the API key's entitlement (token pools), or none
    slo_class: str | None = None  # its service class; None: RequestInfo's default
    prefix_hashes: tuple[int, ...] = ()
    temperature: float = 1.0  # decoding parameters (QUARTZ's θ_r); 1.0 when not given
    top_p: float = 1.0
    # the prompt's true length when the driver knows it better than the estimate (the
    # simulator's workload): a worker slot counts it instead of the estimate
    known_prompt_tokens: int | None = None
    # cache-aware routing (docs/CACHE_ROUTING.md): the session key and a per-request
    # (τ, ω) override of kv_cost's softmax temperature and overlap weight
    session: str = ""
    router_temperature: float | None = None
    overlap_weight: float | None = None


@dataclass(slots=True)
class Fitted:
    result: Compression
    param: str = "messages"


@dataclass(slots=True)
class Admitted:
    verdict: Reservation | AdmissionRefused | None


class FirstToken:
    __slots__ = ()


class WholeAnswer:
    __slots__ = ()


class Answered:
    __slots__ = ()


@dataclass(slots=True)
class ContextRefused:
    max_model_len: int  # the context of the worker that refused it


class Deadline:
    __slots__ = ()


class HandedOff:
    __slots__ = ()


@dataclass(slots=True)
class UpstreamFailed:
    kind: str  # connect, reset, read_timeout, http_503 …: the driver's name for it
    retryable: bool = False  # nothing reached the engine: another worker may take it
    blames_worker: bool = True  # counts against the worker's circuit breaker
    before_response: bool = True  # no byte of an answer reached the client yet
    # a `pd` pool's attempt: which of its two calls failed ("prefill" or "decode"); ""
    # for an ordinary pool's single call
    side: str = ""


@dataclass(slots=True)
class Finished:
    outcome: Outcome


@dataclass(slots=True)
class Streamed:
    generated: int  # output tokens so far (the streamed count)
    prompt_tokens: int | None = None  # the engine's count, when it reported one
    # the engine's usage at the request's end (completion_tokens): exact, it replaces the
    # streamed count and teaches the group's decode rate (policies/dp_group.py)
    exact: bool = False


FIRST_TOKEN = FirstToken()
WHOLE_ANSWER = WholeAnswer()
ANSWERED = Answered()
DEADLINE = Deadline()
HANDED_OFF = HandedOff()

Event = (
    Fitted
    | Admitted
    | FirstToken
    | WholeAnswer
    | Answered
    | ContextRefused
    | Deadline
    | HandedOff
    | UpstreamFailed
    | Finished
    | Streamed
)
