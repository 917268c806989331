"""The gateway's metrics as Prometheus sees them, end to end on loopback.

A gateway in front of a short pool (a good emulator, one answering 500 to half its generation
requests, one that crashes on its second request, and a worker nobody listens on), a mid pool
whose only worker is down, and a long pool serves traffic of every kind the dashboards show:
streaming and non-streaming chats, borderline prose compressed onto the short pool, borderline
prose that cannot be compressed (fallback), code too long for the short pool (spilled past the
dead mid pool), a client that leaves mid-stream, engine 500s (circuit opens), a crash (a
retry on another worker).

- Its live /metrics matches the golden list (tests/golden/gateway_metrics.txt).
- A real `prometheus` (Debian's package; `make test` installs it), configured like
  deploy/prometheus/prometheus.yml but scraping these processes every second, loads every rule
  file without an evaluation error, and every recording rule returns data.
- Every query of every panel of every committed Grafana dashboard (deploy/grafana/dashboards/),
  its variables substituted as Grafana does for the default "All" selection, returns data
  from that Prometheus.
"""

from __future__ import annotations

import asyncio.base_events
import inspect
import json
import math
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.fleet import MODEL, Fleet, emulator, gateway_config, metric, start_gateway
from tests.e2e.test_compress_and_route import prose, tokens
from tests.golden import families, family_of, parse_exposition, read_golden
from tests.procs import ROOT, Proc, Procs, free_port, procs

pytestmark = pytest.mark.e2e

PROM_DIR = ROOT / "deploy" / "prometheus"
DASHBOARDS_DIR = ROOT / "deploy" / "grafana" / "dashboards"
PROMETHEUS = shutil.which("prometheus")
DEADLINE_S = 45.0
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="the prometheus binary is not installed (make test installs Debian's prometheus)",
)
DOCUMENT = tokens(prose(8000), 9000)
# compressible: the document is an earlier message, and compression removes enough of it
BORDERLINE = [
    {"role": "system", "content": "You summarise documents faithfully."},
    {"role": "user", "content": "Here is the document:\n\n" + DOCUMENT},
    {"role": "user", "content": "Summarise it in three sentences."},
]
# borderline too, but all of it is the last user message, which this test's gateway protects
# (`placement.protect_last_user: true`): it falls back to the long pool uncompressed
UNCOMPRESSIBLE = [
    {"role": "user", "content": "Summarise this document:\n\n" + DOCUMENT},
]
# code is never compressed; ~9,000 tokens fit the mid and long pools only, and the mid pool's
# only worker is down: the request spills to the long pool
CODE = tokens(inspect.getsource(asyncio.base_events) * 3, 9000)
# gateway series that only traffic of a kind creates (a labelled counter appears on its first
# increment): the fixture's load runs until each exists, or FAULTS_DEADLINE_S
TRAFFIC_SERIES = (
    "fleetgate_upstream_retries_total",
    "fleetgate_pool_spills_total",
    "fleetgate_client_disconnects_total",
    "fleetgate_circuit_opens_total",
    "fleetgate_upstream_errors_total",
    "fleetgate_health_check_failures_total",
    "fleetgate_telemetry_scrape_errors_total",
)
FAULTS_DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with procs() as ps:
        good = emulator(ps, "short-good", 8192)
        failing = emulator(ps, "short-failing", 8192, "--error-rate", "0.5")
        # resets its second request's connection before answering (a crash): retried elsewhere
        crashing = emulator(ps, "short-crashing", 8192, "--crash-after-requests", "1")
        long = emulator(ps, "long", 65536)
        # an SGLang engine too: the dashboards' engine panels read `vllm:* or sglang*`, and
        # Prometheus stores SGLang's names as `sglang_*` (it negotiates OpenMetrics)
        long_sglang = emulator(ps, "long-sglang", 65536, "--personality", "sglang")
        for p in (good, failing, crashing, long, long_sglang):
            p.wait_ready("/health")
        dead = f"http://127.0.0.1:{free_port()}"  # connect refused: unhealthy, stale telemetry
        cfg = gateway_config(
            [good.url, failing.url, crashing.url, dead],
            [long.url, long_sglang.url],
            # two engine 500s in a row open the failing worker's circuit, for a second
            breaker={"failures": 2, "open_s": 1.0},
            # the last user message is left whole, so UNCOMPRESSIBLE falls back
            placement={"protect_last_user": True},
        )
        pools: Any = cfg["pools"]
        dead_mid = f"http://127.0.0.1:{free_port()}"
        pools["mid"] = {"max_model_len": 16384, "models": [MODEL], "workers": [{"url": dead_mid}]}
        # the crashing worker is not scraped by Prometheus (it is down for most of the test)
        f = Fleet(ps, [good, failing], [long, long_sglang], start_gateway(ps, cfg), cfg)
        send_load(f)
        deadline = time.monotonic() + FAULTS_DEADLINE_S
        while time.monotonic() < deadline:
            live = parse_exposition(f.metrics())
            if all(name in live for name in TRAFFIC_SERIES):
                break
            send_load(f, rounds=1)
        yield f


