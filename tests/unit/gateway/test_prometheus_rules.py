"""deploy/prometheus: promtool accepts the config and the rules and passes the rules' unit
tests; every metric the rules query exists (the gateway's golden list, the engines' names, or
another rule); every alert has a runbook section in deploy/README.md; the TTFT SLO's threshold
and objective agree everywhere.

promtool comes with Debian's `prometheus` package (`make test` installs it); without it only
the promtool tests skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.utils import floatToGoString

from emulator.engine import EngineConfig
from emulator.metrics import _Family
from emulator.metrics_sglang import SglangMetrics
from emulator.metrics_vllm import VllmMetrics
from gateway import metrics as gateway_metrics
from tests.golden import cache_routing_series, pd_series, quartz_series, read_golden

ROOT = Path(__file__).resolve().parents[3]
PROM = ROOT / "deploy" / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROM / "tests").glob("*.yml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (make test installs Debian's prometheus)"
)
# series Prometheus itself writes for every target
BUILTIN = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"}


def rules() -> list[dict]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def alerts() -> list[dict]:
    return [r for r in rules() if "alert" in r]


def recorded() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def promtool(*args: str, cwd: Path = PROM) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# --- promtool ------------------------------------------------------------------------------


@needs_promtool
def test_promtool_check_config():
    out = promtool("check", "config", "prometheus.yml")
    assert f"{len(RULE_FILES)} rule files found" in out


@needs_promtool
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path: Path):
    promtool("check", "rules", str(path))


@needs_promtool
@pytest.mark.parametrize("path", RULE_TESTS, ids=lambda p: p.name)
def test_promtool_rule_unit_tests(path: Path):
    promtool("test", "rules", str(path.relative_to(PROM)))


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (firing if t.get("exp_alerts") else quiet).add(t["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - firing == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested quiet"
    loaded = {p.name for path in RULE_TESTS for p in _rule_files_of(path)}
    assert loaded == {p.name for p in RULE_FILES}, "every rule file is unit-tested"


def _rule_files_of(test_file: Path) -> list[Path]:
    doc = yaml.safe_load(test_file.read_text())
    return [(test_file.parent / f).resolve() for f in doc["rule_files"]]


# --- metric names --------------------------------------------------------------------------

_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
_KEYWORDS |= {"unless", "bool", "offset", "inf", "nan", "atan2"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords).

    `{__name__=~"sglang[:_]X"}` (SGLang's names, colon or underscore as scraped) reads as
    `sglang:X`; any other `__name__` matcher is refused, so no name escapes the check."""
    names = {f"sglang:{n}" for n in re.findall(r'__name__=~"sglang\[:_\](\w+)"', expr)}
    if "__name__" in re.sub(r'__name__=~"sglang\[:_\]\w+"', "", expr):
        raise ValueError(f"a __name__ matcher this check cannot read: {expr}")
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range and subquery durations
    e = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    for m in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", e):
        if m.group().lower() in _KEYWORDS or e[m.end() :].lstrip().startswith("("):
            continue
        names.add(m.group())
    return names


def test_metric_names_extractor():
    expr = """
      (sum by (pool, le) (rate(fleetgate_x_bucket{le="0.5", job=~"a|b"}[5m] offset 1h))
        or 0 * vector(1))
      / on (pool) group_left (worker) avg_over_time(vllm:kv_cache_usage_perc[1d:5m])
      > bool 1e3 * (1 - 0.99) and absent(up{job="fleetgate"}) unless fleetgate:r:rate5m
    """
    assert metric_names(expr) == {
        "fleetgate_x_bucket",
        "vllm:kv_cache_usage_perc",
        "up",
        "fleetgate:r:rate5m",
    }


def _sample_names(fams: list[_Family]) -> set[str]:
    suffixes = {
        "counter": ["_total"],
        "gauge": [""],
        "histogram": ["_bucket", "_sum", "_count"],
        "summary": ["_sum", "_count"],
    }
    return {f.name + s for f in fams for s in suffixes[f.kind]}


def engine_metric_names() -> set[str]:
    vllm = VllmMetrics("m", EngineConfig())
    sglang = SglangMetrics("m", EngineConfig())
    return _sample_names(vllm._families()) | _sample_names(sglang._families())


def test_every_metric_the_rules_use_exists():
    golden = set(read_golden())
    engines = engine_metric_names()
    known = golden | quartz_series() | cache_routing_series() | pd_series() | engines
    known |= recorded() | BUILTIN
    used = {
        name: metric_names(r["expr"]) for r in rules() for name in [r.get("record", r.get("alert"))]
    }
    unknown = {rule: names - known for rule, names in used.items() if names - known}
    assert unknown == {}
    # the rules do read the gateway's and the engines' metrics (the check is not vacuous)
    every = set().union(*used.values())
    assert len(every & golden) >= 10
    assert {"vllm:num_requests_running", "sglang:num_running_reqs"} <= every


