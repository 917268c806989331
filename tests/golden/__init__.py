"""The golden list of the gateway's metrics (tests/golden/gateway_metrics.txt).

One line per sample name the gateway's /metrics exposes: the name, its family's type and its
label names (`-` for none). Alerts, recording rules and dashboards depend on these names, so a
rename breaks a test here first: tests/unit/gateway/test_metrics_golden.py compares the golden
list with the metrics built in-process (every labelled series touched), tests/e2e/
test_prometheus.py with a live gateway's /metrics, and tests/unit/gateway/
test_prometheus_rules.py checks every metric name the rules use against it.

After an intended change, regenerate it and update deploy/prometheus/rules, the dashboards
and docs/OPERATIONS.md's Metrics table:

    python -m tests.golden > tests/golden/gateway_metrics.txt
"""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

GOLDEN = Path(__file__).with_name("gateway_metrics.txt")

HEADER = """\
# The gateway's /metrics: sample name, family type, label names (- for none).
# Regenerate after an intended change: python -m tests.golden > tests/golden/gateway_metrics.txt
# (then update deploy/prometheus/rules, the dashboards and docs/OPERATIONS.md's Metrics table).
"""

# sample name -> (family type, label names)
Catalogue = dict[str, tuple[str, frozenset[str]]]


def parse_exposition(text: str) -> Catalogue:
    """Every sample name of a Prometheus text exposition, with its family type and labels.

    A family without samples (a labelled counter nothing has touched yet) contributes no
    sample names; `families` lists those too."""
    out: Catalogue = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            entry = (fam.type, frozenset(s.labels))
            if out.setdefault(s.name, entry) != entry:
                raise ValueError(f"{s.name}: label sets {out[s.name]} and {entry} both exposed")
    return out


def families(text: str) -> dict[str, str]:
    """Family name -> type, whether or not the family has samples."""
    return {fam.name: fam.type for fam in text_string_to_metric_families(text)}


def family_of(sample: str, kind: str) -> str:
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count"),
    }.get(kind, ())
    for suffix in suffixes:
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def format_catalogue(cat: Catalogue) -> str:
    lines = [
        f"{name} {kind} {','.join(sorted(labels)) or '-'}"
        for name, (kind, labels) in sorted(cat.items())
    ]
    return HEADER + "\n".join(lines) + "\n"


def read_golden(path: Path = GOLDEN) -> Catalogue:
    out: Catalogue = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, kind, labels = line.split()
        out[name] = (kind, frozenset() if labels == "-" else frozenset(labels.split(",")))
    return out


def in_process_exposition() -> str:
    """The gateway's metrics built in-process, every labelled series touched once."""
    from gateway.config import load_config
    from gateway.metrics import GatewayMetrics
    from gateway.workers import Fleet
    from policies.budget import BudgetEstimator

    def pool(url: str, max_model_len: int) -> dict[str, object]:
        return {"max_model_len": max_model_len, "models": ["m"], "workers": [{"url": url}]}

    cfg = load_config(
        data={
            "pools": {
                "short": pool("http://127.0.0.1:9/", 8192),
                "long": pool("http://127.0.0.1:10/", 65536),
            }
        },
        environ={},
    )
    metrics = GatewayMetrics(Fleet(cfg), time.monotonic)
    metrics.watch_budget(BudgetEstimator())
    metrics.tenancy.source = _TenancySample()
    from policies.dispatch import make_dispatcher

    metrics.watch_dispatch(make_dispatcher("fifo"))
    from policies.dp_group import DpGroup, DpGroupSpec

    metrics.watch_dp_groups({"dp": DpGroup("dp", DpGroupSpec(ranks=2, slots=2))})
    for m in vars(metrics).values():
        if isinstance(m, MetricWrapperBase):
            names = m._labelnames  # prometheus_client keeps them private
            if names:
                m.labels(*["x"] * len(names))
    return metrics.render().decode()