def send_load(fleet: Fleet, rounds: int = 2) -> None:
    """Streaming and non-streaming chats, borderline prompts (compressed and not), a code
    prompt that spills, and a client that leaves mid-stream; any status is fine."""
    small = [{"role": "user", "content": "Say hello."}]
    with httpx.Client(base_url=fleet.url, timeout=30) as c:
        for _ in range(rounds):
            for stream in (True, True, True, False):
                body = {"model": MODEL, "messages": small, "max_tokens": 8, "stream": stream}
                c.post("/v1/chat/completions", json=body)
            for messages in (BORDERLINE, UNCOMPRESSIBLE):
                body = {"model": MODEL, "messages": messages, "max_tokens": 256}
                c.post("/v1/chat/completions", json=body)
            c.post("/v1/completions", json={"model": MODEL, "prompt": CODE, "max_tokens": 16})
            leave_mid_stream(c)


def leave_mid_stream(c: httpx.Client) -> None:
    """A stream of 2,000 tokens (~0.4 s at the emulators' time scale), left after 3 events."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = r.iter_lines()  # held: dropping a half-read iterator closes the connection
        got = 0
        for line in lines:
            got += line.startswith("data: {")
            if got >= 3:
                break


def test_live_metrics_match_the_golden_list(fleet: Fleet):
    text = fleet.metrics()
    golden = read_golden()
    # every family, touched or not, with its type
    assert families(text) == {family_of(n, k): k for n, (k, _) in golden.items()}
    live = parse_exposition(text)
    assert {n: e for n, e in live.items() if golden.get(n) != e} == {}
    # what a few requests must have produced (the rest appears with retries, spills, ...)
    for name in (
        "fleetgate_requests_total",
        "fleetgate_time_to_first_token_seconds_bucket",
        "fleetgate_request_duration_seconds_bucket",
        "fleetgate_gateway_overhead_seconds_bucket",
        "fleetgate_prompt_tokens_total",
        "fleetgate_worker_healthy",
        "fleetgate_worker_telemetry_stale",
        "fleetgate_compress_borderline_total",
        "fleetgate_budget_bytes_per_token",
    ):
        assert name in live, name
    # what the fixture's load is for: each kind of traffic a dashboard panel shows happened
    for name in (
        *TRAFFIC_SERIES,
        "fleetgate_compress_compressed_total",
        "fleetgate_compress_fallback_total",
    ):
        assert metric(text, name) > 0, f"the load produced no {name}"


def prometheus_config(fleet: Fleet) -> dict:
    """deploy/prometheus/prometheus.yml, its targets replaced by this fleet's processes."""
    cfg = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"}
    cfg["rule_files"] = [str(PROM_DIR / pattern) for pattern in cfg["rule_files"]]
    jobs = {job["job_name"]: job for job in cfg["scrape_configs"]}
    assert set(jobs) == {"fleetgate", "engines"}
    jobs["fleetgate"]["static_configs"] = [{"targets": [fleet.url.removeprefix("http://")]}]
    jobs["engines"]["static_configs"] = [
        {"targets": [p.url.removeprefix("http://") for p in ps], "labels": {"pool": pool}}
        for pool, ps in (("short", fleet.short), ("long", fleet.long))
    ]
    return cfg


