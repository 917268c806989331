"""SGLang 0.5.23's /metrics (WIRE_SPEC §6), as served with --enable-metrics.

Scheduler series carry `engine_type="unified"`, `model_name`, `moe_ep_rank`, `pp_rank`,
`tp_rank` and exist from start-up; tokenizer series carry `model_name`,
`engine_type` (+ `is_streaming` on request counters and latency histograms) and appear
with the first request, as SGLang's lazily labelled children do. No `_created` series
(multiprocess registry). `token_usage` = KV blocks in use / total; `cache_hit_rate` =
prefix-cache hits / queries so far; `gen_throughput` = generated tokens per second over
the last 5 engine seconds; `utilization` = running / max running requests. SGLang's own
/health generations load the engine but are not counted as requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from emulator.engine import EngineConfig, EngineStats, FinishedRequest, StepResult
from emulator.metrics import Exposition, Labels, RequestTag, Throughput, _Family

QUEUE = [0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50,
         60, 70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600,
         1800, 2000, 2500, 3000]  # fmt: skip
TTFT = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E = [*TTFT, 600, 1200, 1800, 2400]
ITL = [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08,
       0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8]  # fmt: skip
TOKENS = [100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000,
          10000, 12000, 15000, 20000, 22000, 25000, 30000, 35000, 40000, 66000, 99000, 132000,
          300000, 600000, 900000, 1100000]  # fmt: skip


class SglangMetrics:
    def __init__(self, model_name: str, config: EngineConfig) -> None:
        self.config = config
        self.sched: Labels = (
            ("engine_type", "unified"),
            ("model_name", model_name),
            ("moe_ep_rank", "0"),
            ("pp_rank", "0"),
            ("tp_rank", "0"),
        )
        self.tok: Labels = (("engine_type", "unified"), ("model_name", model_name))
        self.throughput = Throughput()
        self._gen_total = 0

        def F(name: str, doc: str, kind: str, buckets: Sequence[float] = ()) -> _Family:
            return _Family(name, doc, kind, buckets, created=False)

        self.running = F("sglang:num_running_reqs", "The number of running requests.", "gauge")
        self.queue_reqs = F(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", "gauge"
        )
        self.grammar = F(
            "sglang:num_grammar_queue_reqs",
            "The number of requests in the grammar waiting queue.",
            "gauge",
        )
        self.used = F("sglang:num_used_tokens", "The number of used tokens.", "gauge")
        self.usage = F("sglang:token_usage", "The token usage.", "gauge")
        self.hit_rate = F("sglang:cache_hit_rate", "The prefix cache hit rate.", "gauge")
        self.gen_tp = F("sglang:gen_throughput", "The generation throughput (token/s).", "gauge")
        self.util = F("sglang:utilization", "The utilization.", "gauge")
        self.retracted = F(
            "sglang:num_retracted_reqs", "The number of retracted requests.", "gauge"
        )
        self.decode_lens = F(
            "sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode.", "gauge"
        )
        self.retracted_total = F(
            "sglang:num_retracted_requests", "Total number of retracted requests.", "counter"
        )
        self.queue_time = F(
            "sglang:queue_time_seconds",
            "Histogram of queueing time in seconds.",
            "histogram",
            QUEUE,
        )
        self.prompt = F("sglang:prompt_tokens", "Number of prefill tokens processed.", "counter")
        self.gen = F(
            "sglang:generation_tokens", "Number of generation tokens processed.", "counter"
        )
        self.cached = F("sglang:cached_tokens", "Number of cached prompt tokens.", "counter")
        self.requests = F("sglang:num_requests", "Number of requests processed.", "counter")
        self.so = F(
            "sglang:num_so_requests", "Number of structured output requests processed.", "counter"
        )
        self.aborted = F("sglang:num_aborted_requests", "Number of requests aborted.", "counter")
        self.ttft = F(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            "histogram",
            TTFT,
        )
        self.itl = F(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            "histogram",
            ITL,
        )
        self.tpot = F(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            "histogram",
            ITL,
        )
        self.e2e = F(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            "histogram",
            E2E,
        )
        self.prompt_hist = F(
            "sglang:prompt_tokens_histogram",
            "Histogram of prompt token length.",
            "histogram",
            TOKENS,
        )
        self.uncached_hist = F(
            "sglang:uncached_prompt_tokens_histogram",
            "Histogram of uncached prompt token length.",
            "histogram",
            TOKENS,
        )
        self.gen_hist = F(
            "sglang:generation_tokens_histogram",
            "Histogram of generation token length.",
            "histogram",
            TOKENS,
        )
        for fam in (self.running, self.queue_reqs, self.grammar, self.used, self.usage, self.hit_rate,
                    self.gen_tp, self.util, self.retracted, self.decode_lens, self.retracted_total,
                    self.queue_time):  # fmt: skip
            fam.touch(self.sched)
        self.exposition = Exposition(self._families, single_process=False)

    def _families(self) -> list[_Family]:
        return [
            self.running, self.queue_reqs, self.grammar, self.used, self.usage, self.hit_rate,
            self.gen_tp, self.util, self.retracted, self.decode_lens, self.retracted_total,
            self.queue_time, self.prompt, self.gen, self.cached, self.requests, self.so,
            self.aborted, self.ttft, self.itl, self.tpot, self.e2e, self.prompt_hist,
            self.uncached_hist, self.gen_hist,
        ]  # fmt: skip

    def _req(self, tag: RequestTag) -> Labels:
        return (*self.tok, ("is_streaming", "true" if tag.streaming else "false"))

    # -- driver hooks -------------------------------------------------------------------

    def on_step(self, result: StepResult) -> None:
        self._gen_total += len(result.tokens)
        self.throughput.add(result.start + result.duration, self._gen_total)

    def on_first_token(self, ttft: float, tag: object) -> None:
        assert isinstance(tag, RequestTag)
        if not tag.internal:
            self.ttft.observe(self._req(tag), ttft)

    def on_token_gaps(self, gaps: list[tuple[float, object]]) -> None:
        for gap, tag in gaps:
            assert isinstance(tag, RequestTag)
            if not tag.internal:
                self.itl.observe(self._req(tag), gap)

    def on_finished(self, fin: FinishedRequest, tag: object) -> None:
        assert isinstance(tag, RequestTag)
        if tag.internal:
            return
        lab = self._req(tag)
        if fin.scheduled is not None:
            self.queue_time.observe(self.sched, fin.scheduled - fin.arrival)
        if fin.reason == "abort":
            self.aborted.inc(self.tok)
        self.prompt.inc(lab, fin.prompt_tokens)
        self.gen.inc(lab, fin.completion_tokens)
        self.requests.inc(lab)
        if fin.cached_tokens:
            for src in ("device", "total"):
                self.cached.inc((*self.tok, ("cache_source", src)), fin.cached_tokens)
        self.e2e.observe(lab, fin.finished - fin.arrival)
        if fin.first_token is not None and fin.completion_tokens > 1:
            self.tpot.observe(lab, (fin.finished - fin.first_token) / (fin.completion_tokens - 1))
        self.prompt_hist.observe(self.tok, fin.prompt_tokens)
        self.uncached_hist.observe(self.tok, fin.prompt_tokens - fin.cached_tokens)
        self.gen_hist.observe(self.tok, fin.completion_tokens)

    def on_http(
        self, handler: str, method: str, status: int, req_size: int, resp_size: int, duration: float
    ) -> None:
        return None

    # -- scrape -------------------------------------------------------------------------

    def render(
        self,
        stats: EngineStats,
        accept: str,
        now: float,
        ranks: list[EngineStats] | None = None,
    ) -> tuple[bytes, str]:
        """With data parallelism (`ranks`: one snapshot per DP rank) the scheduler's
        gauges are per rank, labelled `dp_rank` as SGLang's schedulers label theirs."""
        cfg = self.config
        self.gen_tp.set(self.sched, self.throughput.rate(now))
        per_rank = (
            [(self.sched, stats)]
            if ranks is None
            else [((*self.sched, ("dp_rank", str(g))), s) for g, s in enumerate(ranks)]
        )
        if ranks is not None:  # per rank only, as SGLang's DP schedulers each export theirs
            for fam in (self.running, self.queue_reqs, self.used, self.usage, self.hit_rate,
                        self.util, self.retracted_total):  # fmt: skip
                fam.series.pop(self.sched, None)
        for lab, s in per_rank:
            self.running.set(lab, s.running)
            self.queue_reqs.set(lab, s.waiting)
            self.used.set(lab, s.kv_blocks_used * cfg.block_size)
            self.usage.set(lab, s.kv_usage)
            q = s.prefix_queries_tokens
            self.hit_rate.set(lab, s.prefix_hits_tokens / q if q else 0.0)
            self.util.set(lab, s.running / cfg.max_num_seqs)
            self.retracted_total.set(lab, s.preemptions)
        return self.exposition.render(accept)
