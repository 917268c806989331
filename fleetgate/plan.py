"""`fleetgate plan`: size the cheapest two-pool fleet for a workload (FleetOpt, §6).

    fleetgate plan --workload azure|lmsys|agent|PATH --rate 1000 --slo-ms 500
                   [--b-short N | --b-candidates N,N,...] [--b-ref N] [--pc X] [--phi X]
                   [--slo-check per_class|paper] [--strict] [--explain] [--json]
    fleetgate plan --table3 | --table6          # the paper's tables, ours beside theirs
    fleetgate plan --from-gateway URL [--admin-key KEY]   # the gateway's observed traffic
    fleetgate plan --histogram FILE             # the same, from a saved histogram
    fleetgate plan --pd --gpus 6 [--prompt-tokens N --output-tokens N ...]  # a kind: pd
                   pool's prefill:decode split (or --pd --rate λ: its size; docs/PD.md)

Named workloads are the paper-input CDFs (`fleetgate.workload_cdf/v1` files) found in
--data-dir, $FLEETGATE_DATA_DIR, or the copies shipped in simulator/data/;
PATH is any file of that schema. Without --b-short every hardware-feasible breakpoint with
F(B) ≤ 0.999 (or each of --b-candidates) is swept (Algorithm 1); with it only γ is. The
PR and PR + C&R baselines are read at --b-ref (default: the file's paper B_short, else the
cheapest pool-routing boundary), never at the optimum's B*. --pc defaults to the file's
paper p_c, else 1.

The SLO check (--slo-check) is per request class by default: short requests at the P99 of
[1, B], compressed ones at L = B, the long class (B, ∞) at its own P99 request, so a larger
γ never fails a plan by draining the long pool; `paper` is Eq. 8 per pool, as printed.

--from-gateway fetches `GET URL/admin/plan/histogram` with `Authorization: Bearer KEY`
(--admin-key or $FLEETGATE_ADMIN_KEY); the body is a `fleetgate.plan_histogram/v1`
document (shape in policies/planner/live.py). The answer puts the recommended fleet and
(B_short, γ) next to the deployed configuration and its predicted cost.

Compressed requests load the short pool as C&R serves them (--compressed-mass band, the
default): prompt cut to T_c = B − L_out, original output. The paper's Algorithm 1 prices
them as ordinary short requests (--compressed-mass restricted), which under-sizes the short
pool at γ > 1 (on Azure at B 4,096, γ 2: 48 short GPUs where 91 are needed at λ 1,000).
--table3 / --table6 use the paper's choice and reproduce its cells.

Every modelling option of policies.planner.options is a flag (--moments, --h-scaling, ...);
the defaults are policies.planner.DEFAULT (the tables': PAPER). An SLO no fleet can meet (e.g. agent-heavy's long
prompts, whose prefill alone exceeds 500 ms) is a finding: the plan is printed with what
misses and by how much. Exit status: 0 planned (SLO met or not), 1 the SLO is missed and
--strict was given, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, TypedDict

from policies.planner import (
    BUILTIN_PROFILES,
    DEFAULT,
    PAPER,
    FleetSpec,
    HardwareProfile,
    LengthCdf,
    PlannerOptions,
    live_plan,
    parse_histogram,
    plan,
)
from policies.planner import paper as ref
from policies.planner.fleet import Plan
from policies.planner.options import CHOICES
from policies.planner.pd import PdWorkload, RoleEngine
from policies.planner.pd import size as pd_size
from policies.planner.pd import split as pd_split
from policies.planner.profile import profile_from_dict
from policies.planner.report import explain, live_dict, plan_dict, slo_findings, table

NAMED = {"azure": "azure_2023", "lmsys": "lmsys_chat_1m", "agent": "agent_heavy"}
OPTION_HELP = {
    "slo_check": "per_class (default): each request judged in its class — short at the P99 "
    "of [1, B], compressed at L = B, the long class (B, ∞) at its own P99 at every γ; "
    "paper: Eq. 8 per pool, at the P99 of what each pool holds after compression",
    "slo_budget": "eq8 (default): P99 wait ≤ SLO − prefill − first decode; wait_only: "
    "P99 wait ≤ SLO (the reference simulator)",
    "prefill_stat": "the prefill in the TTFT floor: the P99 request's (default) or the mean",
    "compressed_mass": "band (default): compressed requests in the short pool as C&R serves "
    "them, prompt cut to B − L_out, original output; restricted: priced as short requests "
    "(Algorithm 1 step 5, the paper's tables and --table3/--table6); at_boundary: all at "
    "L_total = B",
}
PAPER_PROFILE = "a100_80gb_llama3_70b"


def data_dir(explicit: str | None = None) -> Path:
    """Where the paper-input CDFs live: --data-dir, else $FLEETGATE_DATA_DIR, else the
    copies the project ships (simulator/data/, provenance in its README.md)."""
    if explicit:
        return Path(explicit)
    from simulator.lengths import data_dir as shipped

    return shipped()


def load_workload(name: str, directory: str | None = None) -> tuple[LengthCdf, dict[str, Any]]:
    """A workload CDF and its whole JSON document, by short name, file stem or path."""
    path = Path(name)
    if not path.is_file():
        stem = NAMED.get(name, name)
        path = data_dir(directory) / f"{stem}.json"
        if not path.is_file():
            raise ValueError(
                f"unknown workload {name!r}: neither a named workload ({', '.join(NAMED)}, or "
                f"a file stem in {path.parent}) nor a fleetgate.workload_cdf/v1 JSON file"
            )
    doc = json.loads(path.read_text())
    points = doc.get("points", doc) if isinstance(doc, dict) else doc
    return LengthCdf.from_points(points, str(doc.get("name", path.stem))), doc


def load_profile(name: str) -> HardwareProfile:
    """A built-in profile by name or by a prefix only it has (`h100`), else a JSON file."""
    if name in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[name]
    path = Path(name)
    if not path.is_file():
        matches = [known for known in BUILTIN_PROFILES if known.startswith(name.lower())]
        if len(matches) == 1:
            return BUILTIN_PROFILES[matches[0]]
        raise ValueError(
            f"unknown GPU profile {name!r}: neither a built-in profile "
            f"({', '.join(BUILTIN_PROFILES)}) nor a file (a fleetgate.gpu_profile/v1 JSON "
            f"document, or a JSON object of HardwareProfile's fields)"
        )
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return profile_from_dict(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"GPU profile file {name}: {exc}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetgate plan",
        description="FleetOpt: the minimum-cost two-pool fleet.",
        epilog="An SLO no fleet can meet is reported (which pool, by how much, why) with "
        "exit 0; --strict exits 1 then. Exit 2: usage or input error.",
    )
    src = p.add_argument_group("input")
    src.add_argument("--workload", help="azure | lmsys | agent | a workload_cdf/v1 JSON path")
    src.add_argument("--from-gateway", metavar="URL", help="plan on a gateway's observed traffic")
    src.add_argument("--admin-key", help="admin key for --from-gateway ($FLEETGATE_ADMIN_KEY)")
    src.add_argument("--histogram", metavar="FILE", help="a saved plan_histogram/v1 document")
    src.add_argument("--data-dir", help="directory of the named workload files")
    src.add_argument("--table3", action="store_true", help="reproduce the paper's Table 3")
    src.add_argument("--table6", action="store_true", help="reproduce the paper's Table 6")
    q = p.add_argument_group("question")
    q.add_argument("--rate", type=float, default=1000.0, help="arrival rate λ, req/s")
    q.add_argument("--slo-ms", type=float, default=500.0, help="P99 TTFT target, ms")
    q.add_argument("--b-short", type=int, help="fix B_short (else sweep the feasible set)")
    q.add_argument("--b-candidates", type=_int_list, metavar="N,N,...",
                   help="sweep these B_short values instead of the feasible set")  # fmt: skip
    q.add_argument("--b-ref", type=int, metavar="N",
                   help="B_short of the PR baselines when sweeping (default: the file's "
                        "paper B_short, else the cheapest pool-routing B)")  # fmt: skip
    q.add_argument("--pc", type=float, help="compressibility p_c (default: the file's, else 1)")
    q.add_argument("--phi", type=float, help="long/short GPU cost ratio φ (default: prices)")
    q.add_argument("--profile", default=PAPER_PROFILE,
                   help=f"short-pool GPU profile: a built-in name ({', '.join(BUILTIN_PROFILES)}; "
                        f"a unique prefix such as h100 will do) or a JSON file; default "
                        f"{PAPER_PROFILE}")  # fmt: skip
    q.add_argument("--long-profile", help="long-pool GPU profile (default: --profile)")
    q.add_argument("--long-ctx", type=int, default=65536, help="long pool context, tokens")
    q.add_argument("--observed-split", action="store_true",
                   help="live: use the window's observed input fraction")  # fmt: skip
    m = p.add_argument_group(
        "modelling options (defaults: policies.planner.DEFAULT; --table3/--table6: PAPER)"
    )
    m.add_argument("--exact", action="store_true", help="shorthand for --moments exact")
    for name, allowed in CHOICES.items():
        m.add_argument(f"--{name.replace('_', '-')}", choices=allowed, help=OPTION_HELP.get(name))
    m.add_argument("--mc-draws", type=int)
    m.add_argument("--mc-seed", type=int)
    m.add_argument("--input-fraction", type=float)
    m.add_argument("--fixed-output-tokens", type=int)
    m.add_argument("--rho-max", type=float)
    m.add_argument("--min-pool-rate", type=float)
    pd = p.add_argument_group(
        "pd pools", "--pd: a prefill:decode split instead (policies/planner/pd.py; docs/PD.md)"
    )
    pd.add_argument("--pd", action="store_true", help="size a kind: pd pool")
    pd.add_argument("--gpus", type=int, help="split this many workers (else size for --rate)")
    pd.add_argument("--prompt-tokens", type=float, default=128.0, help="mean prompt, tokens")
    pd.add_argument("--output-tokens", type=float, default=224.0, help="mean answer, tokens")
    pd.add_argument("--itl-ms", type=float, help="ITL target: caps the decode batch")
    pd.add_argument("--rho", type=float, default=0.8, help="utilisation cap when sizing")
    pd.add_argument("--prefill-token-s", type=float, default=0.00017)
    pd.add_argument("--prefill-budget", type=int, default=2048, help="prefill step tokens")
    pd.add_argument("--prefill-seqs", type=int, default=32, help="prefill max_num_seqs")
    pd.add_argument("--prefill-w", type=float, default=0.008)
    pd.add_argument("--prefill-h", type=float, default=0.00065)
    pd.add_argument("--decode-w", type=float, default=0.008)
    pd.add_argument("--decode-h", type=float, default=0.00001)
    pd.add_argument("--decode-seqs", type=int, default=256, help="decode max_num_seqs")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="JSON instead of a table")
    out.add_argument("--explain", action="store_true", help="print the per-γ sweep")
    out.add_argument("--strict", action="store_true",
                     help="exit 1 when the recommended fleet misses the SLO")  # fmt: skip
    return p


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("an empty list of B_short candidates")
    return values


def options_from(args: argparse.Namespace, base: PlannerOptions = DEFAULT) -> PlannerOptions:
    """`base` with every modelling flag the user gave."""
    changes: dict[str, Any] = {}
    for name in (*CHOICES, "mc_draws", "mc_seed", "input_fraction", "fixed_output_tokens",
                 "rho_max", "min_pool_rate"):  # fmt: skip
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    if args.exact:
        changes.setdefault("moments", "exact")
    return replace(base, **changes)


def spec_from(args: argparse.Namespace) -> FleetSpec:
    short = load_profile(args.profile)
    long = load_profile(args.long_profile) if args.long_profile else short
    return FleetSpec(short, long, args.long_ctx)


def fetch_histogram(url: str, key: str | None) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.get(url.rstrip("/") + "/admin/plan/histogram", headers=headers, timeout=10.0)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        raise OSError(f"cannot fetch the histogram from {url}: {exc}") from exc
    body: dict[str, Any] = resp.json()
    return body


def _run_live(args: argparse.Namespace, opts: PlannerOptions, spec: FleetSpec) -> int:
    if args.histogram:
        doc = json.loads(Path(args.histogram).read_text())
    else:
        doc = fetch_histogram(
            args.from_gateway, args.admin_key or os.environ.get("FLEETGATE_ADMIN_KEY")
        )
    traffic = parse_histogram(doc)
    lp = live_plan(traffic, args.slo_ms / 1e3, args.pc if args.pc is not None else 1.0,
                   spec=spec, options=opts, observed_split=args.observed_split,
                   phi=args.phi)  # fmt: skip
    if args.json:
        print(json.dumps(live_dict(lp, args.explain), indent=2))
    else:
        extra = tuple(r for r in (lp.current, lp.current_required) if r is not None)
        print(f"observed: {traffic.requests:,} requests in {traffic.window_s:g} s "
              f"(λ = {traffic.arrival_rate:.2f} req/s), p_c used {lp.p_c:.2f}")  # fmt: skip
        print(table(lp.plan, extra))
        if args.explain:
            print("\n" + explain(lp.plan))
        _print_findings(lp.plan)
    return _exit(lp.plan, args.strict)


# One Table 3 row's fleets: homogeneous total, (n_s, n_l) for pool routing, PR + C&R and
# FleetOpt, then FleetOpt's γ (None only if the plan has no compressed band).
Table3Fleets = tuple[int, tuple[int, int], tuple[int, int], tuple[int, int], float | None]


class _Table3Row(TypedDict):
    workload: str
    b_short: int
    p_c: float
    ours: Table3Fleets
    paper: Table3Fleets
    plan: dict[str, Any]  # plan_dict's JSON


def _table3(args: argparse.Namespace, opts: PlannerOptions, spec: FleetSpec) -> int:
    results: list[_Table3Row] = []
    for case in ref.TABLE3:
        cdf, _ = load_workload(case.workload, args.data_dir)
        p = plan(cdf, ref.RATE, ref.SLO_S, case.p_c, case.b_short, spec=spec, options=opts)
        ours: Table3Fleets = (p.homogeneous.total, (p.pool_routing.n_s, p.pool_routing.n_l),
                (p.pr_cr.n_s, p.pr_cr.n_l), (p.fleetopt.n_s, p.fleetopt.n_l), p.fleetopt.gamma)  # fmt: skip
        theirs: Table3Fleets = (case.homogeneous, case.pool_routing, case.pr_cr, case.fleetopt,
                                case.gamma_star)  # fmt: skip
        results.append({"workload": case.workload, "b_short": case.b_short, "p_c": case.p_c,
                        "ours": ours, "paper": theirs, "plan": plan_dict(p)})  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"Table 3 (λ = {ref.RATE:g} req/s, SLO {ref.SLO_S * 1e3:g} ms), ours vs paper, "
          f"moments = {opts.moments}, compressed_mass = {opts.compressed_mass}")  # fmt: skip
    print("counts are replicas, the paper's \"GPUs\" (an 8-GPU replica each, priced at one "
          "GPU's $/h): short+long=total")  # fmt: skip
    print(f"{'workload':<14} {'method':<18} {'ours':>20} {'paper':>20}")
    names = ("Homogeneous", "Pool routing", "PR + C&R (γ=1.5)", "FleetOpt")
    for r in results:
        o, t = r["ours"], r["paper"]
        for k, label in enumerate(names):
            if k == 3:
                label = f"FleetOpt (γ*={o[4]:.1f}/{t[4]:.1f})"
            print(f"{r['workload']:<14} {label:<18} {_fleet(o[k]):>20} {_fleet(t[k]):>20}")
    return 0


def _fleet(x: int | tuple[int, int] | float | None) -> str:
    if isinstance(x, tuple):
        return f"{x[0]}+{x[1]}={x[0] + x[1]:,}"
    return f"{x:,}"


def _table6(args: argparse.Namespace, opts: PlannerOptions, spec: FleetSpec) -> int:
    cdf, _ = load_workload(ref.TABLE6_WORKLOAD, args.data_dir)
    rows = []
    for row in ref.TABLE6:
        p = plan(cdf, row.rate, ref.SLO_S, ref.TABLE6_P_C, ref.TABLE6_B_SHORT, spec=spec,
                 options=opts)  # fmt: skip
        rows.append((row, p))
    if args.json:
        print(json.dumps([{"rate": r.rate, "ours": [p.homogeneous.total, p.pool_routing.total,
                           p.fleetopt.total, p.fleetopt.gamma], "paper": [r.homogeneous,
                           r.pool_routing, r.fleetopt, r.gamma_star]} for r, p in rows],
                         indent=2))  # fmt: skip
        return 0
    print(f"Table 6 (agent-heavy, B_short 8,192, p_c 0.75), ours / paper, "
          f"moments = {opts.moments}, compressed_mass = {opts.compressed_mass}")  # fmt: skip
    print("counts are replicas, the paper's \"GPUs\" (an 8-GPU replica each, priced at one "
          "GPU's $/h)")  # fmt: skip
    print(f"{'λ':>6} {'homogeneous':>13} {'PR':>13} {'FleetOpt (γ*)':>24} {'PR saving':>15} "
          f"{'FleetOpt saving':>17}")  # fmt: skip
    for r, p in rows:
        fo = f"{p.fleetopt.total}({p.fleetopt.gamma:.1f}) / {r.fleetopt}({r.gamma_star:.1f})"
        pr_save = 1 - r.pool_routing / r.homogeneous
        fo_save = 1 - r.fleetopt / r.homogeneous
        print(f"{r.rate:>6g} {p.homogeneous.total:>6} / {r.homogeneous:<5} "
              f"{p.pool_routing.total:>6} / {r.pool_routing:<5} {fo:>24} "
              f"{100 * p.savings(p.pool_routing):>6.1f}/{100 * pr_save:.1f}% "
              f"{100 * p.savings(p.fleetopt):>8.1f}/{100 * fo_save:.1f}%")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.pd:
        return _run_pd(args)
    try:
        # the tables are the paper's: its choices unless a flag overrides one
        opts = options_from(args, PAPER if args.table3 or args.table6 else DEFAULT)
        spec = spec_from(args)
        if args.table3 or args.table6:
            code = 0
            if args.table3:
                code |= _table3(args, opts, spec)
            if args.table6:
                code |= _table6(args, opts, spec)
            return code
        if args.from_gateway or args.histogram:
            return _run_live(args, opts, spec)
        if not args.workload:
            print("fleetgate plan: give --workload, --histogram, --from-gateway, --table3 or "
                  "--table6", file=sys.stderr)  # fmt: skip
            return 2
        cdf, doc = load_workload(args.workload, args.data_dir)
        reference = doc.get("paper_reference", {}) if isinstance(doc, dict) else {}
        pc = args.pc
        if pc is None:
            pc = float(reference.get("p_c", 1.0))
        b_ref = args.b_ref
        if b_ref is None and args.b_short is None and "B_short" in reference:
            b_ref = int(reference["B_short"])
        p = plan(cdf, args.rate, args.slo_ms / 1e3, pc, args.b_short,
                 b_candidates=args.b_candidates, b_ref=b_ref, spec=spec, options=opts,
                 phi=args.phi)  # fmt: skip
    except (ValueError, KeyError, FileNotFoundError, OSError) as exc:
        print(f"fleetgate plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan_dict(p, args.explain), indent=2))
    else:
        print(table(p))
        if args.explain:
            print("\n" + explain(p))
        _print_findings(p)
    return _exit(p, args.strict)


def _run_pd(args: argparse.Namespace) -> int:
    """`--pd`: the prefill:decode split of --gpus workers, or the pool for --rate."""
    try:
        wl = PdWorkload(args.prompt_tokens, args.output_tokens)
        prefill = RoleEngine(
            w=args.prefill_w,
            h=args.prefill_h,
            prefill_token_s=args.prefill_token_s,
            max_num_batched_tokens=args.prefill_budget,
            max_num_seqs=args.prefill_seqs,
        )
        decode = RoleEngine(w=args.decode_w, h=args.decode_h, max_num_seqs=args.decode_seqs)
        itl = None if args.itl_ms is None else args.itl_ms / 1e3
        if args.gpus is not None:
            p = pd_split(wl, args.gpus, prefill, decode, itl)
        else:
            p = pd_size(wl, args.rate, prefill, decode, itl, args.rho)
    except ValueError as exc:
        print(f"fleetgate plan: {exc}", file=sys.stderr)
        return 2
    rows = [
        {"prefill": s.prefill, "decode": s.decode, "prefill_rps": s.prefill_rps,
         "decode_rps": s.decode_rps, "capacity_rps": s.capacity, "bound": s.bound}
        for s in p.splits
    ]  # fmt: skip
    best = {"prefill": p.best.prefill, "decode": p.best.decode}
    if args.json:
        doc = {"mu_prefill": p.mu_prefill, "mu_decode": p.mu_decode, "best": best,
               "balanced_prefill_share": p.balanced_prefill_share, "splits": rows}  # fmt: skip
        print(json.dumps(doc, indent=2))
        return 0
    print(f"one prefill worker: {p.mu_prefill:.1f} req/s; one decode worker: "
          f"{p.mu_decode:.1f} req/s; balanced: {p.balanced_prefill_share:.0%} prefill")  # fmt: skip
    print("| split | prefill req/s | decode req/s | capacity | bound by |")
    print("|---|---|---|---|---|")
    for r in rows:
        mark = " ←" if (r["prefill"], r["decode"]) == (best["prefill"], best["decode"]) else ""
        print(f"| {r['prefill']}P/{r['decode']}D{mark} | {r['prefill_rps']:.1f} | "
              f"{r['decode_rps']:.1f} | {r['capacity_rps']:.1f} | {r['bound']} |")  # fmt: skip
    return 0


def _print_findings(p: Plan) -> None:
    """An unmet SLO is part of the answer: say which pool misses, by how much, and why."""
    findings = slo_findings(p.fleetopt, p.slo_s)
    if findings:
        print("\nSLO not met by any fleet on this grid (the cheapest is shown):")
        for line in findings:
            print(f"  - {line}")
        homo = p.homogeneous.long
        if homo is not None and not homo.slo_met:
            print(f"  - the homogeneous fleet misses too: the workload's own P99 request takes "
                  f"{1e3 * homo.ttft_floor_s:.0f} ms to its first token on an idle GPU")  # fmt: skip


def _exit(p: Plan, strict: bool) -> int:
    return 1 if strict and not p.fleetopt.slo_met else 0


if __name__ == "__main__":
    raise SystemExit(main())
