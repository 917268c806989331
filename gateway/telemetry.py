"""Worker telemetry: scrape each engine's /metrics and keep the last good snapshot.

Reads the names both engines expose (../shared/docs/WIRE_SPEC.md §6–7):

| field | vLLM (≥0.10) | vLLM legacy fallback | SGLang (`sglang:` or `sglang_`) |
|---|---|---|---|
| running | vllm:num_requests_running | | num_running_reqs |
| waiting | vllm:num_requests_waiting | | num_queue_reqs |
| kv_usage | vllm:kv_cache_usage_perc | vllm:gpu_cache_usage_perc | token_usage |
| prefix hit rate | Δ prefix_cache_hits_total / Δ prefix_cache_queries_total | gpu_prefix_cache_* | cache_hit_rate |

Several series of one name (data-parallel ranks, the `engine` label) are summed for
counts and averaged for fractions. Failure posture: a failed scrape keeps the previous
snapshot but not its freshness; once the last good scrape is older than
`telemetry.stale_after_s` the worker is stale and routing treats it as saturated
(`fleetgate_worker_telemetry_stale` = 1, `fleetgate_telemetry_scrape_errors_total` counts why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx

from gateway.periodic import PerWorkerLoops
from gateway.workers import Telemetry, WorkerState

log = logging.getLogger("fleetgate.telemetry")

_SUM = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang_num_running_reqs": "running",
    "sglang_num_queue_reqs": "waiting",
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:gpu_prefix_cache_queries_total": "queries_legacy",
    "vllm:gpu_prefix_cache_hits_total": "hits_legacy",
}
_MEAN = {
    "vllm:kv_cache_usage_perc": "kv",
    "vllm:gpu_cache_usage_perc": "kv_legacy",
    "sglang:token_usage": "kv",
    "sglang_token_usage": "kv",
    "sglang:cache_hit_rate": "hit_rate",
    "sglang_cache_hit_rate": "hit_rate",
}


def parse_metrics(text: str) -> dict[str, float]:
    """The fields above from Prometheus text exposition (0.0.4 or OpenMetrics)."""
    sums: dict[str, float] = {}
    means: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            close = line.rfind("}")
            rest = line[close + 1 :].split()
        else:
            name = line[:space] if space != -1 else line
            rest = line[space + 1 :].split() if space != -1 else []
        key = _SUM.get(name)
        mean_key = _MEAN.get(name) if key is None else None
        if (key is None and mean_key is None) or not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if key is not None:
            sums[key] = sums.get(key, 0.0) + value
        elif mean_key is not None:
            means.setdefault(mean_key, []).append(value)
    out = dict(sums)
    for k, vs in means.items():
        out[k] = sum(vs) / len(vs)
    return out


def apply(t: Telemetry, fields: dict[str, float], now: float) -> None:
    t.running = int(fields.get("running", 0))
    t.waiting = int(fields.get("waiting", 0))
    t.kv_usage = fields.get("kv", fields.get("kv_legacy", 0.0))
    if "hit_rate" in fields:
        t.prefix_hit_rate = fields["hit_rate"]
    else:
        q = fields.get("queries", fields.get("queries_legacy"))
        h = fields.get("hits", fields.get("hits_legacy"))
        if q is not None and h is not None:
            if t.prefix_queries is not None and t.prefix_hits is not None and q > t.prefix_queries:
                t.prefix_hit_rate = max(0.0, min(1.0, (h - t.prefix_hits) / (q - t.prefix_queries)))
            t.prefix_queries, t.prefix_hits = q, h
    t.scraped_at = now


class Scraper:
    """One loop per worker, jittered so that a fleet is not scraped in lockstep."""

    def __init__(
        self,
        workers: list[WorkerState],
        client: httpx.AsyncClient,
        interval: float,
        now: Callable[[], float],
        on_error: Callable[[WorkerState, str], None],
    ) -> None:
        self.workers = workers
        self.client = client
        self.interval = interval
        self.now = now
        self.on_error = on_error
        self._loops = PerWorkerLoops(workers, interval, self.scrape)

    def start(self) -> None:
        self._loops.start()

    async def scrape(self, worker: WorkerState) -> bool:
        try:
            r = await self.client.get(worker.url + "/metrics")
            if r.status_code != 200:
                self.on_error(worker, f"http_{r.status_code}")
                return False
            apply(worker.telemetry, parse_metrics(r.text), self.now())
            return True
        except httpx.TimeoutException:
            self.on_error(worker, "timeout")
        except httpx.HTTPError:
            self.on_error(worker, "connect")
        return False

    async def stop(self) -> None:
        await self._loops.stop()
