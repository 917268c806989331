"""The plain values that cross the boundary between drivers (gateway, simulator, tests)
and policies. Policies read these and return plain values; they never see HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from compressor.category import Category as Category  # re-exported: the policies use it


@dataclass(slots=True)
class RequestInfo:
    """One request as a policy sees it.

    `prompt_tokens` is the gateway's estimate before the engine has counted (the engine's
    count arrives in `Outcome`); `max_tokens` is what the client asked for, or the
    configured default when it asked for nothing.
    """

    id: str
    model: str
    arrival: float
    prompt_tokens: int
    max_tokens: int
    entitlement: str = "default"
    category: Category = Category.CHAT
    stream: bool = False
    prefix_hashes: tuple[int, ...] = ()
    slo_class: str = "standard"
    temperature: float = 1.0  # decoding parameters (QUARTZ's θ_r); 1.0 when not given
    top_p: float = 1.0
    # cache-aware routing (docs/CACHE_ROUTING.md): the session key session_affinity hashes
    # (a header or the request's `user` field; "" when none), and a per-request override
    # of kv_cost's softmax temperature τ and overlap weight ω (None: the router's own)
    session: str = ""
    router_temperature: float | None = None
    overlap_weight: float | None = None

    # what the engine runs for it (token-pool admission charges it): `prompts` of a batched
    # completion, each answered with `choices` sequences (n, or best_of when larger);
    # `prompt_tokens` and `max_tokens` are per prompt and per sequence
    prompts: int = 1
    choices: int = 1

    @property
    def sequences(self) -> int:
        """The sequences the engine runs at once for this request."""
        return self.prompts * self.choices

    @property
    def total_tokens(self) -> int:
        """L_total = L_in + L_out, the figure pool placement is decided on."""
        return self.prompt_tokens + self.max_tokens


@dataclass(slots=True)
class WorkerView:
    """A worker as routing sees it: engine telemetry merged with the gateway's own counts.

    `running`/`waiting`/`kv_usage`/`prefix_hit_rate` come from the last scrape of the
    engine's /metrics and include traffic from other gateway replicas; `in_flight` and
    `outstanding_tokens` are this gateway's exact counts, updated on every dispatch and
    completion. `stale` means the last good scrape is older than the staleness bound:
    policies treat a stale worker as saturated.
    """

    id: str
    pool: str
    max_model_len: int
    healthy: bool = True
    stale: bool = False
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_hit_rate: float = 0.0
    in_flight: int = 0
    outstanding_tokens: int = 0
    capacity: int | None = None  # requests it takes at once (max_num_seqs); None: unbounded
    # outstanding tokens (Σ L_total of this gateway's requests on it) below which it takes
    # another: its KV cache in tokens × `dispatch.kv_overcommit`; None: not considered
    token_capacity: int | None = None
    # prompt tokens this gateway sent it that have no first token yet (the prefill
    # backlog, `policies.leases.PrefillWork`), and the bound below which it takes another
    # (`dispatch.prefill_room`, policies/dispatch.py); None: not considered
    prefill_tokens: int = 0
    prefill_capacity: int | None = None
    # cache-aware routing (docs/CACHE_ROUTING.md): the engine's KV block size in tokens
    # (vllm:cache_config_info's block_size) and its active decode blocks when a driver
    # knows them; None: the router's own configuration / accounting decides
    block_size: int | None = None
    active_blocks: int | None = None
    # a `pd` pool's worker (policies/pd/): which side of its pairs it serves, "prefill" or
    # "decode"; None in any other pool
    role: str | None = None

    @property
    def has_room(self) -> bool:
        if self.capacity is not None and self.in_flight >= self.capacity:
            return False
        if self.prefill_capacity is not None and self.prefill_tokens >= self.prefill_capacity:
            return False
        # `<`, not `+ request <=`: an empty worker takes even a request larger than it
        return self.token_capacity is None or self.outstanding_tokens < self.token_capacity

    @property
    def load(self) -> int:
        """Requests on the worker: the engine's count, or ours if the scrape lags behind."""
        return max(self.running + self.waiting, self.in_flight)


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A pool as placement sees it: its name, the context it serves, its models."""

    name: str
    max_model_len: int
    models: frozenset[str] = field(default_factory=frozenset)


class Status(StrEnum):
    OK = "ok"
    ERROR = "error"
    DISCONNECT = "disconnect"


@dataclass(slots=True)
class Outcome:
    """What happened to a dispatched request, reported on every exit path (a value: not
    frozen only because a frozen dataclass costs a setattr call per field to build)."""

    status: Status
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: float | None = None
    prefill_time: float | None = None
    latency: float | None = None
