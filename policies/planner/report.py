"""Rendering a plan: the Table 3 layout as text, the per-γ sweep (`--explain`), and JSON.

Pure string and dict building; the CLI prints. JSON is plain data (ints, floats, strings,
None): infinities become None so that every consumer can parse it.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from policies.planner.fleet import FleetRow, Plan, PoolReport, cell_row
from policies.planner.live import LivePlan
from policies.planner.profile import HOURS_PER_YEAR

LABELS = {
    "homogeneous": "Homogeneous",
    "pool_routing": "Pool routing (PR)",
    "pr_cr": "PR + C&R (γ=1.5)",
    "fleetopt": "FleetOpt",
    "current": "Current fleet",
    "current_required": "Needed at current",
}


def _num(x: float | None) -> float | None:
    return None if x is None or math.isinf(x) or math.isnan(x) else x


def _ms(x: float) -> str:
    return "inf" if math.isinf(x) else f"{1e3 * x:.0f}"


def row_label(row: FleetRow) -> str:
    label = LABELS.get(row.method, row.method)
    if row.gamma is not None and row.method not in ("pool_routing", "pr_cr"):
        star = "*" if row.method == "fleetopt" else ""
        label += f" (γ{star}={row.gamma:.1f})"
    return label


def table(plan: Plan, extra: tuple[FleetRow, ...] = ()) -> str:
    """Table 3's layout: replicas per pool, their GPUs, annual cost (K$), savings; ρ and
    TTFT. The counts are replicas (what the paper calls "GPUs"): the footnote says what one
    is and how it is priced."""
    spec = plan.sweep.cal.spec
    g_s, g_l = spec.short_profile.gpus_per_replica, spec.long_profile.gpus_per_replica
    lines = [
        f"{plan.workload}: λ = {plan.rate:g} req/s, P99 TTFT SLO {1e3 * plan.slo_s:g} ms, "
        f"p_c = {plan.p_c:g}, baselines at B_short = {plan.b_ref:,}, "
        f"SLO check {plan.sweep.cal.options.slo_check}, "
        f"compressed requests priced {plan.sweep.cal.options.compressed_mass}",
        f"{'method':<26} {'B_short':>7} {'repl_s':>6} {'repl_l':>6} {'repl':>6} {'GPUs':>7} "
        f"{'K$/yr':>9} {'saving':>7} {'ρ_s':>6} {'ρ_l':>6} {'TTFT99 s/l ms':>14} {'SLO':>4}",
    ]
    for row in (*plan.rows, *extra):
        saving = "—" if row.method == "homogeneous" else f"{100 * plan.savings(row):.1f}%"
        ns = "—" if row.short is None else str(row.n_s)
        nl = "—" if row.long is None else str(row.n_l)
        rho_s = "—" if row.short is None else f"{row.short.rho:.3f}"
        rho_l = "—" if row.long is None else f"{row.long.rho:.3f}"
        ttft = "/".join(_ms(p.p99_ttft_s) if p else "—" for p in (row.short, row.long))
        b = "—" if row.b_short is None else f"{row.b_short:,}"
        gpus = row.n_s * g_s + row.n_l * g_l
        lines.append(
            f"{row_label(row):<26} {b:>7} {ns:>6} {nl:>6} {row.total:>6,} {gpus:>7,} "
            f"{row.annual_cost / 1e3:>9,.0f} {saving:>7} {rho_s:>6} {rho_l:>6} {ttft:>14} "
            f"{'ok' if row.slo_met else 'MISS':>4}"
        )
    lines += units_note(plan)
    return "\n".join(lines)


def units_note(plan: Plan) -> list[str]:
    """What the counts are: replicas of the profile, priced the paper's way (per GPU)."""
    sw = plan.sweep
    spec = sw.cal.spec
    pools = [("repl_s", spec.short_profile, sw.price_s), ("repl_l", spec.long_profile, sw.price_l)]
    if pools[0][1:] == pools[1][1:]:
        pools = [("repl_s, repl_l, repl", spec.short_profile, sw.price_s)]
    out = [""]
    for columns, profile, price in pools:
        g = profile.gpus_per_replica
        if g == 1:
            text = f"{columns}: replicas of one GPU of {profile.name}, at ${price:g}/h each."
        else:
            text = (
                f"{columns}: replicas, each one {g}-GPU tensor-parallel replica of "
                f"{profile.name} (its slots and step time), priced at ${price:g}/h: one GPU's "
                f'price, as the paper prices its "GPUs" (which are these replicas); the {g} GPUs '
                f"of a replica cost {g}× that."
            )
        out += textwrap.wrap(text, 100, subsequent_indent="  ")
    out.append(
        f"GPUs: replicas × GPUs per replica. K$/yr: replicas × $/h × {HOURS_PER_YEAR:,.0f} h."
    )
    return out