class _TenancySample:
    """One pool with one entitlement, its demand and a Redis-like breaker: every token-pool
    family gets samples."""

    def __init__(self) -> None:
        from gateway.store_redis import CircuitBreaker
        from gateway.tenancy import Demand
        from policies.tenancy.admitter import TokenPoolsAdmitter
        from policies.tenancy.config import TokenPoolsConfig

        self.admitter = TokenPoolsAdmitter(
            TokenPoolsConfig(
                pools={"p": {"slots": 4, "tokens_per_s": 100, "kv_bytes": 1 << 20,
                             "bytes_per_token": 16}},
                entitlements={"e": {"pool": "p", "class": "spot"}},
            )
        )  # fmt: skip
        one = {"tokens_per_s": 1.0, "kv_bytes": 1.0, "slots": 1.0}
        self.demands = {"p": Demand("p", one, one, one)}
        self.store = type("Store", (), {"breaker": CircuitBreaker()})()

    def snapshot(self) -> list[object]:
        return [self.admitter.ledger.view("p", 0.0)]


def quartz_series() -> set[str]:
    """The sample names the gateway exposes only with QUARTZ configured (`watch_quartz`:
    not in the golden list, which a gateway without QUARTZ must match), every family's
    whether or not it has samples yet. Rules and dashboards may query these too."""
    from gateway.config import load_config
    from gateway.metrics import GatewayMetrics
    from gateway.quartz import predictor_for
    from gateway.workers import Fleet
    from policies.dispatch import make_dispatcher

    pool = {"max_model_len": 8192, "models": ["m"], "workers": [{"url": "http://127.0.0.1:9/"}]}
    cfg = load_config(data={"pools": {"short": pool}, "quartz": {}}, environ={})
    predictor = predictor_for(cfg)
    assert predictor is not None
    metrics = GatewayMetrics(Fleet(cfg), time.monotonic)
    before = {f.name for f in metrics.registry.collect()}
    metrics.watch_quartz(predictor, make_dispatcher("fifo"))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names: set[str] = set()
    for fam in metrics.registry.collect():
        if fam.name not in before:
            names.update(fam.name + s for s in suffixes.get(fam.type, ("",)))
    return names


def cache_routing_series() -> set[str]:
    """The sample names the gateway exposes only with a cache-aware router configured
    (gateway/routing_gauges.py: not in the golden list), every family's whether or not it
    has samples yet. Rules and dashboards may query these too."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from gateway.kv_events import KvEventCollector
    from gateway.poa_gauges import PoaCollector, PoaMonitor
    from gateway.routing_gauges import RoutingCollector, timed
    from policies.routing import make_router

    registry = CollectorRegistry(auto_describe=True)
    build = timed(lambda pool: make_router("regime_adaptive"), registry)
    registry.register(RoutingCollector({"short": build("short")}))
    # the PoA diagnostics (gateway/poa_gauges.py) and, with `kv_events`, the event counters
    registry.register(PoaCollector(PoaMonitor([], {}, lambda pool: [], lambda w: None)))
    no_streams = SimpleNamespace(appliers={}, gaps={})  # the collector reads only these
    registry.register(KvEventCollector(no_streams))  # type: ignore[arg-type]
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {fam.name + s for fam in registry.collect() for s in suffixes.get(fam.type, ("",))}


def pd_series() -> set[str]:
    """The sample names the gateway exposes only with a `pd` pool configured
    (gateway/pd_metrics.py: not in the golden list), every family's whether or not it has
    samples yet. Rules and dashboards may query these too."""
    from prometheus_client import CollectorRegistry

    from gateway.config import load_config
    from gateway.pd_metrics import PdMetrics
    from gateway.workers import Fleet

    pool = {"max_model_len": 8192, "models": ["m"], "workers": [{"url": "http://127.0.0.1:9/"}]}
    cfg = load_config(data={"pools": {"short": pool}}, environ={})
    registry = CollectorRegistry(auto_describe=True)
    PdMetrics(registry, Fleet(cfg))
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {fam.name + s for fam in registry.collect() for s in suffixes.get(fam.type, ("",))}
