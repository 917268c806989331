"""fleetgate's Grafana dashboards, built as code with grafana-foundation-sdk (Grafana 11.6 types).

    python -m deploy.grafana.dashboards          # rewrite deploy/grafana/dashboards/*.json
    python deploy/grafana/dashboards.py --check  # exit 1 if a committed file is out of date

Four dashboards, the ones a person opens first:

- `overview.json`   Gateway overview: requests by pool and status, TTFT and end-to-end P50/P99,
                    gateway overhead, tokens, requests / TTFT / tokens by model, in-flight per
                    worker, retries, upstream errors, spills, client disconnects.
- `compress.json`   Compress-and-Route: borderline / compressed / fallen back, tokens removed,
                    compressor latency, learnt bytes per token by category.
- `fleet.json`      Fleet: engine running / waiting, KV usage and prefix-cache hit rate (scraped
                    from the engines: vLLM `vllm:*`, SGLang `sglang:*` or `sglang_*`), the
                    gateway's own view of each worker (telemetry age and staleness, health,
                    circuit breakers).
- `control.json`    Admission, queue and QUARTZ: token pools (admitted, refused by reason,
                    fairness debt, capacity promised / demanded, the Redis breaker), the request
                    queue (length, wait, refusals), data-parallel groups (load per rank,
                    imbalance, estimated barrier idle, holding pool and its wait), QUARTZ
                    (coverage, fallback, observed over predicted prefill, backlog),
                    cache-aware routing (regime, τ, ω, decision time, prefix-cache hit rate,
                    index size) and `kind: pd` pools (hand-offs, prefill and transfer times,
                    the prefill queue, utilisation per role).

Every query reads the `${datasource}` variable (a Prometheus data source) and sums over
gateway replicas, so one dashboard serves one process or N pods. Do not edit the JSON by
hand: change this file and regenerate (tests/unit/deploy/test_grafana.py checks both).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.statetimeline import Panel as StateTimeline
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm

OUT = Path(__file__).resolve().parent / "dashboards"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "[$__rate_interval]"
POOL = 'pool=~"$pool"'
TAGS = ["fleetgate"]

Query = tuple[str, str]  # (PromQL, legend)


# --- panel helpers ---------------------------------------------------------------------------


def _targets(panel: Timeseries | Stat | StateTimeline, queries: Sequence[Query]) -> None:
    for i, (expr, legend) in enumerate(queries):
        panel.with_target(
            Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).range()
        )


def timeseries(
    title: str,
    description: str,
    unit: str,
    *queries: Query,
    width: int = 12,
    stack: bool = False,
    min_zero: bool = True,
) -> Timeseries:
    p = (
        Timeseries()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(8)
        .line_width(1)
        .fill_opacity(10)
        .legend(
            cb.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
    )
    if min_zero:
        p.min(0)
    if stack:
        p.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    _targets(p, queries)
    return p


def stat(
    title: str,
    description: str,
    unit: str,
    query: Query,
    *,
    red_above: float | None = None,
    width: int = 6,
) -> Stat:
    steps = [dm.Threshold(value=None, color="green")]
    if red_above is not None:
        steps.append(dm.Threshold(value=red_above, color="red"))
    p = (
        Stat()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(width)
        .height(4)
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]))
        .thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
    )
    _targets(p, [query])
    return p


def states(
    title: str, description: str, query: Query, good: tuple[str, str], bad: tuple[str, str]
) -> StateTimeline:
    """A 0/1 gauge per worker as a coloured timeline; `good`/`bad` are (value, text)."""
    mapping = dm.ValueMap(
        options={
            good[0]: dm.ValueMappingResult(text=good[1], color="green", index=0),
            bad[0]: dm.ValueMappingResult(text=bad[1], color="red", index=1),
        }
    )
    p = (
        StateTimeline()
        .title(title)
        .description(description)
        .datasource(DS)
        .span(12)
        .height(8)
        .show_value(common.VisibilityMode.NEVER)
        .merge_values(True)
        .mappings([mapping])
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
    )
    _targets(p, [query])
    return p


def sglang(name: str, sel: str = POOL) -> str:
    """An SGLang series selector matching both spellings of its name. SGLang serves its
    /metrics through prometheus_client's content negotiation: in the text format a sample is
    `sglang:<name>`, but when the scraper asks for OpenMetrics (Prometheus does by default)
    prometheus_client ≥ 0.26 escapes the colon and Prometheus stores `sglang_<name>`."""
    return f'{{__name__=~"sglang[:_]{name}", {sel}}}'


def quantiles(metric: str, by: str = "pool", sel: str = POOL) -> list[Query]:
    """P50 and P99 of a histogram, summed over replicas, one series per `by`."""
    labels = f"{by}, le" if by else "le"
    legend = f"{{{{{by}}}}} " if by else ""
    return [
        (
            f"histogram_quantile({q}, sum by ({labels}) (rate({metric}_bucket{{{sel}}}{RATE})))",
            f"{legend}P{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


def datasource_variable() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Data source").type("prometheus")


def pool_variable(metric: str) -> db.QueryVariable:
    return (
        db.QueryVariable("pool")
        .label("Pool")
        .datasource(DS)
        .query(f"label_values({metric}, pool)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        # .* also matches a series without the label (an engine job that sets no `pool`)
        .all_value(".*")
    )


def board(uid: str, title: str, description: str) -> db.Dashboard:
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(TAGS)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .link(
            db.DashboardLink("fleetgate")
            .type(dm.DashboardLinkType.DASHBOARDS)
            .tags(TAGS)
            .as_dropdown(True)
            .include_vars(False)
            .keep_time(True)
        )
        .with_variable(datasource_variable())
    )


# --- the dashboards ------------------------------------------------------------------------


def overview() -> db.Dashboard:
    requests = "fleetgate_requests_total"
    d = board(
        "fleetgate-overview",
        "fleetgate / Gateway overview",
        "What the gateway answered, how fast, and where it sent the work.",
    ).with_variable(pool_variable(requests))
    d.with_row(db.Row("Traffic"))
    d.with_panel(
        stat(
            "Requests / s",
            "Answers per second, every status, all replicas.",
            "reqps",
            (f"sum(rate({requests}{{{POOL}}}{RATE}))", "requests"),
        )
    )
    d.with_panel(
        stat(
            "5xx share",
            "Share of answers with a 5xx status (gateway refusals and relayed engine errors).",
            "percentunit",
            (
                f'(sum(rate({requests}{{{POOL}, status=~"5.."}}{RATE})) or vector(0)) / '
                f"sum(rate({requests}{{{POOL}}}{RATE}))",
                "5xx",
            ),
            red_above=0.01,
        )
    )
    d.with_panel(
        stat(
            "TTFT P99",
            "Time to first token, streaming requests, all pools.",
            "s",
            quantiles("fleetgate_time_to_first_token_seconds", by="")[1],
        )
    )
    d.with_panel(
        stat(
            "In flight",
            "Requests the gateways have in flight on the workers now.",
            "short",
            (f"sum(fleetgate_worker_in_flight{{{POOL}}})", "in flight"),
        )
    )
    d.with_panel(
        timeseries(
            "Requests by pool and status",
            "fleetgate_requests_total: answers per second by the pool that served them and HTTP status.",
            "reqps",
            (f"sum by (pool, status) (rate({requests}{{{POOL}}}{RATE}))", "{{pool}} {{status}}"),
            stack=True,
        )
    )
    d.with_panel(
        timeseries(
            "Tokens / s",
            "Prompt and completion tokens per second, as the engines counted them.",
            "short",
            (
                f"sum by (pool) (rate(fleetgate_prompt_tokens_total{{{POOL}}}{RATE}))",
                "{{pool}} prompt",
            ),
            (
                f"sum by (pool) (rate(fleetgate_completion_tokens_total{{{POOL}}}{RATE}))",
                "{{pool}} completion",
            ),
        )
    )
    d.with_row(db.Row("Latency"))
    d.with_panel(
        timeseries(
            "Time to first token P50 / P99",
            "Arrival at the gateway to the first streamed token (streaming requests).",
            "s",
            *quantiles("fleetgate_time_to_first_token_seconds"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "End-to-end latency P50 / P99",
            "Arrival to the last byte of the answer.",
            "s",
            *quantiles("fleetgate_request_duration_seconds"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Gateway overhead P50 / P99",
            "Gateway time before the request went upstream: parse, estimate, place, route.",
            "s",
            *quantiles("fleetgate_gateway_overhead_seconds"),
            width=8,
        )
    )
    d.with_row(db.Row("Models (the requested model; one not configured counts as other)"))
    d.with_panel(
        timeseries(
            "Requests by model and status",
            "fleetgate_model_requests_total: answers per second by the model the client asked for.",
            "reqps",
            (
                f"sum by (model, status) (rate(fleetgate_model_requests_total{RATE}))",
                "{{model}} {{status}}",
            ),
            stack=True,
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Time to first token P50 / P99 by model",
            "fleetgate_model_time_to_first_token_seconds (streaming requests).",
            "s",
            *quantiles("fleetgate_model_time_to_first_token_seconds", by="model", sel=""),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Tokens / s by model",
            "Prompt and completion tokens per second by requested model (engine counts).",
            "short",
            (
                f"sum by (model) (rate(fleetgate_model_prompt_tokens_total{RATE}))",
                "{{model}} prompt",
            ),
            (
                f"sum by (model) (rate(fleetgate_model_completion_tokens_total{RATE}))",
                "{{model}} completion",
            ),
            width=8,
        )
    )
    d.with_row(db.Row("Workers and upstream"))
    d.with_panel(
        timeseries(
            "In flight per worker",
            "Requests the gateways have in flight on each worker (summed over replicas).",
            "short",
            (
                f"sum by (pool, worker) (fleetgate_worker_in_flight{{{POOL}}})",
                "{{pool}} {{worker}}",
            ),
            stack=True,
        )
    )
    d.with_panel(
        timeseries(
            "Upstream errors by worker and kind",
            "Failed upstream attempts per second: connect, connect_timeout, reset, "
            "first_byte_timeout, idle_timeout, protocol, http_5xx.",
            "reqps",
            (
                f"sum by (pool, worker, kind) (rate(fleetgate_upstream_errors_total{{{POOL}}}{RATE}))",
                "{{worker}} {{kind}}",
            ),
        )
    )
    d.with_panel(
        timeseries(
            "Retries, spills, client disconnects",
            "Retries on another worker after a connect failure; requests spilled to a larger pool "
            "because every worker of the chosen one was down; clients that left before the end.",
            "reqps",
            (
                f"sum by (pool) (rate(fleetgate_upstream_retries_total{{{POOL}}}{RATE}))",
                "{{pool}} retries",
            ),
            (
                f"sum by (pool) (rate(fleetgate_pool_spills_total{{{POOL}}}{RATE}))",
                "{{pool}} spills",
            ),
            (
                f"sum by (pool) (rate(fleetgate_client_disconnects_total{{{POOL}}}{RATE}))",
                "{{pool}} client disconnects",
            ),
            width=24,
        )
    )
    return d


def compress() -> db.Dashboard:
    c = "fleetgate_compress"
    d = board(
        "fleetgate-compress",
        "fleetgate / Compress-and-Route",
        "Borderline requests (B_short < L_total ≤ γ·B_short): compressed onto the short pool or "
        "sent to a larger one; what compression removed and cost; the learnt bytes per token.",
    )
    d.with_row(db.Row("Borderline requests"))
    d.with_panel(
        stat(
            "Borderline share of traffic",
            "Requests in the Compress-and-Route band, as a share of all answers.",
            "percentunit",
            (
                f"sum(rate({c}_borderline_total{RATE})) / sum(rate(fleetgate_requests_total{RATE}))",
                "borderline",
            ),
        )
    )
    d.with_panel(
        stat(
            "Compressed share of borderline",
            "Borderline requests compressed to fit the short pool.",
            "percentunit",
            (
                f"sum(rate({c}_compressed_total{RATE})) / sum(rate({c}_borderline_total{RATE}))",
                "compressed",
            ),
        )
    )
    d.with_panel(
        stat(
            "Fallback share of borderline",
            "Borderline requests that could not be made to fit and went to a larger pool.",
            "percentunit",
            (
                f"sum(rate({c}_fallback_total{RATE})) / sum(rate({c}_borderline_total{RATE}))",
                "fallback",
            ),
        )
    )
    d.with_panel(
        stat(
            "Tokens removed per compressed request",
            "Mean exact (cl100k) prompt tokens removed from each compressed request.",
            "short",
            (
                f"sum(rate({c}_tokens_removed_total{RATE})) / sum(rate({c}_compressed_total{RATE}))",
                "tokens",
            ),
        )
    )
    d.with_panel(
        timeseries(
            "Borderline, compressed, fallen back",
            "Requests per second in the band, and what became of them.",
            "reqps",
            (f"sum(rate({c}_borderline_total{RATE}))", "borderline"),
            (f"sum(rate({c}_compressed_total{RATE}))", "compressed"),
            (f"sum(rate({c}_fallback_total{RATE}))", "fallen back"),
        )
    )
    d.with_panel(
        timeseries(
            "Tokens removed / s",
            "Prompt tokens removed by compression per second (exact cl100k counts).",
            "short",
            (f"sum(rate({c}_tokens_removed_total{RATE}))", "tokens removed"),
        )
    )
    d.with_row(db.Row("Compressor and estimator"))
    d.with_panel(
        timeseries(
            "Compressor latency P50 / P99",
            "Time spent counting and compressing one borderline request (on the gateway's CPU).",
            "s",
            *quantiles(f"{c}_duration_seconds", by="", sel=""),
            (
                f"sum(rate({c}_duration_seconds_sum{RATE})) / sum(rate({c}_duration_seconds_count{RATE}))",
                "mean",
            ),
        )
    )
    d.with_panel(
        timeseries(
            "Learnt bytes per token by category",
            "ĉ_k: prompt bytes per engine token each gateway process learnt, by content category "
            "(each replica learns on its own).",
            "short",
            ("fleetgate_budget_bytes_per_token", "{{category}} {{instance}}"),
            min_zero=False,
        )
    )
    return d


def fleet() -> db.Dashboard:
    healthy = "fleetgate_worker_healthy"
    d = board(
        "fleetgate-fleet",
        "fleetgate / Fleet",
        "The engines behind the gateway: load, KV cache, prefix cache, and the gateway's view of "
        "each worker (health, circuit breaker, telemetry freshness).",
    ).with_variable(pool_variable(healthy))
    by = "pool, worker"
    d.with_row(db.Row("Health (as the gateways see each worker)"))
    d.with_panel(
        stat(
            "Routable workers",
            "Workers every gateway replica finds healthy with a closed circuit.",
            "short",
            (f"sum(min by ({by}) ({healthy}{{{POOL}}}))", "routable"),
        )
    )
    d.with_panel(
        stat(
            "Unroutable workers",
            "Workers some gateway replica cannot route to (failed health checks or open circuit).",
            "short",
            (f"count(min by ({by}) ({healthy}{{{POOL}}}) == 0) or vector(0)", "unroutable"),
            red_above=1,
        )
    )
    d.with_panel(
        stat(
            "Open circuits",
            "Workers whose circuit breaker is open on some replica.",
            "short",
            (
                f"sum(max by ({by}) (fleetgate_worker_circuit_open{{{POOL}}})) or vector(0)",
                "open",
            ),
            red_above=1,
        )
    )
    d.with_panel(
        stat(
            "Stale telemetry",
            "Workers whose last good /metrics scrape is older than telemetry.stale_after_s "
            "(treated as saturated by the router).",
            "short",
            (
                f"sum(max by ({by}) (fleetgate_worker_telemetry_stale{{{POOL}}})) or vector(0)",
                "stale",
            ),
            red_above=1,
        )
    )
    d.with_panel(
        states(
            "Health per worker",
            "1: passes health checks and its circuit is closed (worst of the replicas).",
            (f"min by ({by}) ({healthy}{{{POOL}}})", "{{pool}} {{worker}}"),
            good=("1", "routable"),
            bad=("0", "down"),
        )
    )
    d.with_panel(
        states(
            "Circuit breaker per worker",
            "1 while the worker's circuit breaker is open (on any replica).",
            (f"max by ({by}) (fleetgate_worker_circuit_open{{{POOL}}})", "{{pool}} {{worker}}"),
            good=("0", "closed"),
            bad=("1", "open"),
        )
    )
    d.with_panel(
        timeseries(
            "Telemetry age per worker",
            "Seconds since the gateway's last good /metrics scrape of the worker (worst replica; "
            "-1: never scraped).",
            "s",
            (
                f"max by ({by}) (fleetgate_worker_telemetry_age_seconds{{{POOL}}})",
                "{{pool}} {{worker}}",
            ),
            min_zero=False,
        )
    )
    d.with_panel(
        timeseries(
            "Circuit opens, health-check failures, scrape errors",
            "Per second, by worker (these counters carry no pool label).",
            "ops",
            (
                "sum by (worker) (rate(fleetgate_circuit_opens_total" + RATE + "))",
                "{{worker}} circuit opens",
            ),
            (
                "sum by (worker) (rate(fleetgate_health_check_failures_total" + RATE + "))",
                "{{worker}} health-check failures",
            ),
            (
                "sum by (worker, reason) (rate(fleetgate_telemetry_scrape_errors_total"
                + RATE
                + "))",
                "{{worker}} scrape {{reason}}",
            ),
        )
    )
    d.with_row(db.Row("Engines (scraped from the engines' own /metrics)"))
    inst = "pool, instance"
    legend = "{{pool}} {{instance}}"
    d.with_panel(
        timeseries(
            "Running requests per engine",
            "vllm:num_requests_running / sglang:num_running_reqs.",
            "short",
            (
                f"sum by ({inst}) (vllm:num_requests_running{{{POOL}}}) or "
                f"sum by ({inst}) ({sglang('num_running_reqs')})",
                legend,
            ),
        )
    )
    d.with_panel(
        timeseries(
            "Waiting requests per engine",
            "vllm:num_requests_waiting / sglang:num_queue_reqs: queued in the engine.",
            "short",
            (
                f"sum by ({inst}) (vllm:num_requests_waiting{{{POOL}}}) or "
                f"sum by ({inst}) ({sglang('num_queue_reqs')})",
                legend,
            ),
        )
    )
    d.with_panel(
        timeseries(
            "KV-cache usage per engine",
            "vllm:kv_cache_usage_perc / sglang:token_usage (1 = full).",
            "percentunit",
            (
                f"max by ({inst}) (vllm:kv_cache_usage_perc{{{POOL}}}) or "
                f"max by ({inst}) ({sglang('token_usage')})",
                legend,
            ),
        )
    )
    d.with_panel(
        timeseries(
            "Prefix-cache hit rate per engine",
            "Cached prompt tokens / queried prompt tokens: vllm:prefix_cache_hits / "
            "vllm:prefix_cache_queries, sglang:cached_tokens / sglang:prompt_tokens.",
            "percentunit",
            (
                f"sum by ({inst}) (rate(vllm:prefix_cache_hits_total{{{POOL}}}{RATE})) / "
                f"sum by ({inst}) (rate(vllm:prefix_cache_queries_total{{{POOL}}}{RATE})) or "
                f"sum by ({inst}) (rate({sglang('cached_tokens_total')}{RATE})) / "
                f"sum by ({inst}) (rate({sglang('prompt_tokens_total')}{RATE}))",
                legend,
            ),
        )
    )
    d.with_row(db.Row("Engines as the router sees them (the gateway's last scrape)"))
    d.with_panel(
        timeseries(
            "Running and waiting (gateway's view)",
            "What the router last read from each worker's /metrics (max over replicas).",
            "short",
            (
                f"max by ({by}) (fleetgate_worker_engine_running{{{POOL}}})",
                "{{worker}} running",
            ),
            (
                f"max by ({by}) (fleetgate_worker_engine_waiting{{{POOL}}})",
                "{{worker}} waiting",
            ),
        )
    )
    d.with_panel(
        timeseries(
            "KV-cache usage (gateway's view)",
            "KV-cache usage fraction the router last read from each worker.",
            "percentunit",
            (f"max by ({by}) (fleetgate_worker_engine_kv_usage{{{POOL}}})", "{{pool}} {{worker}}"),
        )
    )
    return d


def control() -> db.Dashboard:
    """Admission, the request queue, QUARTZ and cache-aware routing: the gateway's
    decisions before a request reaches an engine. The token-pool `pool` label is a token pool's name (admission.params
    .pools), not a fleet pool's: that row is not filtered by the Pool variable."""
    ent = "entitlement, pool"
    d = board(
        "fleetgate-control",
        "fleetgate / Admission, queue and QUARTZ",
        "Token-pool admission, the gateway's request queue, QUARTZ's tail-aware routing and "
        "cache-aware routing.",
    ).with_variable(pool_variable("fleetgate_requests_total"))
    d.with_row(db.Row("Token pools (admission.policy: token_pools)"))
    d.with_panel(
        timeseries(
            "Admitted by token pool and class",
            "fleetgate_admission_admitted_total: requests admitted on an entitlement, per second.",
            "reqps",
            (
                f"sum by (pool, class) (rate(fleetgate_admission_admitted_total{RATE}))",
                "{{pool}} {{class}}",
            ),
            stack=True,
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Refused by reason",
            "fleetgate_admission_refused_total: requests refused (429) per second, by the check "
            "that refused them (token_budget, kv_bytes, pool_contention, store_unavailable, ...).",
            "reqps",
            (
                f"sum by (pool, reason) (rate(fleetgate_admission_refused_total{RATE}))",
                "{{pool}} {{reason}}",
            ),
            stack=True,
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Refused share",
            "Refused / (admitted + refused) per token pool, over the rate window.",
            "percentunit",
            (
                f"sum by (pool) (rate(fleetgate_admission_refused_total{RATE})) / "
                f"(sum by (pool) (rate(fleetgate_admission_refused_total{RATE})) + "
                f"sum by (pool) (rate(fleetgate_admission_admitted_total{RATE})))",
                "{{pool}}",
            ),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Fairness debt per entitlement",
            "fleetgate_entitlement_debt (d_e): what an entitlement is owed against its baseline "
            "(max over replicas: with Redis every replica reports the same figure).",
            "short",
            (f"max by ({ent}) (fleetgate_entitlement_debt)", "{{pool}} {{entitlement}}"),
            width=8,
            min_zero=False,
        )
    )
    d.with_panel(
        timeseries(
            "Capacity: configured, promised, demanded (tokens / s)",
            "fleetgate_pool_capacity, _promised (Σ baselines) and _demand (the autoscaler's "
            "target) for the tokens_per_s resource.",
            "short",
            (
                'max by (pool) (fleetgate_pool_capacity{resource="tokens_per_s"})',
                "{{pool}} capacity",
            ),
            (
                'max by (pool) (fleetgate_pool_capacity_promised{resource="tokens_per_s"})',
                "{{pool}} promised",
            ),
            (
                'max by (pool) (fleetgate_pool_capacity_demand{resource="tokens_per_s"})',
                "{{pool}} demand",
            ),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Redis fallback (entitlement store breaker)",
            "fleetgate_entitlement_store_breaker_open: 1 while a replica cannot reach Redis "
            "and admits on its local limits (fail_open classes) or refuses (fail-closed).",
            "short",
            ("max by (instance) (fleetgate_entitlement_store_breaker_open)", "{{instance}}"),
            (
                f"sum(increase(fleetgate_entitlement_store_breaker_transitions_total{RATE}))",
                "breaker transitions",
            ),
            width=8,
        )
    )
    d.with_row(db.Row("Request queue (dispatch)"))
    d.with_panel(
        timeseries(
            "Waiting for a worker with room",
            "fleetgate_dispatch_queue_length: requests held in the gateway because every worker "
            "of their pools is at capacity (max_num_seqs, kv_overcommit, prefill_room).",
            "short",
            (f"sum by (pool) (fleetgate_dispatch_queue_length{{{POOL}}})", "{{pool}}"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Queue wait P50 / P99",
            "fleetgate_dispatch_wait_seconds: how long a request that waited waited.",
            "s",
            *quantiles("fleetgate_dispatch_wait_seconds", by="", sel=""),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Waits and refusals",
            "Requests that had to wait per second, and those the queue refused: queue_full "
            "(429, dispatch.max_waiting) and queue_timeout (503, dispatch.timeout_s).",
            "reqps",
            (f"sum(rate(fleetgate_dispatch_waits_total{RATE}))", "waited"),
            (
                f"sum by (reason) (rate(fleetgate_dispatch_refused_total{RATE}))",
                "refused {{reason}}",
            ),
            width=8,
        )
    )
    d.with_row(db.Row("Data-parallel groups (pools of kind dp_group)"))
    rank_load = f"sum by (pool, rank) (fleetgate_dp_rank_load_tokens{{{POOL}}})"
    imbalance = (
        f"count by (pool) ({rank_load}) * max by (pool) ({rank_load}) - sum by (pool) ({rank_load})"
    )
    d.with_panel(
        timeseries(
            "Load per rank",
            "fleetgate_dp_rank_load_tokens: each rank's L_g, Σ over the requests in flight on "
            "it of prompt tokens + tokens streamed so far (summed over gateway replicas).",
            "short",
            (rank_load, "{{pool}} rank {{rank}}"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Imbalance",
            "G·max_g L_g − Σ_g L_g over each group's ranks: the assignment policy's objective "
            "at lookahead 0 (BF-IO's imbalance).",
            "short",
            (imbalance, "{{pool}}"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Barrier idle (estimate)",
            "The share of rank time the imbalance would leave idle at the barrier were a "
            "rank's step proportional to its load: imbalance / (G·max_g L_g).",
            "percentunit",
            (
                f"({imbalance}) / (count by (pool) ({rank_load}) * max by (pool) ({rank_load}))",
                "{{pool}}",
            ),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Holding pool",
            "fleetgate_dp_pool_length: requests waiting in the gateway for a rank.",
            "short",
            (f"sum by (pool) (fleetgate_dp_pool_length{{{POOL}}})", "{{pool}}"),
            width=12,
        )
    )
    d.with_panel(
        timeseries(
            "Pool wait P50 / P99",
            "fleetgate_dp_pool_wait_seconds: arrival to assignment to a rank (the price of "
            "choosing which request fills a slot rather than the oldest).",
            "s",
            *quantiles("fleetgate_dp_pool_wait_seconds"),
            width=12,
        )
    )
    d.with_row(db.Row("QUARTZ (tail-aware routing and queueing)"))
    d.with_panel(
        timeseries(
            "Coverage of the predicted quantile",
            "fleetgate_quartz_coverage: share of recent first tokens within the calibrated "
            "alpha-quantile (should sit near alpha, 0.9 or 0.95); -1 before enough samples.",
            "percentunit",
            ("min by (instance) (fleetgate_quartz_coverage)", "{{instance}}"),
            width=8,
            min_zero=False,
        )
    )
    d.with_panel(
        timeseries(
            "Fallback",
            "fleetgate_quartz_fallback: 1 while coverage is below alpha - delta and QUARTZ "
            "routes least-loaded with a FIFO queue; and how often it switched.",
            "short",
            ("max by (instance) (fleetgate_quartz_fallback)", "{{instance}} fallback"),
            (
                f"sum(increase(fleetgate_quartz_fallback_changes_total{RATE}))",
                "switches",
            ),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Observed / predicted prefill",
            "fleetgate_quartz_prefill_ratio: observed prefill time over the predicted "
            "alpha-quantile, P50 and P99 (above 1: slower than predicted).",
            "short",
            *quantiles("fleetgate_quartz_prefill_ratio", by="", sel=""),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Observed prefill P50 / P99",
            "fleetgate_quartz_prefill_seconds: dispatch to a worker until its first token.",
            "s",
            *quantiles("fleetgate_quartz_prefill_seconds", by="", sel=""),
        )
    )
    d.with_panel(
        timeseries(
            "Expected backlog per worker",
            "fleetgate_quartz_worker_backlog_seconds: predicted prefill work sent and not yet "
            "at first token (max over replicas).",
            "s",
            ("max by (worker) (fleetgate_quartz_worker_backlog_seconds)", "{{worker}}"),
        )
    )
    d.with_row(db.Row("Cache-aware routing (kv_cost, regime_adaptive, prefix_overlap)"))
    d.with_panel(
        timeseries(
            "Saturation regime and smoothed TTFT P99",
            "fleetgate_routing_regime: regime_adaptive's regime per pool (0 Below, 1 "
            "Transition, 2 Saturated); fleetgate_routing_ttft_p99_smoothed_seconds: the "
            "detector's EWMA of the gateway's TTFT P99 (-1 before the first interval).",
            "short",
            (f"max by (pool) (fleetgate_routing_regime{{{POOL}}})", "{{pool}} regime"),
            (
                f"max by (pool) (fleetgate_routing_ttft_p99_smoothed_seconds{{{POOL}}})",
                "{{pool}} TTFT P99 EWMA (s)",
            ),
            width=8,
            min_zero=False,
        )
    )
    d.with_panel(
        timeseries(
            "Router temperature and overlap weight",
            "fleetgate_routing_temperature (τ) and fleetgate_routing_overlap_weight (ω) now, "
            "per pool: kv_cost's configured values, or regime_adaptive's row of the regime "
            "table.",
            "short",
            (f"max by (pool) (fleetgate_routing_temperature{{{POOL}}})", "{{pool}} τ"),
            (f"max by (pool) (fleetgate_routing_overlap_weight{{{POOL}}})", "{{pool}} ω"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Routing decision time P50 / P99",
            "fleetgate_routing_decision_seconds: one cache-aware routing decision (the "
            "prefix-index lookups and the softmax), wall clock.",
            "s",
            *quantiles("fleetgate_routing_decision_seconds"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Prefix-cache hit rate: index estimate and engines",
            "Index: dispatched prompt blocks the gateway's prefix index held for the chosen "
            "worker (fleetgate_prefix_index_hit_blocks / queried_blocks). Engines: their "
            "own hit rate between scrapes (fleetgate_worker_engine_prefix_hit_rate, mean "
            "over workers).",
            "percentunit",
            (
                f"sum by (pool) (rate(fleetgate_prefix_index_hit_blocks_total{{{POOL}}}{RATE})) / "
                f"sum by (pool) (rate(fleetgate_prefix_index_queried_blocks_total{{{POOL}}}{RATE}))",
                "{{pool}} index",
            ),
            (
                f"avg by (pool) (fleetgate_worker_engine_prefix_hit_rate{{{POOL}}})",
                "{{pool}} engines",
            ),
        )
    )
    d.with_panel(
        timeseries(
            "Prefix index entries",
            "fleetgate_prefix_index_blocks: (worker, block) entries held per pool, bounded "
            "by the router's max_blocks (~230 bytes each).",
            "short",
            (f"max by (pool) (fleetgate_prefix_index_blocks{{{POOL}}})", "{{pool}}"),
        )
    )
    d.with_panel(
        timeseries(
            "Price of anarchy (diagnostic)",
            "fleetgate_routing_poa_ratio: observed latency over a model optimum for the last "
            "window of completions — eq. 12 with the paper's constants (paper) and a cost "
            "fitted to the window (calibrated). Regime indicators, not efficiencies: they "
            "track latency scale and load (docs/CACHE_ROUTING.md). Estimated every "
            "telemetry.poa_interval_s off the event loop.",
            "short",
            (
                f"max by (pool, estimator) (fleetgate_routing_poa_ratio{{{POOL}}})",
                "{{pool}} {{estimator}}",
            ),
        )
    )
    d.with_row(db.Row("Disaggregated prefill/decode (kind: pd pools)"))
    d.with_panel(
        timeseries(
            "Hand-offs",
            "fleetgate_pd_handoffs_total: pairs per second by how they ended: ok (the KV "
            "left the prefill), prefill_failed, decode_failed (before any byte reached the "
            "client).",
            "reqps",
            (
                f"sum by (pool, outcome) (rate(fleetgate_pd_handoffs_total{{{POOL}}}{RATE}))",
                "{{pool}} {{outcome}}",
            ),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Prefill call P50 / P99",
            "fleetgate_pd_prefill_seconds: the prefill call, sent to answered (the hand-off).",
            "s",
            *quantiles("fleetgate_pd_prefill_seconds"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Transfer P50 / P99",
            "fleetgate_pd_transfer_seconds: hand-off to the decode's first token at the "
            "gateway (the KV's transfer and the decode's first step; streams only).",
            "s",
            *quantiles("fleetgate_pd_transfer_seconds"),
            width=8,
        )
    )
    d.with_panel(
        timeseries(
            "Prefill queue per worker",
            "fleetgate_pd_prefill_queue: requests on a prefill worker not handed off yet "
            "(summed over replicas). A queue that grows while decode utilisation stays low "
            "is the cascade: prefill saturates, decode idles.",
            "short",
            (f"sum by (worker) (fleetgate_pd_prefill_queue{{{POOL}}})", "{{worker}}"),
        )
    )
    d.with_panel(
        timeseries(
            "Utilisation per role",
            "fleetgate_pd_role_utilisation: slots held over the role's capacity (Σ "
            "max_num_seqs), max over replicas.",
            "percentunit",
            (
                f"max by (pool, role) (fleetgate_pd_role_utilisation{{{POOL}}})",
                "{{pool}} {{role}}",
            ),
        )
    )
    return d


DASHBOARDS = {
    "overview.json": overview,
    "compress.json": compress,
    "fleet.json": fleet,
    "control.json": control,
}


# --- output ----------------------------------------------------------------------------------


def _number(panels: list[dict[str, object]]) -> None:
    """Grafana wants panel ids unique within a dashboard; the SDK leaves them unset (0)."""
    for i, panel in enumerate(panels, start=1):
        panel["id"] = i


def render(name: str) -> str:
    data = json.loads(json.dumps(DASHBOARDS[name]().build(), cls=JSONEncoder))
    _number(data["panels"])
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def render_all() -> dict[str, str]:
    return {name: render(name) for name in DASHBOARDS}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    stale = []
    OUT.mkdir(exist_ok=True)
    for name, text in render_all().items():
        path = OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m deploy.grafana.dashboards")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