def slo_findings(row: FleetRow, slo_s: float) -> list[str]:
    """One sentence per pool of `row` that misses the SLO: by how much, and why."""
    out = []
    for name, pool in (("short", row.short), ("long", row.long)):
        if pool is None or pool.slo_met:
            continue
        ttft = pool.p99_ttft_s
        if pool.ttft_floor_s > slo_s:
            why = (
                f"its P99 request's prefill + first decode alone take "
                f"{1e3 * pool.ttft_floor_s:.0f} ms, which no GPU count shortens (sized by ρ_max)"
            )
        else:
            why = f"the P99 queue wait is {1e3 * pool.p99_wait_s:.0f} ms"
        over = "inf" if math.isinf(ttft) else f"{1e3 * (ttft - slo_s):.0f}"
        out.append(
            f"{LABELS.get(row.method, row.method)}: the {name} pool's P99 TTFT is "
            f"{_ms(ttft)} ms, {over} ms over the {1e3 * slo_s:g} ms SLO: {why}"
        )
    return out


def explain(plan: Plan) -> str:
    """The per-γ sweep at the optimum's boundary B*, and the best γ for every B swept."""
    sw = plan.sweep
    b_star = plan.fleetopt.b_short if plan.fleetopt.b_short is not None else plan.b_ref
    i = int((sw.cal.b == b_star).nonzero()[0][0])
    lines = [
        f"γ sweep at B_short = {b_star:,} (n_max short {int(sw.short.slots[i, 0])}, "
        f"long {int(sw.long.slots[i, 0])}); long pool recalibrated on (⌊γB⌋, ∞) per γ",
        _check_line(plan, i),
        f"{'γ':>4} {'⌊γB⌋':>7} {'α′':>7} {'λ_s':>8} {'λ_l':>8} {'E[S]_s':>8} {'E[S]_l':>8} "
        f"{'C²_l':>6} {'repl_s':>6} {'repl_l':>6} {'repl':>6} {'K$/yr':>9} {'bound by s/l':>20}",
    ]
    for j, g in enumerate(sw.cal.gammas):
        row = cell_row(sw, i, j, "cell")
        es = _mean_s(row.short)
        el = _mean_s(row.long)
        best = plan.fleetopt.gamma == float(g)
        mark = " ←" if best else ""
        bound = f"{row.short.binding if row.short else '—'}/{row.long.binding if row.long else '—'}"
        lines.append(
            f"{g:>4.1f} {int(sw.cal.lower[i, j]):>7,} {row.alpha or 0:>7.4f} "
            f"{row.short.rate if row.short else 0:>8.2f} {row.long.rate if row.long else 0:>8.2f} "
            f"{es:>8} {el:>8} {(f'{row.long.cv2:.2f}' if row.long else '—'):>6} "
            f"{row.n_s:>6} {row.n_l:>6} {row.total:>6,} {row.annual_cost / 1e3:>9,.0f} "
            f"{bound:>20}{mark}"
        )
    if len(sw.cal.b) > 1:
        lines += ["", "best γ per B_short candidate:",
                  f"{'B_short':>7} {'n_max':>6} {'F(B)':>7} {'γ*':>4} {'repl_s':>6} {'repl_l':>6} "
                  f"{'repl':>6} {'K$/yr':>9}"]  # fmt: skip
        for k, b in enumerate(sw.cal.b):
            j = sw.best_gamma_at(k)
            row = cell_row(sw, k, j, "cell")
            star = " *" if (k, j) == sw.best else ""
            lines.append(
                f"{int(b):>7,} {int(sw.short.slots[k, 0]):>6} {float(sw.cal.f_b[k]):>7.4f} "
                f"{float(sw.cal.gammas[j]):>4.1f} {row.n_s:>6} {row.n_l:>6} {row.total:>6,} "
                f"{row.annual_cost / 1e3:>9,.0f}{star}"
            )
    return "\n".join(lines)


def _check_line(plan: Plan, i: int) -> str:
    cal = plan.sweep.cal
    if cal.options.prefill_stat != "p99":
        return "SLO check: mean prefill per pool (prefill_stat mean)"
    if cal.options.slo_check == "paper":
        return "SLO check: Eq. 8 per pool, at the P99 request of what each pool holds"
    return (
        f"SLO check per class: the long class (B, ∞) at its P99 request, "
        f"{int(cal.class_p99[i]):,} tokens ({1e3 * float(cal.class_floor[i]):.0f} ms "
        f"prefill + first decode) at every γ; compressed requests at L = B"
    )


