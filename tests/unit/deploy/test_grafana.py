"""The Grafana dashboards: the committed JSON is what the generator writes, and every PromQL
expression of every panel reads only series that exist — the gateway's (from GatewayMetrics'
registry) or an engine's (from the emulator's vLLM and SGLang expositions)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.registry import CollectorRegistry

from deploy.grafana import dashboards
from emulator.engine import EngineConfig
from emulator.metrics_sglang import SglangMetrics
from emulator.metrics_vllm import VllmMetrics
from gateway.config import load_config
from gateway.metrics import GatewayMetrics
from gateway.pd_metrics import PdMetrics
from gateway.workers import Fleet
from policies.budget import BudgetEstimator
from policies.dp_group import DpGroup, DpGroupSpec
from tests.golden import cache_routing_series, quartz_series

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}
# PromQL words that look like metric names: operators, modifiers, literals
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
_KEYWORDS |= {"group_left", "group_right", "inf", "nan", "atan2"}


def _sample_names(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


@pytest.fixture(scope="module")
def gateway_series() -> set[str]:
    cfg = load_config(
        data={
            "pools": {
                "short": {
                    "max_model_len": 8192,
                    "models": ["m"],
                    "workers": [{"url": "http://127.0.0.1:1"}],
                }
            }
        },
        environ={},
    )
    metrics = GatewayMetrics(Fleet(cfg), time.monotonic)
    metrics.watch_budget(BudgetEstimator())
    metrics.watch_dp_groups({"dp": DpGroup("dp", DpGroupSpec(ranks=2, slots=2))})  # dp_group's
    pd = CollectorRegistry()  # `kind: pd` pools' series: only when one is configured
    PdMetrics(pd, Fleet(cfg))
    # QUARTZ's, the cache routers' and the pd pools': only when configured
    return (
        _sample_names(metrics.registry)
        | quartz_series()
        | cache_routing_series()
        | _sample_names(pd)
    )


@pytest.fixture(scope="module")
def engine_series() -> set[str]:
    vllm = VllmMetrics("m", EngineConfig())
    sglang = SglangMetrics("m", EngineConfig())
    return _sample_names(vllm.exposition.registry) | _sample_names(sglang.exposition.registry)


# a name matcher the dashboards use for SGLang's two spellings (dashboards.sglang): the
# text format's `sglang:x`, and `sglang_x` when Prometheus negotiated OpenMetrics
_NAME_MATCHER = re.compile(r'__name__=~"(\w+)\[:_\](\w+)"')


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (not functions, labels or keywords); a
    `{__name__=~"a[:_]b"}` matcher selects `a:b` as the exporter's registry names it."""
    found = {f"{a}:{b}" for a, b in _NAME_MATCHER.findall(expr)}
    assert "__name__" not in _NAME_MATCHER.sub("", expr), f"unsupported name matcher: {expr}"
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range selectors
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\w+", " ", e)  # Grafana variables
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        before = e[m.start() - 1] if m.start() else " "
        if before.isdigit() or before == ".":
            continue  # the exponent of a number literal
        if e[m.end() :].lstrip().startswith("(") or m.group() in _KEYWORDS:
            continue
        names.add(m.group())
    return names | found


def test_metric_names_parses_the_shapes_the_dashboards_use():
    expr = (
        'histogram_quantile(0.99, sum by (pool, le) (rate(a_bucket{pool=~"$pool", x="y{"}'
        "[$__rate_interval]))) / on (pool) group_left sum(b:c) or vector(1e3) and d offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b:c", "d"}
    expr = 'sum(rate({__name__=~"sglang[:_]x_total", pool=~"$pool"}[$__rate_interval])) or e'
    assert metric_names(expr) == {"sglang:x_total", "e"}


def _panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _exprs(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in _panels(board):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            yield f"${var['name']}", re.sub(r"^label_values\((\w+),.*$", r"\1", var["query"])


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return dashboards.render_all()


@pytest.fixture(scope="module")
def boards(rendered: dict[str, str]) -> dict[str, dict[str, Any]]:
    import json

    return {name: json.loads(text) for name, text in rendered.items()}


def test_committed_dashboards_are_what_the_generator_writes(rendered):
    on_disk = {p.name for p in dashboards.OUT.glob("*.json")}
    assert on_disk == set(rendered), "regenerate: python -m deploy.grafana.dashboards"
    for name, text in rendered.items():
        assert (dashboards.OUT / name).read_text() == text, (
            f"{name} is out of date: python -m deploy.grafana.dashboards"
        )


def test_every_query_reads_an_exported_series(boards, gateway_series, engine_series):
    unknown = {}
    for name, board in boards.items():
        for title, expr in _exprs(board):
            names = metric_names(expr)
            assert names, f"{name} / {title}: no metric in {expr!r}"
            for metric in names:
                known = gateway_series if metric.startswith("fleetgate_") else engine_series
                if metric not in known:
                    unknown[f"{name} / {title}"] = metric
    assert not unknown


def test_dashboards_cover_what_an_operator_opens_first(boards):
    used = {
        name: set().union(*(metric_names(e) for _, e in _exprs(b))) for name, b in boards.items()
    }
    assert {
        "fleetgate_requests_total",
        "fleetgate_time_to_first_token_seconds_bucket",
        "fleetgate_request_duration_seconds_bucket",
        "fleetgate_gateway_overhead_seconds_bucket",
        "fleetgate_worker_in_flight",
        "fleetgate_upstream_retries_total",
        "fleetgate_upstream_errors_total",
        "fleetgate_pool_spills_total",
        "fleetgate_client_disconnects_total",
    } <= used["overview.json"]
    assert {
        "fleetgate_compress_borderline_total",
        "fleetgate_compress_compressed_total",
        "fleetgate_compress_fallback_total",
        "fleetgate_compress_tokens_removed_total",
        "fleetgate_compress_duration_seconds_bucket",
        "fleetgate_budget_bytes_per_token",
    } <= used["compress.json"]
    assert {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "fleetgate_worker_telemetry_stale",
        "fleetgate_worker_telemetry_age_seconds",
        "fleetgate_worker_healthy",
        "fleetgate_worker_circuit_open",
    } <= used["fleet.json"]
    # issue 29: token pools, the request queue and QUARTZ
    assert {
        "fleetgate_admission_admitted_total",
        "fleetgate_admission_refused_total",
        "fleetgate_entitlement_debt",
        "fleetgate_entitlement_store_breaker_open",
        "fleetgate_dispatch_queue_length",
        "fleetgate_dispatch_wait_seconds_bucket",
        "fleetgate_dispatch_refused_total",
        "fleetgate_quartz_coverage",
        "fleetgate_quartz_fallback",
        "fleetgate_quartz_prefill_ratio_bucket",
    } <= used["control.json"]


def test_panels_are_well_formed(boards):
    uids = set()
    for name, board in boards.items():
        uids.add(board["uid"])
        assert "fleetgate" in board["tags"]
        panels = list(_panels(board))
        assert len({p["id"] for p in panels}) == len(panels), f"{name}: duplicate panel ids"
        for p in panels:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, f"{name} / {p['title']}"
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p.get("description"), f"{name} / {p['title']}: say what it shows"
            refs = [t["refId"] for t in p["targets"]]
            assert refs and len(set(refs)) == len(refs) and all(refs)
    assert len(uids) == len(boards)
