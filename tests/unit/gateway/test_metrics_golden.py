"""The gateway's metrics match the golden list (tests/golden/gateway_metrics.txt).

Alerts, recording rules and dashboards query these names: renaming a metric or a label must
break this test, not a dashboard. The live /metrics is checked against the same list by
tests/e2e/test_prometheus.py.
"""

from tests.golden import (
    GOLDEN,
    families,
    family_of,
    format_catalogue,
    in_process_exposition,
    parse_exposition,
    read_golden,
)


def test_in_process_metrics_match_the_golden_list():
    text = in_process_exposition()
    built = parse_exposition(text)
    golden = read_golden()
    assert set(built) - set(golden) == set(), "new metrics: regenerate the golden list"
    assert set(golden) - set(built) == set(), "metrics gone or renamed"
    for name, entry in golden.items():
        assert built[name] == entry, name
    # every family the registry declares has its samples listed (none is left untouched)
    assert set(families(text)) == {family_of(n, k) for n, (k, _) in golden.items()}


def test_golden_file_is_in_canonical_form():
    assert GOLDEN.read_text() == format_catalogue(read_golden())


def test_readme_metrics_table_names_every_family():
    page = (GOLDEN.parents[2] / "docs" / "OPERATIONS.md").read_text()
    section = page[page.index("## Metrics") : page.index("## Docker")]
    for fam in {family_of(n, k) for n, (k, _) in read_golden().items()}:
        # `fleetgate_worker_engine_running`, `_waiting`, `_kv_usage` share a row
        tail = "`_" + fam.removeprefix("fleetgate_worker_engine_") + "`"
        assert fam in section or tail in section, (
            f"{fam} is not in docs/OPERATIONS.md's Metrics table"
        )