def test_recording_rules_are_fleetgate_namespaced_and_unique():
    names = [r["record"] for r in rules() if "record" in r]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"fleetgate:[a-z0-9_]+:[a-z0-9_]+", n) for n in names), names
    assert {"fleetgate:requests:rate5m", "fleetgate:ttft_seconds:p99_5m"} <= set(names)


# --- alerts: labels, annotations, runbooks ---------------------------------------------------


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def test_every_alert_has_severity_summary_description_and_a_runbook_section():
    readme = (ROOT / "deploy" / "README.md").read_text()
    anchors = _anchors(readme)
    names = [a["alert"] for a in alerts()]
    assert len(names) == len(set(names))
    for a in alerts():
        assert a["labels"]["severity"] in {"critical", "warning"}, a["alert"]
        ann = a["annotations"]
        assert ann["summary"] and ann["description"], a["alert"]
        page, _, anchor = ann["runbook"].partition("#")
        assert page == "deploy/README.md", a["alert"]
        assert anchor == a["alert"].lower(), a["alert"]
        assert anchor in anchors, f"deploy/README.md has no section for {a['alert']}"


def test_the_alerts_the_issue_asks_for_exist():
    exprs = {a["alert"]: a["expr"] for a in alerts()}
    uses = {name: metric_names(e) for name, e in exprs.items()}
    assert any("up" in u for u in uses.values())
    for metric in (
        "fleetgate_worker_telemetry_stale",
        "fleetgate_worker_healthy",
        "fleetgate_worker_circuit_open",
        "fleetgate:upstream_error_ratio:rate5m",
        "fleetgate:compress_fallback:ratio_rate30m",
        "fleetgate:ttft_slo_errors:ratio_rate1h",
        # issue 29: token pools (refusals, the Redis fallback), the queue, QUARTZ
        "fleetgate_admission_refused_total",
        "fleetgate_entitlement_store_breaker_open",
        "fleetgate_dispatch_refused_total",
        "fleetgate_dispatch_wait_seconds_bucket",
        "fleetgate_quartz_fallback",
        "fleetgate_quartz_prefill_ratio_bucket",
    ):
        assert any(metric in u for u in uses.values()), metric


# --- the TTFT SLO ----------------------------------------------------------------------------


def test_ttft_slo_threshold_and_objective_agree_everywhere():
    doc = yaml.safe_load((PROM / "rules" / "fleetgate-slo.yml").read_text())
    slo_rules = [r for g in doc["groups"] for r in g["rules"]]
    ratios = [r for r in slo_rules if r.get("record", "").startswith("fleetgate:ttft_slo_errors")]
    windows = {r["record"].rsplit("rate", 1)[1] for r in ratios}
    assert windows == {"5m", "30m", "1h", "2h", "6h", "1d", "3d"}
    thresholds = {le for r in ratios for le in re.findall(r'le="([^"]+)"', r["expr"])}
    assert len(thresholds) == 1, thresholds
    (threshold,) = thresholds
    # a bucket bound of the histogram, spelled as /metrics spells it
    assert threshold in {floatToGoString(b) for b in gateway_metrics._TTFT_BUCKETS}
    slo_alerts = [r for r in slo_rules if "alert" in r]
    assert {a["alert"] for a in slo_alerts} == {
        "FleetgateTTFTBudgetBurnFast",
        "FleetgateTTFTBudgetBurnSlow",
    }
    objectives = {o for a in slo_alerts for o in re.findall(r"\(1 - ([0-9.]+)\)", a["expr"])}
    assert len(objectives) == 1, objectives
    (objective,) = objectives
    budget_pct = f"{100 * (1 - float(objective)):g} %"
    for a in slo_alerts:
        assert len(re.findall(r"\(1 - ", a["expr"])) == 4
        assert f"{threshold} s" in a["annotations"]["description"]
        assert f"at most {budget_pct}" in a["annotations"]["description"]
        # every window an alert reads is recorded
        assert set(re.findall(r"ratio_rate(\w+)", a["expr"])) <= windows
    assert f'le="{threshold}"' in (PROM / "rules" / "fleetgate-slo.yml").read_text()


def test_sglang_names_in_either_spelling():
    """SGLang scraped as OpenMetrics has `sglang_x` for `sglang:x` (WIRE_SPEC §6): the rules
    match both, and the check reads that as the engine's documented name."""
    assert metric_names('sum({__name__=~"sglang[:_]num_running_reqs"})') == {
        "sglang:num_running_reqs"
    }
    with pytest.raises(ValueError):
        metric_names('sum({__name__=~".+"})')
