"""The token-pools paper's two experiments (§5.2–5.3), in the simulator, beside the paper's figures.

    python bench/token_pools_experiments.py --out out/token-pools     # PNGs and figures.json

Runs the shipped scenarios token-pools-exp1 (admission on), token-pools-exp1-off (admission
off) and token-pools-exp2, prints each key figure beside the paper's, and writes
exp1.png (Figures 2–4: queue depth, per-entitlement slot share, latency over time, both
runs side by side) and exp2.png (Figure 5's four panels: in-flight requests and pool
capacity; debt and priority; admissions and denials; effective admission delay).

Where the figures come from:
- queue depth: the engine's waiting queue (vLLM's num_requests_waiting), sampled;
- slot share: each entitlement's requests in the engine's running batch (from the
  records: admitted to the batch → finished) over the batch's size;
- latency: end-to-end (finish − arrival at the gateway), per request by arrival time;
  P99 TTFT per entitlement as the paper states its bound;
- debt, priority, in flight, pool capacity: the admitter's ledger view, sampled every
  `report.sample_interval` through `simulator.run`'s probe;
- a "low-priority denial" (Table 2) is a pool-contention refusal of a request within its
  baseline whose priority was not above the admission threshold; a refusal of a request
  above its own baseline into a full pool (a burst: bursts take only idle capacity) is
  counted apart;
- effective admission delay: the admitted attempt's arrival − the first attempt's arrival
  (clients retry a refusal after its Retry-After, capped at 2 s).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from policies.core import Core
from simulator.records import RequestRecord, Series
from simulator.run import RunResult, run
from simulator.scenario import Scenario, load

LOW_PRIORITY = "admission threshold"  # the ledger's message for a priority refusal

PAPER = {
    "exp1_guaranteed_p99_ttft_s": "< 1.2",
    "exp1_spot_429": "yes (count not given)",
    "exp1_queue_on": "0 (stays empty)",
    "exp1_queue_off": 34,
    "exp1_latency_off_s": "19+ (end of phase 2)",
    "exp2_copilot_ok": 700,
    "exp2_synth_ok": 381,
    "exp2_reports_ok": 60,
    "exp2_copilot_lowprio": 0,
    "exp2_synth_lowprio": 317,
    "exp2_reports_lowprio": 22,
    "exp2_copilot_peak_debt": 0.607,
    "exp2_synth_peak_debt": 0.775,
    "exp2_reports_peak_debt": 0.414,
    "exp2_w_copilot": 93.8,
    "exp2_w_synth": 20.3,
    "exp2_debt_recovery_s": "~50",
}


@dataclass
class LedgerTrace:
    """The admitter's ledger, sampled: per entitlement in flight, debt, priority."""

    pool: str
    t: list[float] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    threshold: list[float | None] = field(default_factory=list)
    in_flight: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    debt: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    priority: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def __call__(self, core: Core, now: float) -> None:
        ledger = core.admitter.ledger  # type: ignore[attr-defined]
        view = ledger.view(self.pool, now)
        self.t.append(now)
        self.slots.append(ledger.pools[self.pool].capacity.slots)
        self.threshold.append(view.threshold)
        for u in view.entitlements:
            name = u.definition.name
            self.in_flight[name].append(u.in_flight)
            self.debt[name].append(u.debt)
            self.priority[name].append(u.priority)


def _p99(xs: list[float]) -> float:
    return float(np.percentile(xs, 99)) if xs else float("nan")


def _running_by_client(records: list[RequestRecord], ts: np.ndarray) -> dict[str, np.ndarray]:
    """Requests of each client in an engine's running batch at each time in `ts`."""
    out: dict[str, np.ndarray] = {}
    for r in records:
        if r.scheduled is None or r.finish is None:
            continue
        row = out.setdefault(r.client, np.zeros(len(ts)))
        row += (ts >= r.scheduled) & (ts < r.finish)
    return dict(sorted(out.items()))


def run_exp1(scenario: Scenario, requests: int | None = None) -> tuple[RunResult, dict[str, Any]]:
    result = run(scenario, requests=requests)
    return result, exp1_figures(result.records, result.series.pools["main"].waiting)


