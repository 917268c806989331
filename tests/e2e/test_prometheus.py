"""The gateway's metrics as Prometheus sees them, end to end on loopback.

A gateway in front of a short pool (a good emulator, one answering 500 to half its generation
requests, and a worker nobody listens on) and a long pool serves a little traffic: streaming,
non-streaming, and borderline prompts for Compress-and-Route.

- Its live /metrics matches the golden list (tests/golden/gateway_metrics.txt).
- A real `prometheus` (Debian's package; `make test` installs it), configured like
  deploy/prometheus/prometheus.yml but scraping these processes every second, loads every rule
  file without an evaluation error, and every recording rule returns data.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.e2e.fleet import MODEL, Fleet, emulator, gateway_config, start_gateway
from tests.e2e.test_compress_and_route import prose, tokens
from tests.golden import families, family_of, parse_exposition, read_golden
from tests.procs import ROOT, Proc, Procs, free_port, procs

pytestmark = pytest.mark.e2e

PROM_DIR = ROOT / "deploy" / "prometheus"
PROMETHEUS = shutil.which("prometheus")
DEADLINE_S = 45.0
BORDERLINE = [
    {"role": "system", "content": "You summarise documents faithfully."},
    {"role": "user", "content": "Here is the document:\n\n" + tokens(prose(8000), 9000)},
    {"role": "user", "content": "Summarise it in three sentences."},
]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with procs() as ps:
        good = emulator(ps, "short-good", 8192)
        failing = emulator(ps, "short-failing", 8192, "--error-rate", "0.5")
        long = emulator(ps, "long", 65536)
        for p in (good, failing, long):
            p.wait_ready("/health")
        dead = f"http://127.0.0.1:{free_port()}"  # connect refused: unhealthy, stale telemetry
        cfg = gateway_config([good.url, failing.url, dead], [long.url])
        f = Fleet(ps, [good, failing], [long], start_gateway(ps, cfg), cfg)
        send_load(f)
        yield f


def send_load(fleet: Fleet, rounds: int = 2) -> None:
    """Streaming and non-streaming chats and a borderline prompt; any status is fine."""
    small = [{"role": "user", "content": "Say hello."}]
    with httpx.Client(base_url=fleet.url, timeout=30) as c:
        for _ in range(rounds):
            for stream in (True, True, True, False):
                body = {"model": MODEL, "messages": small, "max_tokens": 8, "stream": stream}
                c.post("/v1/chat/completions", json=body)
            body = {"model": MODEL, "messages": BORDERLINE, "max_tokens": 256}
            c.post("/v1/chat/completions", json=body)


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
# machine may be slow), the failing worker's errors, borderline prompts, the long pool's one
# healthy worker, tokens generated.
EXPECTED: dict[str, Callable[[float], bool]] = {
    'sum(fleetgate:requests:rate5m{pool="short"})': lambda v: v > 0,
    'fleetgate:ttft_seconds:p99_5m{pool="short"}': lambda v: 0 < v < float("inf"),
    'fleetgate:ttft_slo_errors:ratio_rate5m{pool="short"}': lambda v: 0 <= v <= 1,
    'fleetgate:upstream_error_ratio:rate5m{pool="short"}': lambda v: v > 0,
    "fleetgate:compress_borderline:rate5m": lambda v: v > 0,
    'fleetgate:pool_healthy_workers:sum{pool="long"}': lambda v: v == 1,
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


@pytest.mark.skipif(
    PROMETHEUS is None,
    reason="the prometheus binary is not installed (make test installs Debian's prometheus)",
)
def test_prometheus_scrapes_the_fleet_and_every_recording_rule_returns_data(fleet: Fleet):
    names = recording_rules()
    assert len(names) >= 20
    prom = start_prometheus(fleet.procs, prometheus_config(fleet))
    deadline = time.monotonic() + DEADLINE_S
    with httpx.Client(base_url=prom.url, timeout=10) as api:
        # every target up: the gateway and the three engines
        while True:
            targets = api.get("/api/v1/targets").json()["data"]["activeTargets"]
            if len(targets) == 4 and all(t["health"] == "up" for t in targets):
                break
            assert time.monotonic() < deadline, targets
            time.sleep(0.2)
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