def start_prometheus(ps: Procs, cfg: dict) -> Proc:
    assert PROMETHEUS is not None
    home = ps.dir / "prometheus"
    home.mkdir()
    (home / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    argv = [
        PROMETHEUS,
        f"--config.file={home / 'prometheus.yml'}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    proc = Proc("prometheus", argv, port, ps.dir / "prometheus.log")
    ps.procs.append(proc)
    return proc.start().wait_ready("/-/ready", timeout=30)


def recording_rules() -> list[str]:
    return [
        rule["record"]
        for path in sorted((PROM_DIR / "rules").glob("*.yml"))
        for group in yaml.safe_load(Path(path).read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]


def query(api: httpx.Client, expr: str) -> list[dict]:
    r = api.get("/api/v1/query", params={"query": expr})
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    result: list[dict] = body["data"]["result"]
    return result


def value(api: httpx.Client, expr: str) -> float | None:
    result = query(api, expr)
    return float(result[0]["value"][1]) if result else None


# What the load must show: traffic, a TTFT quantile and SLO ratio (not their values: a loaded
# machine may be slow), the failing worker's errors, borderline prompts, the long pool's two
# healthy workers, tokens generated.
EXPECTED: dict[str, Callable[[float], bool]] = {
    'sum(fleetgate:requests:rate5m{pool="short"})': lambda v: v > 0,
    'fleetgate:ttft_seconds:p99_5m{pool="short"}': lambda v: 0 < v < float("inf"),
    'fleetgate:ttft_slo_errors:ratio_rate5m{pool="short"}': lambda v: 0 <= v <= 1,
    'fleetgate:upstream_error_ratio:rate5m{pool="short"}': lambda v: v > 0,
    "fleetgate:compress_borderline:rate5m": lambda v: v > 0,
    'fleetgate:pool_healthy_workers:sum{pool="long"}': lambda v: v == 2,
    'fleetgate:engine_generation_tokens:rate5m{pool="short"}': lambda v: v > 0,
}


STALE_PENDING = 'ALERTS{alertname="FleetgateWorkerTelemetryStale", alertstate="pending"}'


def unexpected(api: httpx.Client) -> list[str]:
    out = []
    for expr, ok in EXPECTED.items():
        v = value(api, expr)
        if v is None or not ok(v):
            out.append(f"{expr} = {v}")
    return out


@pytest.fixture(scope="module")
def prometheus(fleet: Fleet) -> Proc:
    """A real Prometheus scraping the fleet every second, once every target is up."""
    if PROMETHEUS is None:
        pytest.skip("the prometheus binary is not installed (make test installs it)")
    prom = start_prometheus(fleet.procs, prometheus_config(fleet))
    deadline = time.monotonic() + DEADLINE_S
    with httpx.Client(base_url=prom.url, timeout=10) as api:
        # every target up: the gateway and the engines (not the crashing one)
        n = 1 + len(fleet.short) + len(fleet.long)
        while True:
            targets = api.get("/api/v1/targets").json()["data"]["activeTargets"]
            if len(targets) == n and all(t["health"] == "up" for t in targets):
                return prom
            assert time.monotonic() < deadline, targets
            time.sleep(0.2)


@needs_prometheus
def test_prometheus_scrapes_the_fleet_and_every_recording_rule_returns_data(
    fleet: Fleet, prometheus: Proc
) -> None:
    names = recording_rules()
    assert len(names) >= 20
    prom = prometheus
    deadline = time.monotonic() + DEADLINE_S
    with httpx.Client(base_url=prom.url, timeout=10) as api:
        # load between scrapes until every recording rule has a sample and the ones below
        # have seen the load (a rate needs two scrapes around a request)
        problems = ["not queried yet"]
        while problems:
            assert time.monotonic() < deadline, f"{problems}\n{prom.output()}"
            send_load(fleet, rounds=1)
            time.sleep(0.2)
            problems = [f"no data: {n}" for n in names if not query(api, n)]
            problems += unexpected(api)
            # the alerts see live data: the dead worker's telemetry is stale (pending: `for: 5m`)
            if not query(api, STALE_PENDING):
                problems.append(f"no {STALE_PENDING}")

        # every rule (alerts too) evaluates without error
        groups = api.get("/api/v1/rules").json()["data"]["groups"]
        evaluated = [r for g in groups for r in g["rules"]]
        assert {Path(g["file"]).name for g in groups} == {
            p.name for p in (PROM_DIR / "rules").glob("*.yml")
        }
        assert [r["name"] for r in evaluated if r["health"] != "ok"] == []
        alerts = {r["name"] for r in evaluated if r["type"] == "alerting"}
        assert {"FleetgateGatewayDown", "FleetgateTTFTBudgetBurnFast"} <= alerts


# --- the Grafana dashboards' queries ----------------------------------------------------------

# Grafana's built-in variables, as Grafana sets them for the dashboards' default view (the last
# hour): $__rate_interval is max($__interval + the data source's scrape interval, 4 × that
# scrape interval), 1m with Grafana's default scrape interval of 15s. A 1m window also holds
# enough of this Prometheus' 1s scrapes for rate() to see the load of the last minute.
GRAFANA_BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__interval_ms": "15000",
}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")
LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?(\w+)\)$")

# Panel queries that cannot return data in this test, as (dashboard file, panel title):
# none. Every panel gets data from the fixture's load; add one here only with the reason.
_NO_TOKEN_POOLS = "this fleet runs admission.policy always: no token-pool series"
_NO_QUARTZ = "this fleet runs without QUARTZ (its golden list has no quartz series)"
_NO_DP_GROUP = (
    "this fleet has no dp_group pool (tests/e2e/test_dp_group_two_drivers.py checks its series)"
)
_NO_CACHE_ROUTING = (
    "this fleet routes least_loaded: no cache-aware router series"
    " (tests/e2e/test_cache_routing.py checks them)"
)
_NO_PD = "this fleet has no pd pool (tests/e2e/test_pd_gateway.py checks its series)"
_NO_WAITS = "no worker here has max_num_seqs: no request waits or is refused by the queue"
NO_DATA_IN_TEST: dict[tuple[str, str], str] = {
    ("control.json", "Admitted by token pool and class"): _NO_TOKEN_POOLS,
    ("control.json", "Refused by reason"): _NO_TOKEN_POOLS,
    ("control.json", "Refused share"): _NO_TOKEN_POOLS,
    ("control.json", "Fairness debt per entitlement"): _NO_TOKEN_POOLS,
    ("control.json", "Capacity: configured, promised, demanded (tokens / s)"): _NO_TOKEN_POOLS,
    ("control.json", "Redis fallback (entitlement store breaker)"): _NO_TOKEN_POOLS,
    ("control.json", "Queue wait P50 / P99"): _NO_WAITS,
    ("control.json", "Waits and refusals"): _NO_WAITS,
    ("control.json", "Coverage of the predicted quantile"): _NO_QUARTZ,
    ("control.json", "Fallback"): _NO_QUARTZ,
    ("control.json", "Observed / predicted prefill"): _NO_QUARTZ,
    ("control.json", "Observed prefill P50 / P99"): _NO_QUARTZ,
    ("control.json", "Expected backlog per worker"): _NO_QUARTZ,
    ("control.json", "Load per rank"): _NO_DP_GROUP,
    ("control.json", "Imbalance"): _NO_DP_GROUP,
    ("control.json", "Barrier idle (estimate)"): _NO_DP_GROUP,
    ("control.json", "Holding pool"): _NO_DP_GROUP,
    ("control.json", "Pool wait P50 / P99"): _NO_DP_GROUP,
    ("control.json", "Saturation regime and smoothed TTFT P99"): _NO_CACHE_ROUTING,
    ("control.json", "Router temperature and overlap weight"): _NO_CACHE_ROUTING,
    ("control.json", "Routing decision time P50 / P99"): _NO_CACHE_ROUTING,
    ("control.json", "Prefix-cache hit rate: index estimate and engines"): _NO_CACHE_ROUTING,
    ("control.json", "Prefix index entries"): _NO_CACHE_ROUTING,
    ("control.json", "Price of anarchy (diagnostic)"): _NO_CACHE_ROUTING,
    ("control.json", "Hand-offs"): _NO_PD,
    ("control.json", "Prefill call P50 / P99"): _NO_PD,
    ("control.json", "Prefill queue per worker"): _NO_PD,
    ("control.json", "Transfer P50 / P99"): _NO_PD,
    ("control.json", "Utilisation per role"): _NO_PD,
}


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS_DIR.glob("*.json"))}


