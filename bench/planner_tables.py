"""FleetOpt Tables 3, 5 and 6: ours beside the paper's, and what each open option does.

    python bench/planner_tables.py [--data-dir DIR] [--no-sensitivity]

Prints (1) Table 3 with the paper-reproducing options (PAPER), with exact moments, and with
the defaults (compressed requests priced as served, options.py), (2) Table 5's
analytical utilisation (and the simulator's measured one when `simulator/` is present, see
bench/planner_sim.py), (3) Table 6, (4) §7.4's P99 TTFT figures under the options that
bear on them, (5) Table 3 totals under each single-option change, (6) Algorithm 1's full
(B, γ) sweep per workload. Numbers come from the paper-input CDFs in simulator/data/.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetgate.plan import load_workload
from policies.planner import DEFAULT, EXACT, PAPER, LengthCdf, PlannerOptions, plan
from policies.planner import paper as ref
from policies.planner.fleet import Plan


def _fleet(ns: int, nl: int) -> str:
    return f"{ns}+{nl}={ns + nl:,}"


def _plans(cdfs: dict[str, LengthCdf], opts: PlannerOptions) -> dict[str, Plan]:
    return {
        c.workload: plan(cdfs[c.workload], ref.RATE, ref.SLO_S, c.p_c, c.b_short, options=opts)
        for c in ref.TABLE3
    }


def table3(cdfs: dict[str, LengthCdf]) -> None:
    paper_opts = _plans(cdfs, PAPER)
    exact = _plans(cdfs, replace(PAPER, moments="exact"))
    default = _plans(cdfs, DEFAULT)
    print("Table 3 — λ = 1,000 req/s, SLO 500 ms, ρ_max 0.85 (GPUs n_s+n_l=total, K$/yr); "
          "default = compressed requests priced as served")  # fmt: skip
    print(f"{'workload':<13} {'method':<20} {'paper':>18} {'ours (paper opts)':>18} "
          f"{'Δ':>4} {'ours (exact)':>18} {'Δ':>5} {'ours (default)':>18} {'Δ':>5} "
          f"{'K$ paper/ours':>16}")  # fmt: skip
    for c in ref.TABLE3:
        p, e, d = paper_opts[c.workload], exact[c.workload], default[c.workload]
        theirs = [(0, c.homogeneous), c.pool_routing, c.pr_cr, c.fleetopt]
        names = ["Homogeneous", "Pool routing", "PR + C&R (γ=1.5)",
                 f"FleetOpt γ*={c.gamma_star}/{p.fleetopt.gamma}/{e.fleetopt.gamma}/"
                 f"{d.fleetopt.gamma}"]  # fmt: skip
        for k, (row, erow, drow) in enumerate(zip(p.rows, e.rows, d.rows, strict=True)):
            t = theirs[k]
            tp = f"{t[1]:,}" if k == 0 else _fleet(*t)
            op = f"{row.total:,}" if k == 0 else _fleet(row.n_s, row.n_l)
            ex = f"{erow.total:,}" if k == 0 else _fleet(erow.n_s, erow.n_l)
            df = f"{drow.total:,}" if k == 0 else _fleet(drow.n_s, drow.n_l)
            print(f"{c.workload:<13} {names[k]:<20} {tp:>18} {op:>18} "
                  f"{row.total - sum(t):>+4} {ex:>18} {erow.total - sum(t):>+5} "
                  f"{df:>18} {drow.total - sum(t):>+5} "
                  f"{c.annual_kusd[k]:>7,}/{row.annual_cost / 1e3:<8,.0f}")  # fmt: skip
    print()


def table5(cdfs: dict[str, LengthCdf]) -> None:
    plans = _plans(cdfs, PAPER)
    print("Table 5 — analytical utilisation ρ_ana of the pool-routing fleets")
    print(f"{'workload':<13} {'pool':<6} {'n':>6} {'paper ρ_ana':>12} {'ours ρ_ana':>11} "
          f"{'paper ρ̂ DES':>12}")  # fmt: skip
    for c in ref.TABLE3:
        pr = plans[c.workload].pool_routing
        for k, (name, pool) in enumerate((("short", pr.short), ("long", pr.long))):
            assert pool is not None
            print(f"{c.workload:<13} {name:<6} {pool.n:>6} "
                  f"{ref.TABLE5_RHO_ANA[c.workload][k]:>12.3f} {pool.rho:>11.3f} "
                  f"{ref.TABLE5_RHO_DES[c.workload][k]:>12.3f}")  # fmt: skip
    print()


def table6(cdfs: dict[str, LengthCdf]) -> None:
    cdf = cdfs[ref.TABLE6_WORKLOAD]
    print(
        "Table 6 — agent-heavy, B_short 8,192, p_c 0.75: paper / ours (paper opts) / ours (exact)"
    )
    print(f"{'λ':>6} {'homogeneous':>20} {'pool routing':>20} {'FleetOpt (γ*)':>32}")
    for r in ref.TABLE6:
        p = plan(cdf, r.rate, ref.SLO_S, ref.TABLE6_P_C, ref.TABLE6_B_SHORT, options=PAPER)
        e = plan(cdf, r.rate, ref.SLO_S, ref.TABLE6_P_C, ref.TABLE6_B_SHORT, options=EXACT)
        fo = (f"{r.fleetopt}({r.gamma_star}) / {p.fleetopt.total}({p.fleetopt.gamma}) / "
              f"{e.fleetopt.total}({e.fleetopt.gamma})")  # fmt: skip
        print(f"{r.rate:>6g} {f'{r.homogeneous} / {p.homogeneous.total} / {e.homogeneous.total}':>20} "
              f"{f'{r.pool_routing} / {p.pool_routing.total} / {e.pool_routing.total}':>20} {fo:>32}")  # fmt: skip
    print()


def ttft(cdfs: dict[str, LengthCdf]) -> None:
    print("§7.4 — P99 TTFT of the pool-routing fleets, short/long ms (W99 + TTFT floor)")
    variants = {
        "Eq. 8: P99 prefill, solo (default)": PAPER,
        "P99 prefill, full batch": replace(PAPER, ttft_batch="full"),
        "mean prefill, solo (reference's report)": replace(PAPER, prefill_stat="mean"),
    }
    print(f"{'workload':<13} {'paper':>9} " + " ".join(f"{k:>40}" for k in variants))
    for c in ref.TABLE3:
        cells = []
        for opts in variants.values():
            pr = plan(
                cdfs[c.workload], ref.RATE, ref.SLO_S, c.p_c, c.b_short, options=opts
            ).pool_routing
            assert pr.short is not None and pr.long is not None
            cells.append(f"{1e3 * pr.short.p99_ttft_s:.0f}/{1e3 * pr.long.p99_ttft_s:.0f}")
        s, lg = ref.PR_TTFT_MS[c.workload]
        print(f"{c.workload:<13} {f'{s:.0f}/{lg:.0f}':>9} " + " ".join(f"{x:>40}" for x in cells))
    print()


def sensitivity(cdfs: dict[str, LengthCdf]) -> None:
    print("Option sensitivity — Table 3 totals (homogeneous / PR / PR+C&R / FleetOpt γ*)")
    variants: dict[str, PlannerOptions] = {
        "paper options (PAPER)": PAPER,
        "compressed_mass=band (the default)": DEFAULT,
        "moments=exact": replace(PAPER, moments="exact"),
        "mc_seed=1": replace(PAPER, mc_seed=1),
        "mc_seed=2": replace(PAPER, mc_seed=2),
        "mc_draws=30000": replace(PAPER, mc_draws=30_000),
        "h_scaling=none (Eq. 3 as printed)": replace(PAPER, h_scaling="none"),
        "input_fraction=0.9 (raw Azure)": replace(PAPER, input_fraction=0.9),
        "interpolation=step": replace(PAPER, interpolation="step"),
        "long_edge=exclusive": replace(PAPER, long_edge="exclusive"),
        "compressed_mass=at_boundary": replace(PAPER, compressed_mass="at_boundary"),
        "uncompressed_band=long": replace(PAPER, uncompressed_band="long"),
        "ttft_batch=full": replace(PAPER, ttft_batch="full"),
    }
    paper_cells = {c.workload: (c.homogeneous, sum(c.pool_routing), sum(c.pr_cr),
                                sum(c.fleetopt), c.gamma_star) for c in ref.TABLE3}  # fmt: skip
    print(f"{'variant':<36} " + " ".join(f"{c.workload:>32}" for c in ref.TABLE3))
    print(f"{'paper':<36} " + " ".join(
        f"{'{} / {} / {} / {} ({})'.format(*paper_cells[c.workload]):>32}" for c in ref.TABLE3))  # fmt: skip
    for name, opts in variants.items():
        cells = [
            f"{p.homogeneous.total} / {p.pool_routing.total} / {p.pr_cr.total} / "
            f"{p.fleetopt.total} ({p.fleetopt.gamma})"
            for p in _plans(cdfs, opts).values()
        ]
        print(f"{name:<36} " + " ".join(f"{x:>32}" for x in cells))
    print()


def full_sweep(cdfs: dict[str, LengthCdf]) -> None:
    print("Algorithm 1 over every feasible B_short (the paper fixes B per workload in Table 3)")
    print(f"{'workload':<13} {'options':<8} {'B*':>7} {'γ*':>4} {'n_s+n_l':>14} {'K$/yr':>8} "
          f"{'vs paper B':>11} {'SLO':>5}")  # fmt: skip
    for c in ref.TABLE3:
        for label, opts in (("paper", PAPER), ("default", DEFAULT), ("exact", EXACT)):
            p = plan(cdfs[c.workload], ref.RATE, ref.SLO_S, c.p_c, options=opts)
            fixed = plan(cdfs[c.workload], ref.RATE, ref.SLO_S, c.p_c, c.b_short, options=opts)
            fo = p.fleetopt
            gain = 1 - fo.cost_per_hr / fixed.fleetopt.cost_per_hr
            print(f"{c.workload:<13} {label:<8} {fo.b_short:>7,} {fo.gamma:>4} "
                  f"{_fleet(fo.n_s, fo.n_l):>14} {fo.annual_cost / 1e3:>8,.0f} "
                  f"{-100 * gain:>+10.1f}% {'ok' if fo.slo_met else 'MISS':>5}")  # fmt: skip
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir")
    ap.add_argument("--no-sensitivity", action="store_true")
    args = ap.parse_args()
    cdfs = {c.workload: load_workload(c.workload, args.data_dir)[0] for c in ref.TABLE3}
    table3(cdfs)
    table5(cdfs)
    table6(cdfs)
    ttft(cdfs)
    if not args.no_sensitivity:
        sensitivity(cdfs)
        full_sweep(cdfs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