def _mean_s(pool: PoolReport | None) -> str:
    return "—" if pool is None else f"{pool.n_slots / pool.mu_gpu:.2f}"


def pool_dict(pool: PoolReport | None) -> dict[str, Any] | None:
    if pool is None:
        return None
    return {
        "gpus": pool.n,
        "rate": pool.rate,
        "slots_per_gpu": pool.n_slots,
        "mu_gpu": _num(pool.mu_gpu),
        "mean_service_s": _num(pool.n_slots / pool.mu_gpu) if pool.mu_gpu else None,
        "cv2": _num(pool.cv2),
        "utilisation": _num(pool.rho),
        "busy_slot_fraction": _num(pool.rho_load),
        "p99_wait_ms": _num(1e3 * pool.p99_wait_s),
        "ttft_floor_ms": _num(1e3 * pool.ttft_floor_s),
        "p99_ttft_ms": _num(1e3 * pool.p99_ttft_s),
        "bound_by": pool.binding,
    }


def row_dict(row: FleetRow, plan: Plan | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "method": row.method,
        "b_short": row.b_short,
        "gamma": row.gamma,
        "alpha_prime": row.alpha,
        "n_s": row.n_s,
        "n_l": row.n_l,
        "total_gpus": row.total,
        "cost_per_hr": row.cost_per_hr,
        "annual_cost_usd": row.annual_cost,
        "slo_met": row.slo_met,
        "short": pool_dict(row.short),
        "long": pool_dict(row.long),
    }
    if plan is not None:
        out["savings_vs_homogeneous"] = plan.savings(row)
    return out


def plan_dict(plan: Plan, explain_grid: bool = False) -> dict[str, Any]:
    """The whole plan as JSON-ready data."""
    sw = plan.sweep
    out: dict[str, Any] = {
        "schema": "fleetgate.plan/v1",
        "workload": plan.workload,
        "rate": plan.rate,
        "slo_ms": 1e3 * plan.slo_s,
        "p_c": plan.p_c,
        "b_short_ref": plan.b_ref,
        "hours_per_year": HOURS_PER_YEAR,
        "price_short_per_hr": sw.price_s,
        "price_long_per_hr": sw.price_l,
        "profiles": {
            "short": sw.cal.spec.short_profile.name,
            "long": sw.cal.spec.long_profile.name,
            "long_ctx": sw.cal.spec.long_ctx,
            # the counts (n_s, n_l, total_gpus) are replicas of these profiles, priced per
            # replica at price_*_per_hr (the paper's per-GPU price): see report.units_note
            "gpus_per_replica_short": sw.cal.spec.short_profile.gpus_per_replica,
            "gpus_per_replica_long": sw.cal.spec.long_profile.gpus_per_replica,
        },
        "options": sw.cal.options.describe(),
        "optimum": row_dict(plan.fleetopt, plan),
        "slo_findings": slo_findings(plan.fleetopt, plan.slo_s),
        "rows": [row_dict(r, plan) for r in plan.rows],
    }
    if explain_grid:
        out["grid"] = [
            row_dict(cell_row(sw, i, j, "cell"))
            for i in range(len(sw.cal.b))
            for j in range(len(sw.cal.gammas))
        ]
    return out


def live_dict(lp: LivePlan, explain_grid: bool = False) -> dict[str, Any]:
    """`GET /admin/plan`'s body: the recommendation next to the deployed configuration."""
    t = lp.traffic
    out = plan_dict(lp.plan, explain_grid)
    out["schema"] = "fleetgate.live_plan/v1"
    out["observed"] = {
        "window_s": t.window_s,
        "requests": t.requests,
        "arrival_rate": t.arrival_rate,
        "overflow": t.overflow,
        "input_fraction": t.input_fraction,
        "p_c_used": lp.p_c,
        "compression_borderline": t.compression_borderline,
        "compression_attempted": t.compression_attempted,
        "compression_succeeded": t.compression_succeeded,
    }
    out["recommended"] = row_dict(lp.plan.fleetopt, lp.plan)
    out["current"] = None if lp.current is None else row_dict(lp.current, lp.plan)
    out["current_required"] = (
        None if lp.current_required is None else row_dict(lp.current_required, lp.plan)
    )
    return out
