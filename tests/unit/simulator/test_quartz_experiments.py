"""The QUARTZ protocol's harness (bench/quartz_experiments.py --quick): it runs, every method
sees the same trace, and at the knee QUARTZ serves interactive requests first. That its
overall P99 TTFT is not worse than FIFO-LL's (the paper's claim) does not hold on our
engine model: an expected failure, with the reason.

Direction only, on fixed seeds: the magnitudes are the full protocol's (docs/QUARTZ_PAPER.md); virtual
time only, no wall clock.
"""

from __future__ import annotations

import pytest

from tests.experiments.quartz_experiments import (
    BOUNDED,
    FORWARD_LL,
    QUICK,
    experiment,
    main,
)
from tests.experiments.quartz_protocol import NOMINAL, SHIFTS, VARIANTS, mean_over_seeds, trace


@pytest.fixture(scope="module")
def quick() -> dict:
    return experiment(QUICK)


def test_the_same_load_and_seed_give_the_same_trace_for_every_method() -> None:
    a = trace(NOMINAL, 18.0, 300, seed=2)
    assert a == trace(NOMINAL, 18.0, 300, seed=2)
    assert a != trace(NOMINAL, 18.0, 300, seed=3)
    reused = sum(1 for s in a if s.prefix_hashes)
    assert 0.45 * len(a) < reused < 0.75 * len(a)  # nominal reuse share 0.6
    assert {s.client.split("-")[0] for s in a if s.slo_class == "long"} == {"rag"}
    assert all(s.max_tokens == s.output_tokens for s in a)


def test_the_shifts_change_what_they_say() -> None:
    base = trace(NOMINAL, 18.0, 600, seed=1)
    more_rag = trace(VARIANTS["More RAG"], 18.0, 600, seed=1)
    low = trace(VARIANTS["Low Reuse"], 18.0, 600, seed=1)
    big = trace(VARIANTS["Large Budget"], 18.0, 600, seed=1)
    share = lambda specs: sum(s.slo_class == "long" for s in specs) / len(specs)  # noqa: E731
    assert share(more_rag) > share(base) + 0.1
    assert sum(bool(s.prefix_hashes) for s in low) < 0.3 * sum(bool(s.prefix_hashes) for s in base)
    assert [s.output_tokens for s in big] == [s.output_tokens for s in base]
    assert sum(s.max_tokens for s in big) > 3 * sum(s.max_tokens for s in base)
    assert len(SHIFTS) == 3


def test_quick_protocol_runs_and_finds_a_knee(quick: dict) -> None:
    rows = quick["rows"]
    n = QUICK.requests
    assert rows and all(r["requests"] == n for r in rows)
    assert quick["knee"] in quick["rates"]
    means = mean_over_seeds(rows)
    light = means[("FIFO-LL", NOMINAL.name, min(quick["rates"]))]
    at_knee = means[("FIFO-LL", NOMINAL.name, quick["knee"])]
    assert at_knee["p99_ttft"] > light["p99_ttft"]  # load makes the tail grow
    assert quick["timing"]["sweep_runs"] == len(quick["rates"]) * len(QUICK.methods) * len(
        QUICK.seeds
    )


def _at_knee(quick: dict, method: str) -> dict:
    return mean_over_seeds(quick["rows"])[(method, NOMINAL.name, quick["knee"])]


def test_at_the_knee_quartz_serves_interactive_requests_first(quick: dict) -> None:
    ll, q = _at_knee(quick, "FIFO-LL"), _at_knee(quick, "QUARTZ")
    assert q["p99_chat"] < ll["p99_chat"]
    assert q["violation_chat"] <= ll["violation_chat"]


@pytest.mark.xfail(
    strict=True,
    reason="in our engine model a batch slot is held for the decode, not the prefill, so "
    "ordering the queue by predicted prefill reorders waits without shortening them: RAG "
    "prompts (and their clients, by β·u) wait until aging (λ) lets them go, and the "
    "overall P99 TTFT rises (docs/QUARTZ_PAPER.md)",
)
def test_at_the_knee_quartz_is_not_worse_than_fifo_ll_on_p99(quick: dict) -> None:
    ll, q = _at_knee(quick, "FIFO-LL"), _at_knee(quick, "QUARTZ")
    assert q["p99_ttft"] <= ll["p99_ttft"]


def test_forward_on_arrival_has_no_gateway_queue(quick: dict) -> None:
    """The paper's FIFO-LL: every request is sent on arrival, so it waits (if at all) in its
    engine's queue, never in the gateway's."""
    runs = [r for r in quick["rows"] if r["method"] == FORWARD_LL]
    assert runs and all(r["max_gateway_wait"] == 0.0 for r in runs)
    assert max(r["max_wait"] for r in runs) > 0.5  # loaded: the engines queue instead
    late = [r for r in quick["rows"] if r["method"] == "FIFO-LL"]
    assert max(r["max_gateway_wait"] for r in late) > 0.5


def test_the_wait_bound_cuts_the_longest_wait_the_paper_key_leaves(quick: dict) -> None:
    """QUARTZ's size order holds RAG prompts back at the knee; with a wait bound (θ 2.5 s,
    λ 1) the longest wait is FIFO-LL's order of magnitude, not QUARTZ's."""
    q, b = _at_knee(quick, "QUARTZ"), _at_knee(quick, BOUNDED)
    ll = _at_knee(quick, "FIFO-LL")
    assert b["max_wait"] < q["max_wait"] / 2
    assert b["max_wait"] <= 1.5 * ll["max_wait"]


def test_cli_writes_tables_and_plot(tmp_path, capsys) -> None:
    main(["--quick", "--workers", "1", "--requests", "200", "--out", str(tmp_path)])
    assert "Table 4" in capsys.readouterr().out
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    assert (tmp_path / "tables.md").read_text().startswith("Engine `fleetopt`")