def panel_queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel, rows' collapsed panels too."""
    for panel in board["panels"]:
        for p in (panel, *panel.get("panels", [])):
            for target in p.get("targets", []):
                if not target.get("hide"):
                    yield p["title"], target["expr"]


def label_values(api: httpx.Client, definition: str) -> list[str]:
    """What a query variable's `label_values([metric,] label)` lists, as Grafana asks for it."""
    m = LABEL_VALUES.match(definition.strip())
    assert m, f"unsupported variable query {definition!r}"
    metric, label = m.groups()
    params = {"match[]": metric} if metric else {}
    r = api.get(f"/api/v1/label/{label}/values", params=params)
    r.raise_for_status()
    values: list[str] = r.json()["data"]
    return values


def all_selection(api: httpx.Client, board: dict[str, Any]) -> dict[str, str]:
    """Each variable's value for Grafana's default selection: "All" where a variable has it
    (its custom all value, else every value it lists as a regex alternation), else its first
    value. The data source variable never appears in an expression."""
    values = dict(GRAFANA_BUILTINS)
    for var in board["templating"]["list"]:
        if var["type"] == "datasource":
            continue
        assert var["type"] == "query", f"{board['title']}: ${var['name']} is a {var['type']}"
        definition = var["query"] if isinstance(var["query"], str) else var["query"]["query"]
        listed = label_values(api, definition)
        assert listed, f"{board['title']}: variable ${var['name']} ({definition}) lists nothing"
        if var.get("includeAll"):
            if var.get("allValue"):
                values[var["name"]] = var["allValue"]
            else:
                values[var["name"]] = "(" + "|".join(re.escape(v) for v in listed) + ")"
        else:
            values[var["name"]] = listed[0]
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        assert name in values, f"unknown variable ${name} in {expr!r}"
        return values[name]

    return VARIABLE.sub(one, expr)


