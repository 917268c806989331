"""What the admin routes compute (the routes themselves are in gateway/api.py).

- GET /admin/plan/histogram — the observed L_total histogram (`fleetgate.plan_histogram/v1`)
- GET /admin/plan[?slo_ms=500&pc=1.0&explain=1] — FleetOpt's planner run on it: the
  recommended fleet and (B_short, γ) next to the current configuration and its cost.
- GET /admin/plan?source=promised|demand — the same planner sized from the token-pool
  entitlements instead of the observed arrival rate (the token-pools paper's thesis: one
  capacity model for admission and for scaling): the rate is the entitled tokens/s — Σ
  baselines of bound entitlements (`promised`), or that plus the observed demand above
  them (`demand`, what `fleetgate_pool_capacity_demand` exports), over every token pool —
  divided by the observed mean tokens per request (L_total = prompt + max_tokens, what a
  reservation holds); the request-length shape is still the observed histogram's.

Posture: with no admin key configured every admin route answers 403 (closed by default);
a wrong or missing key is 403 too. Planning runs in a worker thread: a sweep is
milliseconds, but calibration on a fresh histogram can take longer and must not stall
the event loop that relays streams.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.config import GatewayConfig
from gateway.errors import InvalidRequest
from policies.tenancy.entitlement import Entitlement, EntitlementState


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


SOURCES = ("observed", "promised", "demand")


def entitled_rate(definitions: Iterable[Entitlement], demands: Iterable[Any], source: str) -> float:
    """The entitled tokens/s: Σ baselines of the bound entitlements as defined now
    (`promised`), plus the demand above them last measured (`demand`). The baselines are
    read from the definitions, not from the last measured demand, which is recomputed at
    most every 100 ms (a change made through /admin/entitlements just before would be
    missed)."""
    promised = sum(e.tokens_per_s for e in definitions if e.state is EntitlementState.BOUND)
    if source == "promised":
        return promised
    extra = sum(max(0.0, d.demand["tokens_per_s"] - d.promised["tokens_per_s"]) for d in demands)
    return float(promised + extra)


def entitled(
    doc: dict[str, Any], tokens_per_s: float, source: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The histogram document with its arrival rate replaced by the entitled one, and how
    that rate was found. The mean L_total of a bucket is its midpoint (the first bucket's
    lower bound is 0); overflow requests count at the last bound."""
    buckets = doc["buckets"]
    total, weighted, low = 0, 0.0, 0
    for le, count in buckets:
        total += count
        weighted += count * (low + le) / 2
        low = le
    overflow = int(doc.get("overflow") or 0)
    if overflow and buckets:
        total += overflow
        weighted += overflow * buckets[-1][0]
    if total == 0 or weighted <= 0:
        raise InvalidRequest(
            "no traffic observed yet: the entitlements give a token rate, the request-length "
            "shape comes from observed traffic",
            code="no_traffic",
        )
    mean = weighted / total
    rate = tokens_per_s / mean
    if rate <= 0:
        raise InvalidRequest(
            f"the entitlements promise no tokens/s ({source}): nothing to size a fleet for",
            param="source",
            code="unplannable",
        )
    basis = {
        "source": source,
        "tokens_per_s": tokens_per_s,
        "mean_tokens_per_request": round(mean, 3),
        "arrival_rate": rate,
        "observed_arrival_rate": doc.get("arrival_rate", doc["requests"] / doc["window_s"]),
    }
    return doc | {"arrival_rate": rate}, basis


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
