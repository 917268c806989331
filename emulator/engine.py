"""The engine model: one continuous-batching LLM server, stepped on an injected clock.

Two drivers share it: `emulator/server.py` steps it in (scaled) real time behind a
vLLM/SGLang HTTP face, and `simulator/` steps it in virtual time for fleets of thousands
of workers.

Model (FleetOpt §3.1, Eq. 3–4, 7):
- Continuous batching. Each iteration ("step") runs every scheduled request once and
  lasts t_iter = W + H·n_active seconds (W = 8 ms, H = 0.65 ms/slot), n_active being the
  number of requests in the step's batch.
- Optional compute-bound prefill: with `prefill_token_s` > 0 a step also lasts
  `prefill_token_s` per prompt token it computes, and with `max_num_batched_tokens` the
  step's token budget is shared (decoders one token each first, then prefill chunks in
  admission order), so a long prefill delays the prompts behind it. Both are off by
  default (FleetOpt's model above).
- Chunked prefill: a request in prefill advances by at most `prefill_chunk` (512) prompt
  tokens per step; a decoding request produces one token per step. The first output
  token comes in the step after the last prefill chunk (TTFT = queue + ⌈L_in/512⌉·t_iter +
  t_iter, Eq. 7), so a request occupies a slot for (⌈L_in/512⌉ + L_out) steps (Eq. 4).
- KV cache of `num_kv_blocks` blocks of `block_size` (16) tokens; `max_num_seqs` bounds
  the running batch. A request is admitted (waiting → running, FCFS, head-of-line
  blocking) only when blocks for its prompt are free; blocks for generated tokens are
  taken as it grows. When a running request cannot get a block, the most recently
  admitted running request is preempted (its blocks freed, it goes back to the head of
  the queue and recomputes its prefill — prompt plus the tokens generated so far — as
  vLLM's recompute preemption does). No request is admitted in a step that preempted.
- Prefix caching by full-block hashes: a request brings the chained hashes of its
  prompt's full blocks; the longest cached prefix is reused (those tokens skip prefill
  and count as prefix-cache hits). A prompt block is cached once computed. Freed blocks
  stay cached until evicted (LRU, the tail of a freed request first); a block in use is
  never evicted. As in vLLM, at least one token is always computed: the hit is capped at
  ⌊(n−1)/block_size⌋ blocks, so a fully cached prompt recomputes its last block.
- Remote prefill (a P/D decode server, emulator/pd.py): a request's `remote_tokens` prompt
  tokens arrived as KV from a prefill server. At its first admission they skip prefill
  like a cache hit (not counted as one), but the last prompt token is always computed —
  vLLM's decode recomputes it to sample; a preempted request recomputes all.

Step order (mirrors vLLM's scheduler): grow the running requests' blocks in admission
order, preempting from the newest; admit waiting requests; then run the batch: prefill
chunks advance, decoders emit one token, finished requests free their blocks (so they
are reusable from the next step on).

Times: a step planned at `start` lasts `duration`; tokens, first tokens and finishes of
the step exist at `start + duration`. `FinishedRequest.scheduled` is the start of the
step that first admitted the request.

Counters mirror vLLM's: `prefix_queries_tokens` / `prefix_hits_tokens` count tokens
looked up / found at every admission (including re-admission after a preemption), like
vllm:prefix_cache_queries / hits; `prompt_tokens` is counted when a request produces its
first token (vllm:prompt_tokens_total); `kv_usage` counts blocks held by running
requests only (cached free blocks are free, like vllm:kv_cache_usage_perc).

Deviation from vLLM: eviction takes never-cached free blocks before cached ones (vLLM
keeps one LRU queue of all free blocks), which keeps more prefixes alive; it only
changes hit rates, never correctness.

Failure posture: `submit` raises ValueError for a request that could never run (longer
than `max_model_len`, larger than the whole KV cache, nonsensical counts, duplicate id);
once accepted, every request finishes exactly once (or is aborted), because a request
alone always fits. `step()` with no work returns an empty zero-duration result.

Driving it (both drivers do exactly this):

    engine.submit(EngineRequest(...))         # any time; joins at the next step
    while engine.has_work():
        result = engine.step()                # plans one iteration starting at clock.now()
        <advance / sleep result.duration>     # the step's outputs exist at its end
        <deliver result.tokens and result.finished>

Everything the emulator's /metrics needs is in `EngineStats` and `FinishedRequest`.
Cost: step() is O(batch) with small constants (no per-token objects, no cache scans);
see bench/engine_step.py.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.clock import Clock


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_model_len: int = 8192
    block_size: int = 16  # tokens per KV block (vLLM's default)
    num_kv_blocks: int = 8192  # KV capacity in blocks: 131,072 tokens at the default block size
    max_num_seqs: int = 256  # largest running batch (vLLM's default)
    prefill_chunk: int = 512  # C_chunk: prompt tokens a request prefills per step (Eq. 4)
    w: float = 0.008  # W: seconds per step regardless of batch (Llama-3-70B on A100, FleetOpt §3.1)
    h: float = 0.00065  # H: seconds per step per request in the batch (memory bandwidth)
    enable_prefix_caching: bool = True
    # Compute-bound prefill (off by default: FleetOpt's W + H·n step, which its tables are
    # calibrated on). A real engine's step grows with the prompt tokens it computes, and its
    # scheduler shares one token budget per step among the prefill chunks (vLLM's
    # max_num_batched_tokens), so a long prefill delays the prompts admitted after it —
    # the head-of-line blocking QUARTZ (seed 003) is about.
    prefill_token_s: float = 0.0  # seconds per prompt token computed in a step
    max_num_batched_tokens: int | None = None  # per-step token budget; None: no budget

    def __post_init__(self) -> None:
        for name in ("max_model_len", "block_size", "num_kv_blocks", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1")
        if self.prefill_chunk < 1:
            raise ValueError("EngineConfig.prefill_chunk must be >= 1")
        if self.w < 0 or self.h < 0 or self.w + self.h <= 0:
            raise ValueError("EngineConfig: w and h must be >= 0 and a step must take time")
        if self.prefill_token_s < 0:
            raise ValueError("EngineConfig.prefill_token_s must be >= 0")
        budget = self.max_num_batched_tokens
        if budget is not None and budget < self.max_num_seqs:  # as vLLM refuses it
            raise ValueError("EngineConfig.max_num_batched_tokens must be >= max_num_seqs")


@dataclass(slots=True)
class EngineRequest:
    id: str
    prompt_tokens: int
    max_tokens: int  # tokens it may generate (already clamped by the caller to fit the context)
    output_tokens: int  # tokens it generates before EOS; == max_tokens when ignore_eos
    block_hashes: tuple[int, ...] = ()  # chained hashes of the prompt's full blocks
    arrival: float = 0.0  # set by submit() from the clock
    # Why it ends at output_tokens; None: "stop" if output_tokens < max_tokens else "length".
    # A stop string or stop token matched on the last allowed token is a "stop" (vLLM).
    finish_reason: str | None = None
    # the data-parallel rank it is pinned to (emulator/dp_engine.py); None: the group's
    # own balancer chooses (a single engine ignores it)
    dp_rank: int | None = None
    # prompt tokens whose KV arrived from a remote prefill (a P/D decode server)
    remote_tokens: int = 0
    # the prompt's token ids: only KV events read them (a stored block's tokens)
    token_ids: Sequence[int] = ()


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    id: str
    reason: str  # "stop" (reached output_tokens < max_tokens), "length", or "abort"
    # (or the request's own `finish_reason` when it set one)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache (at first admission)
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
    preempted: tuple[str, ...] = ()  # ids sent back to the waiting queue by this step


@dataclass(slots=True)
class EngineStats:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks in use by running requests, 0–1
    prefix_queries_tokens: int = 0  # counters, monotonic
    prefix_hits_tokens: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0  # counted at a request's first token (vLLM counts computed + cached)
    generation_tokens: int = 0
    finished_by_reason: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    kv_blocks_used: int = 0  # blocks held by running requests (kv_usage·num_kv_blocks)
    kv_blocks_cached: int = 0  # blocks holding a reusable prefix (in use or evictable)


_WAITING = 0
_RUNNING = 1
_DONE = 2


class _Seq:
    """Engine-side state of one request; plain ints so a step touches no per-token objects."""

    __slots__ = (
        "cached_tokens",
        "first_token",
        "gen",
        "hashes",
        "id",
        "max_tokens",
        "order",
        "out",
        "preemptions",
        "private",
        "prompt",
        "registered",
        "req",
        "room",
        "scheduled",
        "shared",
        "state",
        "todo",
    )

    def __init__(self, req: EngineRequest, order: int, hashes: tuple[int, ...]) -> None:
        self.req = req
        self.id = req.id
        self.order = order  # submit order, for StepResult.tokens
        self.prompt = req.prompt_tokens
        self.out = req.output_tokens
        self.max_tokens = req.max_tokens
        self.hashes = hashes
        self.gen = 0  # output tokens produced
        self.todo = 0  # tokens still to prefill in the current run
        self.room = 0  # free token slots in the held blocks beyond prompt + gen
        self.shared: list[int] = []  # hashes of the cached blocks it references
        self.private = 0  # blocks it holds that are in no cache entry
        self.registered = 0  # prompt blocks looked up, hit or registered so far
        self.cached_tokens = -1  # prefix hit at first admission (-1: never admitted)
        self.scheduled: float | None = None
        self.first_token: float | None = None
        self.preemptions = 0
        self.state = _WAITING


class Engine:
    """One continuous-batching engine; see the module docstring for the model."""

    def __init__(self, config: EngineConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self._bs = config.block_size
        self._caching = config.enable_prefix_caching
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []  # admission order: preemption victims come off the end
        self._by_id: dict[str, _Seq] = {}
        self._order = 0
        self._in_order = True  # running list is in submit order (false after a re-admission)
        self._needs: list[_Seq] = []  # decoders out of room after the last step, admission order
        # KV blocks: never-cached free ones are a count; cached ones are hash → refcount,
        # and those with refcount 0 are evictable, least recently freed first.
        self._free = config.num_kv_blocks
        self._cache: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        # KV-cache events (vLLM's --kv-events-config; emulator/kv_events.py drains them):
        # ("stored", request, first block index, hashes) and ("removed", hashes); None: off
        self.kv_events: list[tuple[Any, ...]] | None = None
        # Counters.
        self._queries = 0
        self._hits = 0
        self._preemptions = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._by_reason: dict[str, int] = {}
        self._steps = 0

    # -- public API -------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> None:
        """Queue a request; raises ValueError if it can never fit the context or the KV cache."""
        cfg = self.config
        if request.id in self._by_id:
            raise ValueError(f"request {request.id!r} is already in the engine")
        if request.prompt_tokens < 1:
            raise ValueError("a request needs at least one prompt token")
        if not 1 <= request.output_tokens <= request.max_tokens:
            raise ValueError("need 1 <= output_tokens <= max_tokens")
        if request.finish_reason not in (None, "stop", "length"):
            raise ValueError(
                f"finish_reason must be 'stop' or 'length', not {request.finish_reason!r}"
            )
        if request.prompt_tokens + request.max_tokens > cfg.max_model_len:
            raise ValueError(
                f"prompt_tokens + max_tokens = {request.prompt_tokens + request.max_tokens}"
                f" > max_model_len = {cfg.max_model_len}"
            )
        # Its largest footprint: every token but the last one generated has KV.
        peak = -(-(request.prompt_tokens + request.output_tokens - 1) // self._bs)
        if peak > cfg.num_kv_blocks:
            raise ValueError(
                f"request needs {peak} KV blocks > num_kv_blocks = {cfg.num_kv_blocks}"
            )
        request.arrival = self.clock.now()
        # Hashes past the prompt's full blocks cannot describe it: drop them.
        hashes = request.block_hashes[: request.prompt_tokens // self._bs] if self._caching else ()
        seq = _Seq(request, self._order, hashes)
        self._order += 1
        self._by_id[request.id] = seq
        self._waiting.append(seq)

    def abort(self, request_id: str) -> FinishedRequest | None:
        """Drop a waiting or running request (client gone); None if it is not here."""
        seq = self._by_id.get(request_id)
        if seq is None:
            return None
        if seq.state == _RUNNING:
            self._running.remove(seq)
            self._release(seq)
        else:
            self._waiting.remove(seq)
        return self._finish(seq, "abort", self.clock.now())

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    def step(self) -> StepResult:
        """Plan and account one iteration that starts at clock.now().

        With no work it returns an empty result of zero duration (no step is counted).
        """
        now = self.clock.now()
        running = self._running
        if not running and not self._waiting:
            return StepResult(now, 0.0, 0, 0, (), ())
        needs = self._needs
        preempted = self._grow_blocks(needs) if needs else []
        if not preempted:
            self._admit(now)
        # -- run the batch -------------------------------------------------------------
        n = len(running)
        config = self.config
        chunk = config.prefill_chunk
        budget = config.max_num_batched_tokens
        if budget is not None:  # decoders take one token each first, as vLLM schedules
            budget -= sum(1 for s in running if not s.todo)
        prefill_tokens = 0
        tokens: list[str] = []
        emit = tokens.append
        firsts: list[_Seq] = []
        done: list[_Seq] = []
        self._needs = needs = []
        for s in running:
            todo = s.todo
            if todo:  # a prefill chunk, in admission order within the step's budget
                c = chunk if todo > chunk else todo
                if budget is not None:
                    c = c if c < budget else (budget if budget > 0 else 0)
                    budget -= c
                s.todo = todo - c
                prefill_tokens += c
                if s.registered < len(s.hashes):
                    self._register(s)
            else:
                g = s.gen + 1
                s.gen = g
                room = s.room - 1
                s.room = room
                emit(s.id)
                if g == 1:
                    firsts.append(s)
                if g == s.out:
                    done.append(s)
                elif room < 0:
                    needs.append(s)
        duration = config.w + config.h * n + config.prefill_token_s * prefill_tokens
        end = now + duration
        for s in firsts:
            s.first_token = end
            self._prompt_tokens += s.prompt
        self._generation_tokens += len(tokens)
        if not self._in_order:
            by_id = self._by_id
            tokens.sort(key=lambda rid: by_id[rid].order)
        finished: tuple[FinishedRequest, ...] = ()
        if done:
            for s in done:
                self._release(s)
            finished = tuple([self._finish(s, _reason(s), end) for s in done])
            self._running = [s for s in running if s.state == _RUNNING]
            if not self._running:
                self._in_order = True
        self._steps += 1
        return StepResult(
            now,
            duration,
            n,
            prefill_tokens,
            tuple(tokens),
            finished,
            tuple([s.id for s in preempted]) if preempted else (),
        )

    @property
    def num_running(self) -> int:
        """`stats.running` without building a snapshot (cheap telemetry for the simulator)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def context_tokens(self) -> int:
        """Σ over running requests of (prompt + generated): the KV a decode step reads
        (a data-parallel group's per-rank load, emulator/dp_engine.py)."""
        return sum(s.prompt + s.gen for s in self._running)

    @property
    def kv_usage(self) -> float:
        """`stats.kv_usage` without building a snapshot."""
        used = self.config.num_kv_blocks - self._free - len(self._evictable)
        return used / self.config.num_kv_blocks

    @property
    def stats(self) -> EngineStats:
        used = self.config.num_kv_blocks - self._free - len(self._evictable)
        return EngineStats(
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage=used / self.config.num_kv_blocks,
            prefix_queries_tokens=self._queries,
            prefix_hits_tokens=self._hits,
            preemptions=self._preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            finished_by_reason=dict(self._by_reason),
            steps=self._steps,
            kv_blocks_used=used,
            kv_blocks_cached=len(self._cache),
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the block accounting is inconsistent (tests, debugging).

        O(running · blocks + cache): not for the hot path.
        """
        cfg = self.config
        refs: dict[int, int] = {}
        private = 0
        for s in self._running:
            assert s.state == _RUNNING
            private += s.private
            for h in s.shared:
                refs[h] = refs.get(h, 0) + 1
            held = (len(s.shared) + s.private) * self._bs
            assert s.private >= 0 and s.room >= -1  # -1: needs a block before its next token
            assert held == s.prompt + s.gen + s.room, "blocks held != tokens + room"
        for s in self._waiting:
            assert s.state == _WAITING and not s.shared and not s.private
        assert len(self._running) <= cfg.max_num_seqs
        assert self._free >= 0
        assert self._free + len(self._cache) + private == cfg.num_kv_blocks, "blocks leaked"
        for h, ref in self._cache.items():
            assert ref == refs.get(h, 0), "refcount mismatch"
            assert (ref == 0) == (h in self._evictable), "evictable set mismatch"
        assert len(self._evictable) <= len(self._cache)

    # -- scheduling -------------------------------------------------------------------

    def _grow_blocks(self, needs: list[_Seq]) -> list[_Seq]:
        """Give each decoder that filled its blocks one more, preempting from the newest.

        `needs` is in admission order (a subsequence of the running list), so this is
        vLLM's walk over the running requests restricted to those that need a block.
        """
        running = self._running
        preempted: list[_Seq] = []
        for s in needs:
            if s.state != _RUNNING:  # preempted just now, or aborted since the last step
                continue
            while not self._take_block():
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is s:
                    break
            else:
                s.private += 1
                s.room += self._bs
        return preempted

    def _admit(self, now: float) -> None:
        """Admit waiting requests FCFS while a batch slot and their prompt's blocks are free."""
        waiting = self._waiting
        running = self._running
        max_seqs = self.config.max_num_seqs
        bs = self._bs
        cache = self._cache
        while waiting and len(running) < max_seqs:
            s = waiting[0]
            tokens = s.prompt + s.gen  # a preempted request recomputes what it generated
            blocks = -(-tokens // bs)
            hit = 0
            hit_free = 0  # hit blocks now evictable: taking them shrinks the free pool
            if self._caching:
                for h in s.hashes[: (tokens - 1) // bs]:
                    ref = cache.get(h)
                    if ref is None:
                        break
                    hit += 1
                    if not ref:
                        hit_free += 1
            if blocks - hit > self._free + len(self._evictable) - hit_free:
                return  # head-of-line blocking, as vLLM's FCFS
            waiting.popleft()
            shared = list(s.hashes[:hit])
            for h in shared:
                if not cache[h]:
                    del self._evictable[h]
                cache[h] += 1
            self._take_blocks(blocks - hit)
            s.shared = shared
            s.private = blocks - hit
            s.registered = hit
            s.todo = tokens - hit * bs
            remote = s.req.remote_tokens
            if remote and s.cached_tokens < 0:  # the KV came with it, once: not after preemption
                s.todo = min(s.todo, max(1, tokens - remote))
            s.room = blocks * bs - tokens
            if self._caching:
                self._queries += tokens
                self._hits += hit * bs
            if s.cached_tokens < 0:
                s.cached_tokens = hit * bs
                s.scheduled = now
            if running and running[-1].order > s.order:
                self._in_order = False
            s.state = _RUNNING
            running.append(s)

    def _preempt(self, s: _Seq) -> None:
        self._release(s)
        s.state = _WAITING
        s.todo = 0
        s.preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(s)

    # -- KV blocks --------------------------------------------------------------------

    def _take_block(self) -> bool:
        """Take one free block, evicting the least recently freed cached one if needed."""
        if self._free:
            self._free -= 1
            return True
        if self._evictable:
            h, _ = self._evictable.popitem(last=False)
            del self._cache[h]
            if self.kv_events is not None:
                self.kv_events.append(("removed", (h,)))
            return True
        return False

    def _take_blocks(self, k: int) -> None:
        """Take k blocks known to be available: never-cached ones first, then evict LRU."""
        plain = min(k, self._free)
        self._free -= plain
        evictable = self._evictable
        cache = self._cache
        events = self.kv_events
        for _ in range(k - plain):
            h, _ = evictable.popitem(last=False)
            del cache[h]
            if events is not None:
                events.append(("removed", (h,)))

    def _register(self, s: _Seq) -> None:
        """Cache the prompt blocks this request has finished computing."""
        computed = (s.prompt + s.gen - s.todo) // self._bs
        stop = min(computed, len(s.hashes))
        cache = self._cache
        events = self.kv_events
        if events is not None:
            self._register_told(s, stop, events)
            return
        for h in s.hashes[s.registered : stop]:
            if h not in cache:  # else another request computed it too: ours stays private
                cache[h] = 1
                s.private -= 1
                s.shared.append(h)
        s.registered = max(stop, s.registered)

    def _register_told(self, s: _Seq, stop: int, events: list[tuple[Any, ...]]) -> None:
        """`_register`, telling each run of newly cached blocks as a "stored" event."""
        cache = self._cache
        run: list[int] = []
        first = s.registered
        for i in range(s.registered, stop):
            h = s.hashes[i]
            if h not in cache:
                cache[h] = 1
                s.private -= 1
                s.shared.append(h)
                if not run:
                    first = i
                run.append(h)
            elif run:
                events.append(("stored", s.req, first, tuple(run)))
                run = []
        if run:
            events.append(("stored", s.req, first, tuple(run)))
        s.registered = max(stop, s.registered)

    def _release(self, s: _Seq) -> None:
        """Free a request's blocks; cached ones become evictable, its tail first."""
        cache = self._cache
        evictable = self._evictable
        for h in reversed(s.shared):
            ref = cache[h] - 1
            cache[h] = ref
            if not ref:
                evictable[h] = None
        s.shared = []
        self._free += s.private
        s.private = 0
        s.room = 0

    def _finish(self, s: _Seq, reason: str, t: float) -> FinishedRequest:
        s.state = _DONE
        del self._by_id[s.id]
        self._by_reason[reason] = self._by_reason.get(reason, 0) + 1
        return FinishedRequest(
            id=s.id,
            reason=reason,
            prompt_tokens=s.prompt,
            completion_tokens=s.gen,
            cached_tokens=max(s.cached_tokens, 0),
            arrival=s.req.arrival,
            scheduled=s.scheduled,
            first_token=s.first_token,
            finished=t,
            num_preemptions=s.preemptions,
        )


def _reason(s: _Seq) -> str:
    if s.req.finish_reason is not None:
        return s.req.finish_reason
    return "stop" if s.out < s.max_tokens else "length"