def alternatives(expr: str) -> list[str]:
    """The operands of the expression's top-level `or` (PromQL's lowest precedence), each
    of which must return data on its own: `vllm:x or sglang:y` checks both engines' names."""
    parts, depth, start = [], 0, 0
    for m in re.finditer(r'[(){}\[\]]|"(?:[^"\\]|\\.)*"|\bor\b', expr):
        token = m.group()
        if token in ("(", "{", "["):
            depth += 1
        elif token in (")", "}", "]"):
            depth -= 1
        elif token == "or" and depth == 0:
            parts.append(expr[start : m.start()].strip())
            start = m.end()
    parts.append(expr[start:].strip())
    # a constant fallback (`... or vector(0)`) always has data: not a check
    return [p for p in parts if not re.fullmatch(r"vector\([^()]*\)", p)]


def test_alternatives_split_only_the_top_level_or() -> None:
    expr = '(a or vector(0)) / b{x="or"} or c / d or vector(0)'
    assert alternatives(expr) == ['(a or vector(0)) / b{x="or"}', "c / d"]


def has_data(result: list[dict[str, Any]]) -> bool:
    """At least one series with a number (not NaN: a 0/0 ratio draws nothing)."""
    return any(not math.isnan(float(s["value"][1])) for s in result)


@needs_prometheus
def test_every_dashboard_panel_query_returns_data(fleet: Fleet, prometheus: Proc) -> None:
    boards = dashboards()
    assert set(boards) == {"overview.json", "compress.json", "fleet.json", "control.json"}
    deadline = time.monotonic() + DEADLINE_S
    with httpx.Client(base_url=prometheus.url, timeout=10) as api:
        checks = []
        for name, board in boards.items():
            values = all_selection(api, board)
            for title, expr in panel_queries(board):
                if (name, title) not in NO_DATA_IN_TEST:
                    run = substitute(expr, values)
                    checks += [(name, title, expr, alt) for alt in alternatives(run)]
        assert len(checks) >= 40
        # load between scrapes until every query has seen it (rates need two scrapes)
        while True:
            missing = [c for c in checks if not has_data(query(api, c[3]))]
            if not missing or time.monotonic() > deadline:
                break
            send_load(fleet, rounds=1)
            time.sleep(0.5)
        assert not missing, "panel queries without data:\n" + "\n".join(
            f"- {name} / {title!r}:\n    {expr}\n    no data from: {run}"
            for name, title, expr, run in missing
        )
        titles = {(name, title) for name, b in boards.items() for title, _ in panel_queries(b)}
        assert set(NO_DATA_IN_TEST) <= titles, "an exemption names no panel"
