"""vLLM 0.33's /metrics (WIRE_SPEC §6): `vllm:` engine series, http_* series, process/gc.

Labels: `model_name` (first served name) and `engine="0"`; every labelled series vLLM
creates at start-up exists from the first scrape (zero-valued), as in vLLM. Buckets are
vLLM's defaults (`vllm/v1/metrics/buckets.py`). Per finished request: e2e, queue
(scheduled − arrival), prefill (first token − scheduled), decode (finish − first
token), inference (finish − scheduled), TPOT = decode / (tokens − 1), token counts,
max_tokens and n params, preemptions; TTFT at the first token; ITL per token gap;
`iteration_tokens_total` per step (prefill + decode tokens).
"""

from __future__ import annotations

from emulator.engine import EngineConfig, EngineStats, FinishedRequest, StepResult
from emulator.metrics import Exposition, Labels, RequestTag, _Family, build_1_2_5

TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
       20.0, 40.0, 80.0]  # fmt: skip
LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
ITERATION = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
HIGHR = [0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5,
         7.5, 10, 30, 60]  # fmt: skip
REASONS = ("stop", "length", "abort", "error", "repetition")
HTTP_EXCLUDED = frozenset({"/metrics", "/health", "/ping", "/version", "/load", "/server_info"})


class VllmMetrics:
    def __init__(
        self, model_name: str, config: EngineConfig, gpu_memory_utilization: float = 0.9
    ) -> None:
        self.config = config
        lab: Labels = (("engine", "0"), ("model_name", model_name))
        self.labels = lab
        L = config.max_model_len
        F = _Family
        self.running = F(
            "vllm:num_requests_running", "Number of requests in model execution batches.", "gauge"
        )
        self.waiting = F(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", "gauge"
        )
        self.waiting_by = F(
            "vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.", "gauge"
        )
        self.kv = F(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "gauge"
        )
        self.sleep = F(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            "gauge",
        )
        self.pq = F(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            "counter",
        )
        self.ph = F(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            "counter",
        )
        self.epq = F(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
            "counter",
        )
        self.eph = F(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
            "counter",
        )
        self.mmq = F(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
            "counter",
        )
        self.mmh = F(
            "vllm:mm_cache_hits",
            "Multi-modal cache hits, in terms of number of cached items.",
            "counter",
        )
        self.preempt = F(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", "counter"
        )
        self.prompt = F("vllm:prompt_tokens", "Number of prefill tokens processed.", "counter")
        self.prompt_src = F(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", "counter"
        )
        self.prompt_cached = F(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            "counter",
        )
        self.gen = F("vllm:generation_tokens", "Number of generation tokens processed.", "counter")
        self.success = F(
            "vllm:request_success", "Count of successfully processed requests.", "counter"
        )
        self.ttft = F(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            "histogram",
            TTFT,
        )
        self.itl = F(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            "histogram",
            ITL,
        )
        self.tpot = F(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            "histogram",
            ITL,
        )
        self.e2e = F(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            "histogram",
            LATENCY,
        )
        self.queue = F(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            "histogram",
            LATENCY,
        )
        self.inference = F(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            "histogram",
            LATENCY,
        )
        self.prefill = F(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            "histogram",
            LATENCY,
        )
        self.decode = F(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            "histogram",
            LATENCY,
        )
        tok = build_1_2_5(L)
        self.req_prompt = F(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", "histogram", tok
        )
        self.req_gen = F(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            "histogram",
            tok,
        )
        self.iteration = F(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            "histogram",
            ITERATION,
        )
        self.max_gen = F(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            "histogram",
            tok,
        )
        self.param_n = F(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            "histogram",
            [1, 2, 5, 10, 20],
        )
        self.param_max = F(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            "histogram",
            tok,
        )
        self.kv_computed = F(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            "histogram",
            tok,
        )
        self.req_preempt = F(
            "vllm:request_num_preemptions",
            "Histogram of number of preemptions per request.",
            "histogram",
            [1, 2, 3, 4, 5, 10, 20],
        )
        self.cache_info = F(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge"
        )
        self.http_requests = F(
            "http_requests", "Total number of requests by method, status and handler.", "counter"
        )
        self.http_req_size = F(
            "http_request_size_bytes",
            "Content length of incoming requests by handler. Only value of header is respected. Otherwise ignored. No percentile calculated. ",
            "summary",
        )
        self.http_resp_size = F(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler. Only value of header is respected. Otherwise ignored. No percentile calculated. ",
            "summary",
        )
        self.http_highr = F(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
            "histogram",
            HIGHR,
        )
        self.http_duration = F(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
            "histogram",
            [0.1, 0.5, 1],
        )

        for fam in self._engine_families():
            if fam not in (
                self.waiting_by,
                self.sleep,
                self.prompt_src,
                self.success,
                self.cache_info,
                self.prompt_cached,
            ):
                fam.touch(lab)
        for reason in ("capacity", "deferred"):
            self.waiting_by.touch((*lab, ("reason", reason)))
        for state, v in (("awake", 1.0), ("weights_offloaded", 0.0), ("discard_all", 0.0)):
            self.sleep.set((*lab, ("sleep_state", state)), v)
        for src in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.prompt_src.touch((*lab, ("source", src)))
        self.prompt_cached.touch(lab)
        for reason in REASONS:
            self.success.touch((*lab, ("finished_reason", reason)))
        self.cache_info.set(_cache_config_labels(config, gpu_memory_utilization), 1.0)
        self.http_highr.touch(())
        self.exposition = Exposition(self._families, single_process=True)

    def _engine_families(self) -> list[_Family]:
        return [
            self.running, self.waiting, self.waiting_by, self.kv, self.sleep, self.pq, self.ph,
            self.epq, self.eph, self.mmq, self.mmh, self.preempt, self.prompt, self.prompt_src,
            self.prompt_cached, self.gen, self.success, self.ttft, self.itl, self.tpot, self.e2e,
            self.queue, self.inference, self.prefill, self.decode, self.req_prompt, self.req_gen,
            self.iteration, self.max_gen, self.param_n, self.param_max, self.kv_computed,
            self.req_preempt, self.cache_info,
        ]  # fmt: skip

    def _families(self) -> list[_Family]:
        return [
            *self._engine_families(),
            self.http_requests, self.http_req_size, self.http_resp_size, self.http_highr,
            self.http_duration,
        ]  # fmt: skip

    # -- driver hooks -------------------------------------------------------------------

    def on_step(self, result: StepResult) -> None:
        self.iteration.observe(self.labels, result.prefill_tokens + len(result.tokens))

    def on_first_token(self, ttft: float, tag: object) -> None:
        self.ttft.observe(self.labels, ttft)

    def on_token_gaps(self, gaps: list[tuple[float, object]]) -> None:
        obs = self.itl.observe
        lab = self.labels
        for gap, _ in gaps:
            obs(lab, gap)

    def on_finished(self, fin: FinishedRequest, tag: object) -> None:
        assert isinstance(tag, RequestTag)
        lab = self.labels
        self.success.inc((*lab, ("finished_reason", fin.reason)))
        self.e2e.observe(lab, fin.finished - fin.arrival)
        if fin.scheduled is not None:
            self.queue.observe(lab, fin.scheduled - fin.arrival)
            self.inference.observe(lab, fin.finished - fin.scheduled)
            if fin.first_token is not None:
                self.prefill.observe(lab, fin.first_token - fin.scheduled)
        if fin.first_token is not None:
            decode = fin.finished - fin.first_token
            self.decode.observe(lab, decode)
            if fin.completion_tokens > 1:
                self.tpot.observe(lab, decode / (fin.completion_tokens - 1))
        self.req_prompt.observe(lab, fin.prompt_tokens)
        self.req_gen.observe(lab, fin.completion_tokens)
        self.max_gen.observe(lab, tag.max_tokens)
        self.param_max.observe(lab, tag.max_tokens)
        self.param_n.observe(lab, tag.n)
        self.kv_computed.observe(lab, fin.prompt_tokens - fin.cached_tokens)
        if fin.num_preemptions:
            self.req_preempt.observe(lab, fin.num_preemptions)
        if fin.first_token is not None:
            src = self.prompt_src.series
            cached = fin.cached_tokens
            src[(*lab, ("source", "local_cache_hit"))].value += cached
            src[(*lab, ("source", "local_compute"))].value += fin.prompt_tokens - cached
            self.prompt_cached.inc(lab, cached)

    def on_http(
        self, handler: str, method: str, status: int, req_size: int, resp_size: int, duration: float
    ) -> None:
        if handler in HTTP_EXCLUDED:
            return
        self.http_requests.inc(
            (("handler", handler), ("method", method), ("status", f"{status // 100}xx"))
        )
        self.http_req_size.observe((("handler", handler),), req_size)
        self.http_resp_size.observe((("handler", handler),), resp_size)
        self.http_highr.observe((), duration)
        self.http_duration.observe((("handler", handler), ("method", method)), duration)

    # -- scrape -------------------------------------------------------------------------

    def render(
        self,
        stats: EngineStats,
        accept: str,
        now: float,
        ranks: list[EngineStats] | None = None,
    ) -> tuple[bytes, str]:
        """With data parallelism (`ranks`: one snapshot per DP rank) the engine series are
        per engine core, `engine="<rank>"`, as vLLM's DP deployments export them."""
        for g, s in enumerate(ranks or (stats,)):
            lab: Labels = (("engine", str(g)), self.labels[1])
            self.running.set(lab, s.running)
            self.waiting.set(lab, s.waiting)
            self.waiting_by.set((*lab, ("reason", "capacity")), s.waiting)
            self.kv.set(lab, s.kv_usage)
            self.pq.set(lab, s.prefix_queries_tokens)
            self.ph.set(lab, s.prefix_hits_tokens)
            self.preempt.set(lab, s.preemptions)
            self.prompt.set(lab, s.prompt_tokens)
            self.gen.set(lab, s.generation_tokens)
        return self.exposition.render(accept)


def _cache_config_labels(cfg: EngineConfig, util: float) -> tuple[tuple[str, str], ...]:
    fields = {
        "block_size": str(cfg.block_size),
        "cache_dtype": "auto",
        "calculate_kv_scales": "False",
        "cpu_kvcache_space_bytes": "None",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "engine": "0",
        "gpu_memory_utilization": str(util),
        "is_attention_free": "False",
        "kv_cache_memory_bytes": "None",
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(cfg.num_kv_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "swap_space": "4",
    }
    return tuple(sorted(fields.items()))
