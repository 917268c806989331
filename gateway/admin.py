"""What the admin routes compute (the routes themselves are in gateway/api.py).

- GET /admin/plan/histogram — the observed L_total histogram (`fleetgate.plan_histogram/v1`)
- GET /admin/plan[?slo_ms=500&pc=1.0&explain=1] — FleetOpt's planner run on it: the
  recommended fleet and (B_short, γ) next to the current configuration and its cost.

Posture: with no admin key configured every admin route answers 403 (closed by default);
a wrong or missing key is 403 too. Planning runs in a worker thread: a sweep is
milliseconds, but calibration on a fresh histogram can take longer and must not stall
the event loop that relays streams.
"""

from __future__ import annotations

from typing import Any

from gateway.config import GatewayConfig
from gateway.errors import InvalidRequest


def current(cfg: GatewayConfig, counts: dict[str, int] | None = None) -> dict[str, Any]:
    """The deployed fleet, as the planner compares it (`counts`: the live workers per pool,
    when the fleet has changed since the configuration was read)."""
    if counts is None:
        counts = {name: len(p.workers) for name, p in cfg.pools.items()}
    n_short = counts.get(cfg.placement.short_pool, 0)
    n_long = sum(n for name, n in counts.items() if name != cfg.placement.short_pool)
    return {
        "b_short": cfg.b_short,
        "gamma": cfg.placement.gamma,
        "n_short": n_short,
        "n_long": n_long,
    }


def run_planner(doc: dict[str, Any], slo_s: float, pc: float, explain: bool) -> dict[str, Any]:
    from policies.planner.live import live_plan, parse_histogram
    from policies.planner.report import live_dict

    try:
        traffic = parse_histogram(doc)
        result = live_dict(live_plan(traffic, slo_s, pc), explain)
    except ValueError as exc:
        raise InvalidRequest(
            f"cannot plan on the observed traffic: {exc}", code="unplannable"
        ) from None
    result["histogram"] = doc
    return result
