"""Planning from the gateway's own traffic: the observed-histogram shape and the live plan.

The gateway keeps, per window, a histogram of observed L_total (the figure placement
decides on: estimated prompt tokens + max_tokens) and the arrival count, and serves it at
`GET /admin/plan/histogram` (admin key). Shape, `fleetgate.plan_histogram/v1`:

    {
      "schema": "fleetgate.plan_histogram/v1",
      "window_s": 300.0,               # length of the observation window, seconds (> 0)
      "requests": 48210,               # arrivals in the window, every one of them
      "arrival_rate": 160.7,           # optional; default requests / window_s
      "buckets": [[64, 120], [128, 410], ..., [65536, 3]],
                                       # [le, count]: count of requests with
                                       # previous le < L_total ≤ le (first: 0 < L ≤ le);
                                       # le strictly increasing ints; counts ≥ 0
      "overflow": 0,                   # optional: requests above the last le (unplaceable)
      "input_fraction": 0.87,          # optional: Σ prompt tokens / Σ L_total in the window
      "compression": {"borderline": 1020, "attempted": 812, "succeeded": 790},
                                       # optional: requests in the C&R band
                                       # B_short < L_total ≤ γ·B_short (every category,
                                       # code included), those C&R tried, those it fitted
      "current": {"b_short": 4096, "gamma": 1.5, "n_short": 48, "n_long": 2}
                                       # optional: what is deployed now
    }

`GET /admin/plan` (and `fleetgate plan --from-gateway URL`) runs `live_plan` on it: the
recommended fleet and (B_short, γ), next to the current configuration priced by the same
model and the fleet the current (B, γ) would need. Bucket bounds at the paper's breakpoints
(64 … 65,536) make the observed CDF directly comparable with the shipped ones.

The planner's p_c is the share of the band that reaches the short pool (Eq. 14:
α' = F(B) + [F(γB) − F(B)]·p_c), so it is `succeeded / borderline`: code and every other
band request C&R never tries count as not compressed. `succeeded / attempted` would
overstate it by the share of the band C&R skips; it is used only for documents without
`borderline` (older gateways).

Failure posture: malformed documents raise ValueError naming the field; p_c falls back to
the caller's default below `MIN_COMPRESSION_SAMPLES` band requests (too few to estimate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from policies.planner.fleet import FleetRow, Plan, cell_row, evaluate, plan_from_sweep
from policies.planner.options import DEFAULT, GAMMAS, PlannerOptions
from policies.planner.sweep import FleetSpec, calibrate, feasible_boundaries, sweep
from policies.planner.workload import LengthCdf

SCHEMA = "fleetgate.plan_histogram/v1"
MIN_COMPRESSION_SAMPLES = 50  # below this the observed success rate is noise


@dataclass(frozen=True, slots=True)
class CurrentConfig:
    b_short: int
    gamma: float
    n_short: int
    n_long: int


@dataclass(frozen=True, slots=True)
class ObservedTraffic:
    window_s: float
    requests: int
    arrival_rate: float
    upper_bounds: tuple[int, ...]
    counts: tuple[int, ...]
    overflow: int = 0
    input_fraction: float | None = None
    compression_attempted: int = 0
    compression_succeeded: int = 0
    current: CurrentConfig | None = None
    compression_borderline: int | None = None  # None: not reported (older gateways)

    def cdf(self, name: str = "observed") -> LengthCdf:
        return LengthCdf.from_counts(self.upper_bounds, self.counts, name)

    def p_c(self, default: float) -> float:
        """Observed share of band requests that reached the short pool, or `default` when
        too few band requests were seen."""
        band = self.compression_borderline
        if band is None:
            band = self.compression_attempted
        if band < MIN_COMPRESSION_SAMPLES:
            return default
        return self.compression_succeeded / band


def _field(d: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    if key not in d or d[key] is None:
        if default is None:
            raise ValueError(f"plan histogram: missing {key!r}")
        return default
    value = d[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"plan histogram: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def parse_histogram(d: Mapping[str, Any]) -> ObservedTraffic:
    """Validate a `fleetgate.plan_histogram/v1` document (already decoded from JSON)."""
    if d.get("schema") != SCHEMA:
        raise ValueError(f"plan histogram: schema must be {SCHEMA!r}, got {d.get('schema')!r}")
    window = _field(d, "window_s", float)
    if window <= 0:
        raise ValueError("plan histogram: 'window_s' must be > 0")
    requests = _field(d, "requests", int)
    buckets = _field(d, "buckets", list)
    bounds: list[int] = []
    counts: list[int] = []
    for item in buckets:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            raise ValueError(f"plan histogram: a bucket must be [le, count], got {item!r}")
        le, count = item
        if not isinstance(le, int) or not isinstance(count, int) or count < 0:
            raise ValueError(f"plan histogram: bad bucket {item!r}")
        if le <= 0 or (bounds and le <= bounds[-1]):
            raise ValueError("plan histogram: bucket bounds must be positive and increasing")
        bounds.append(le)
        counts.append(count)
    overflow = _field(d, "overflow", int, 0)
    if sum(counts) + overflow != requests:
        raise ValueError(
            f"plan histogram: bucket counts + overflow = {sum(counts) + overflow}, "
            f"but requests = {requests}"
        )
    rate = _field(d, "arrival_rate", float, requests / window)
    comp = d.get("compression") or {}
    cur = d.get("current")
    current = None
    if cur is not None:
        current = CurrentConfig(
            b_short=_field(cur, "b_short", int),
            gamma=_field(cur, "gamma", float),
            n_short=_field(cur, "n_short", int),
            n_long=_field(cur, "n_long", int),
        )
    frac = d.get("input_fraction")
    if frac is not None and not (isinstance(frac, int | float) and 0 < frac < 1):
        raise ValueError("plan histogram: 'input_fraction' must be in (0, 1)")
    attempted = _field(comp, "attempted", int, 0)
    succeeded = _field(comp, "succeeded", int, 0)
    if not 0 <= succeeded <= attempted:
        raise ValueError("plan histogram: compression needs 0 ≤ succeeded ≤ attempted")
    borderline = comp.get("borderline")
    if borderline is not None:
        borderline = _field(comp, "borderline", int)
        if borderline < attempted:
            raise ValueError("plan histogram: compression needs attempted ≤ borderline")
    return ObservedTraffic(
        window_s=window,
        requests=requests,
        arrival_rate=rate,
        upper_bounds=tuple(bounds),
        counts=tuple(counts),
        overflow=overflow,
        input_fraction=None if frac is None else float(frac),
        compression_attempted=attempted,
        compression_succeeded=succeeded,
        current=current,
        compression_borderline=borderline,
    )


@dataclass(frozen=True)
class LivePlan:
    plan: Plan
    traffic: ObservedTraffic
    p_c: float
    current: FleetRow | None  # the deployed fleet, priced and checked
    current_required: FleetRow | None  # what the deployed (B, γ) needs at this traffic


def live_plan(
    traffic: ObservedTraffic,
    slo_s: float = 0.5,
    p_c: float = 1.0,
    *,
    spec: FleetSpec | None = None,
    options: PlannerOptions = DEFAULT,
    observed_split: bool = False,
    phi: float | None = None,
) -> LivePlan:
    """Algorithm 1 on the observed histogram, with the current deployment alongside.

    `p_c` is the default compressibility, replaced by the observed one when enough
    borderline requests were seen; `observed_split` uses the window's input fraction."""
    spec = spec or FleetSpec()
    if observed_split and traffic.input_fraction is not None:
        options = replace(options, input_fraction=traffic.input_fraction)
    cdf = traffic.cdf()
    cands = feasible_boundaries(cdf, spec)
    gammas = set(GAMMAS)
    refs: tuple[int, ...] = ()
    if traffic.current is not None:
        refs = (traffic.current.b_short,)  # priced, not a candidate unless feasible anyway
        gammas.add(traffic.current.gamma)
    pc = traffic.p_c(p_c)
    cal = calibrate(cdf, cands, tuple(sorted(gammas)), spec, options, reference_b=refs)
    sw = sweep(cal, traffic.arrival_rate, slo_s, pc, phi)
    # the baselines are what is deployed: PR at the current boundary when there is one
    result = plan_from_sweep(sw, b_ref=traffic.current.b_short if traffic.current else None)
    current = required = None
    if traffic.current is not None:
        c = traffic.current
        current = evaluate(sw, c.b_short, c.gamma, c.n_short, c.n_long)
        i, j = sw.index(c.b_short, c.gamma)
        required = cell_row(sw, i, j, "current_required")
    return LivePlan(result, traffic, pc, current, required)