def exp1_figures(records: Sequence[RequestRecord], waiting: Sequence[int]) -> dict[str, Any]:
    """Experiment 1's figures from the requests' records and the sampled engine queue
    (the simulator's or the live run's: bench/token_pools_live.py)."""
    recs = records
    ok = [r for r in recs if r.status == "ok" and r.first_token is not None]
    guaranteed = [r for r in ok if r.client.startswith("guaranteed")]
    refused: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in recs:
        if r.status == "rejected_429":
            refused[r.client][r.refusal or "?"] += 1
    late = [r for r in ok if r.finish is not None and 55.0 <= r.arrival < 60.0]
    return {
        "requests": len(recs),
        "guaranteed_p99_ttft_s": round(_p99([r.first_token - r.arrival for r in guaranteed]), 3),  # type: ignore[operator]
        "guaranteed_p99_latency_s": round(
            _p99([r.finish - r.arrival for r in guaranteed if r.finish is not None]), 3
        ),
        "max_queue": max(waiting) if waiting else 0,
        "latency_end_phase2_s": round(max((r.finish - r.arrival for r in late), default=0.0), 2),  # type: ignore[operator]
        "refused": {k: dict(v) for k, v in sorted(refused.items())},
        "admitted": {
            c: sum(1 for r in ok if r.client == c) for c in sorted({r.client for r in recs})
        },
        "other_statuses": dict(
            Counter(r.status for r in recs if r.status not in ("ok", "rejected_429"))
        ),
    }


def run_exp2(
    scenario: Scenario, requests: int | None = None
) -> tuple[RunResult, LedgerTrace, dict[str, Any]]:
    trace = LedgerTrace("qwen3-8b")
    result = run(scenario, requests=requests, probe=trace)
    return result, trace, exp2_figures(result.records, trace, scenario)


def exp2_figures(
    records: Sequence[RequestRecord], trace: LedgerTrace, scenario: Scenario
) -> dict[str, Any]:
    """Experiment 2's figures from the requests' records (one per attempt) and the sampled
    ledger (the simulator's or the live run's)."""
    recs = records
    clients = sorted({r.client for r in recs})
    t = np.asarray(trace.t)
    figures: dict[str, Any] = {"requests": len(recs), "attempts": len(recs)}
    for c in clients:
        mine = [r for r in recs if r.client == c]
        low = [
            r
            for r in mine
            if r.status == "rejected_429" and LOW_PRIORITY in (r.refusal_reason or "")
        ]
        burst = [
            r
            for r in mine
            if r.status == "rejected_429" and r.refusal == "pool_contention" and r not in low
        ]
        debt = np.asarray(trace.debt[c])
        after = t >= 120.0
        peak_after = int(np.argmax(debt * after)) if after.any() and len(debt) else 0
        recovered = next(
            (
                float(t[i] - 120.0)
                for i in range(peak_after, len(debt))
                if t[i] >= 120.0 and debt[i] < 0.05
            ),
            None,
        )
        ok = [r for r in mine if r.status == "ok"]
        delay = [r.arrival - r.first_arrival for r in ok]
        figures[c] = {
            "ok": len(ok),
            "low_priority_denials": len(low),
            "burst_denials": len(burst),
            "other_refusals": sum(1 for r in mine if r.status == "rejected_429")
            - len(low)
            - len(burst),
            "gave_up": sum(
                1
                for r in mine
                if r.status == "rejected_429" and r.attempt >= (_max_attempts(scenario, c) or 1)
            ),
            "peak_debt": round(float(debt.max()), 3) if len(debt) else 0.0,
            "debt_below_0.05_after_recovery_s": recovered,
            "priority_at_start": round(trace.priority[c][1], 1)
            if len(trace.priority[c]) > 1
            else None,
            "peak_priority": round(max(trace.priority[c]), 1) if trace.priority[c] else None,
            "p99_ttft_s": round(
                _p99([r.first_token - r.arrival for r in ok if r.first_token is not None]), 3
            ),
            "p99_admission_delay_s": round(_p99(delay), 3),
            "errors": sum(1 for r in mine if r.status not in ("ok", "rejected_429")),
        }
    return figures


def _max_attempts(scenario: Scenario, client: str) -> int | None:
    for t in scenario.workload.tenants:
        if t.name == client:
            return t.retry.max_attempts
    return None


# --- plots ----------------------------------------------------------------------------
class Run(Protocol):
    """What the plots read of a run: the simulator's `RunResult`, or a live run's."""

    @property
    def series(self) -> Series: ...

    @property
    def records(self) -> list[RequestRecord]: ...


