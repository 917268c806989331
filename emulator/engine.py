"""The engine model: one continuous-batching LLM server, stepped on an injected clock.

STUB — the interface is fixed; the implementation is being written. Two drivers share it:
`emulator/server.py` steps it in (scaled) real time behind a vLLM/SGLang HTTP face, and
`simulator/` steps it in virtual time for fleets of thousands of workers.

Model (FleetOpt §3.1, Eq. 3–4, 7):
- Continuous batching. Each iteration ("step") runs every scheduled request once and
  lasts t_iter = W + H·n_active seconds (W = 8 ms, H = 0.65 ms/slot), n_active being the
  number of requests in the step's batch.
- Chunked prefill: a request in prefill advances by at most `prefill_chunk` (512) prompt
  tokens per step; a decoding request produces one token per step. The first output
  token comes in the step after the last prefill chunk (TTFT = queue + ⌈L_in/512⌉·t_iter +
  t_iter, Eq. 7), so a request occupies a slot for (⌈L_in/512⌉ + L_out) steps (Eq. 4).
- KV cache of `num_kv_blocks` blocks of `block_size` (16) tokens; `max_num_seqs` bounds
  the running batch. A request is admitted (waiting → running) only when blocks for its
  prompt are free; blocks for generated tokens are taken as it grows. When a running
  request cannot get a block, the most recently admitted running request is preempted
  (its blocks freed, it goes back to the head of the queue and recomputes its prefill).
- Prefix caching by full-block hashes: a request brings the chained hashes of its
  prompt's full blocks; the longest cached prefix is reused (those tokens skip prefill
  and count as prefix-cache hits). Freed blocks stay cached until evicted (LRU).

Driving it (both drivers do exactly this):

    engine.submit(EngineRequest(...))         # any time; joins at the next step
    while engine.has_work():
        result = engine.step()                # plans one iteration starting at clock.now()
        <advance / sleep result.duration>     # the step's outputs exist at its end
        <deliver result.tokens and result.finished>

Everything the emulator's /metrics needs is in `EngineStats` and `FinishedRequest`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.clock import Clock


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_model_len: int = 8192
    block_size: int = 16  # tokens per KV block (vLLM's default)
    num_kv_blocks: int = 8192  # KV capacity in blocks: 131,072 tokens at the default block size
    max_num_seqs: int = 256  # largest running batch (vLLM's default)
    prefill_chunk: int = (
        512  # C_chunk: prompt tokens one request prefills per step (FleetOpt Eq. 4)
    )
    w: float = 0.008  # W: seconds per step regardless of batch (Llama-3-70B on A100, FleetOpt §3.1)
    h: float = 0.00065  # H: seconds per step per request in the batch (memory bandwidth)
    enable_prefix_caching: bool = True


@dataclass(slots=True)
class EngineRequest:
    id: str
    prompt_tokens: int
    max_tokens: int  # tokens it may generate (already clamped by the caller to fit the context)
    output_tokens: int  # tokens it generates before EOS; == max_tokens when ignore_eos
    block_hashes: tuple[int, ...] = ()  # chained hashes of the prompt's full blocks
    arrival: float = 0.0  # set by submit() from the clock


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    id: str
    reason: str  # "stop" (reached output_tokens < max_tokens), "length", or "abort"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache
    arrival: float
    scheduled: float | None  # first admitted to the running batch
    first_token: float | None
    finished: float
    num_preemptions: int


@dataclass(frozen=True, slots=True)
class StepResult:
    start: float
    duration: float
    batch_size: int  # n_active of this step
    prefill_tokens: int  # prompt tokens computed this step (excluding cache hits)
    tokens: tuple[str, ...]  # ids that produced one output token this step (in submit order)
    finished: tuple[FinishedRequest, ...]


@dataclass(slots=True)
class EngineStats:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use by running requests, 0–1
    prefix_queries_tokens: int = 0  # counters, monotonic
    prefix_hits_tokens: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0  # prompt tokens of finished requests (vLLM counts computed + cached)
    generation_tokens: int = 0
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    steps: int = 0


class Engine:
    def __init__(self, config: EngineConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock

    def submit(self, request: EngineRequest) -> None:
        """Queue a request; raises ValueError if it can never fit the context or the KV cache."""
        raise NotImplementedError

    def abort(self, request_id: str) -> FinishedRequest | None:
        """Drop a waiting or running request (client gone); None if it is not here."""
        raise NotImplementedError

    def has_work(self) -> bool:
        raise NotImplementedError

    def step(self) -> StepResult:
        """Plan and account one iteration that starts at clock.now()."""
        raise NotImplementedError

    @property
    def stats(self) -> EngineStats:
        raise NotImplementedError