def plot_exp1(on: Run, off: Run, path: Path, label: str = "simulated") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(13, 10), sharex=True)
    for col, (result, title) in enumerate(((on, "token pools"), (off, "admission off"))):
        s = result.series
        p = s.pools["main"]
        ax = axes[0][col]
        ax.plot(s.t, p.running, label="running")
        ax.plot(s.t, p.waiting, label="waiting (engine queue)")
        refused = sorted(r.arrival for r in result.records if r.status == "rejected_429")
        if refused:
            ax.plot(refused, np.arange(1, len(refused) + 1), ":", label="429s (cumulative)")
        ax.set_title(f"Fig. 2 — queue depth, {title} ({label})")
        ax.set_ylabel("requests")
        ax.legend(loc="upper left", fontsize=8)
        ts = np.asarray(s.t)
        shares = _running_by_client(result.records, ts)
        total = np.maximum(sum(shares.values()), 1)  # type: ignore[arg-type]
        ax = axes[1][col]
        ax.stackplot(ts, *[v / total * 100 for v in shares.values()], labels=list(shares))
        ax.set_ylim(0, 105)
        ax.set_ylabel("slot share (%)")
        ax.set_title(f"Fig. 4 — slot share by entitlement, {title}")
        ax.legend(loc="lower left", fontsize=8)
        ax = axes[2][col]
        for client in shares:
            xs = [r.arrival for r in result.records if r.client == client and r.finish]
            ys = [r.finish - r.arrival for r in result.records if r.client == client and r.finish]  # type: ignore[operator]
            ax.scatter(xs, ys, s=6, label=client)
        ax.axhline(1.2, linestyle="--", linewidth=0.8, color="grey")
        ax.set_ylabel("end-to-end latency (s)")
        ax.set_xlabel("time (s)")
        ax.set_title(f"Fig. 3 — latency, {title}")
        ax.legend(loc="upper left", fontsize=8)
        for row in axes:
            for x in (30, 60):
                row[col].axvline(x, color="k", linewidth=0.5, alpha=0.4)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_exp2(result: Run, trace: LedgerTrace, path: Path, label: str = "simulated") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.asarray(trace.t)
    clients = sorted(trace.debt)
    fig, axes = plt.subplots(4, 1, figsize=(11, 13), sharex=True)
    ax = axes[0]
    for c in clients:
        ax.plot(t, trace.in_flight[c], label=c)
    ax.plot(t, [sum(x) for x in zip(*trace.in_flight.values(), strict=True)], "k", label="total")
    ax.plot(t, trace.slots, "k--", label="pool capacity (slots)")
    ax.set_ylabel("in flight")
    ax.set_title(f"(1) in-flight requests and pool capacity ({label})")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[1]
    twin = ax.twinx()
    for c in clients:
        line = ax.plot(t, trace.debt[c], label=f"debt {c}")[0]
        twin.plot(t, trace.priority[c], ":", color=line.get_color(), label=f"w {c}")
    ax.set_ylabel("debt d_e (solid)")
    twin.set_ylabel("priority w_e (dotted)")
    ax.set_title("(2) service debt and priority weight")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    bins = np.arange(0, (t[-1] if len(t) else 300) + 5, 5.0)
    for c in clients:
        ok = [r.arrival for r in result.records if r.client == c and r.status == "ok"]
        low = [
            r.arrival
            for r in result.records
            if r.client == c and LOW_PRIORITY in (r.refusal_reason or "")
        ]
        h_ok, _ = np.histogram(ok, bins)
        h_low, _ = np.histogram(low, bins)
        line = ax.plot(bins[:-1], h_ok / 5.0, label=f"admitted {c}")[0]
        ax.plot(bins[:-1], h_low / 5.0, "--", color=line.get_color(), label=f"low-prio denied {c}")
    ax.set_ylabel("per second (5 s bins)")
    ax.set_title("(3) admissions and low-priority denials")
    ax.legend(loc="upper right", fontsize=7, ncol=2)
    ax = axes[3]
    for c in clients:
        ok = [r for r in result.records if r.client == c and r.status == "ok"]
        ax.scatter(
            [r.first_arrival for r in ok], [r.arrival - r.first_arrival for r in ok], s=6, label=c
        )
    ax.set_ylabel("admission delay (s)")
    ax.set_xlabel("time (s)")
    ax.set_title("(4) effective admission delay (first attempt → admitted attempt)")
    ax.legend(loc="upper right", fontsize=8)
    for a in axes:
        for x in (30, 120, 210):
            a.axvline(x, color="k", linewidth=0.5, alpha=0.4)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def figure_rows(
    f_on: dict[str, Any], f_off: dict[str, Any], f2: dict[str, Any]
) -> list[tuple[str, Any, Any]]:
    """(figure, ours, paper) for the printed table."""
    rows: list[tuple[str, Any, Any]] = [
        (
            "Exp 1: guaranteed P99 TTFT, admission on (s)",
            f_on["guaranteed_p99_ttft_s"],
            PAPER["exp1_guaranteed_p99_ttft_s"],
        ),
        ("Exp 1: guaranteed P99 latency, admission on (s)", f_on["guaranteed_p99_latency_s"], "—"),
        ("Exp 1: spot-b refused (429)", f_on["refused"].get("spot-b", {}), PAPER["exp1_spot_429"]),
        (
            "Exp 1: guaranteed refused (429, own limit)",
            {k: v for k, v in f_on["refused"].items() if k != "spot-b"},
            "never within limits",
        ),
        ("Exp 1: max engine queue, on", f_on["max_queue"], PAPER["exp1_queue_on"]),
        ("Exp 1: max engine queue, off", f_off["max_queue"], PAPER["exp1_queue_off"]),
        ("Exp 1: guaranteed P99 TTFT, off (s)", f_off["guaranteed_p99_ttft_s"], "—"),
        (
            "Exp 1: latency at end of phase 2, off (s)",
            f_off["latency_end_phase2_s"],
            PAPER["exp1_latency_off_s"],
        ),
    ]
    for c in ("copilot", "synth", "reports"):
        g = f2[c]
        rows += [
            (f"Exp 2: {c} successful", g["ok"], PAPER[f"exp2_{c}_ok"]),
            (
                f"Exp 2: {c} low-priority denials",
                g["low_priority_denials"],
                PAPER[f"exp2_{c}_lowprio"],
            ),
            (f"Exp 2: {c} burst denials (above own baseline)", g["burst_denials"], "—"),
            (f"Exp 2: {c} peak debt", g["peak_debt"], PAPER[f"exp2_{c}_peak_debt"]),
            (f"Exp 2: {c} P99 admission delay (s)", g["p99_admission_delay_s"], "—"),
        ]
    rows += [
        (
            "Exp 2: w_copilot / w_synth at start",
            f"{f2['copilot']['priority_at_start']} / {f2['synth']['priority_at_start']}",
            f"{PAPER['exp2_w_copilot']} / {PAPER['exp2_w_synth']}",
        ),
        (
            "Exp 2: synth debt < 0.05 after recovery (s)",
            f2["synth"]["debt_below_0.05_after_recovery_s"],
            PAPER["exp2_debt_recovery_s"],
        ),
    ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/token-pools", help="directory for PNGs and JSON")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from simulator.progress import bar

    with bar(3, "token-pools experiments", "run") as runs:  # drawn at a terminal only
        runs.set_postfix_str("exp1, token pools")
        on, f_on = run_exp1(load("token-pools-exp1"))
        runs.update(1)
        runs.set_postfix_str("exp1, admission off")
        off, f_off = run_exp1(load("token-pools-exp1-off"))
        runs.update(1)
        plot_exp1(on, off, out / "exp1.png")
        runs.set_postfix_str("exp2")
        res2, trace, f2 = run_exp2(load("token-pools-exp2"))
        runs.update(1)
    plot_exp2(res2, trace, out / "exp2.png")

    rows = figure_rows(f_on, f_off, f2)
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'simulated':<28}  paper")
    for name, ours, paper in rows:
        print(f"{name:<{width}}  {json.dumps(ours):<28}  {paper}")
    (out / "figures.json").write_text(
        json.dumps({"exp1_on": f_on, "exp1_off": f_off, "exp2": f2, "paper": PAPER}, indent=2)
    )
    print(f"wrote {out / 'exp1.png'}, {out / 'exp2.png'}, {out / 'figures.json'}")


if __name__ == "__main__":
    main()
