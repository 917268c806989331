"""Admin routes, behind `auth.admin_key` (`Authorization: Bearer <admin key>`).

- GET /admin/plan/histogram — the observed L_total histogram (`fleetgate.plan_histogram/v1`)
- GET /admin/plan[?slo_ms=500&pc=1.0&explain=1] — FleetOpt's planner run on it: the
  recommended fleet and (B_short, γ) next to the current configuration and its cost.

Posture: with no admin key configured every admin route answers 403 (closed by default);
a wrong or missing key is 403 too. Planning runs in a worker thread: a sweep is
milliseconds, but calibration on a fresh histogram can take longer and must not stall
the event loop that relays streams.
"""

from __future__ import annotations

import asyncio
import hmac
import math
from typing import Any
from urllib.parse import parse_qs

import orjson

from gateway.config import GatewayConfig
from gateway.errors import GatewayError, InvalidRequest, PermissionDenied
from gateway.httpserver import HttpRequest, Responder
from gateway.traffic import TrafficHistogram

_JSON = [("content-type", "application/json")]


class Admin:
    def __init__(self, config: GatewayConfig, traffic: TrafficHistogram) -> None:
        self.config = config
        self.traffic = traffic
        self.key = config.auth.admin_key

    def current(self) -> dict[str, Any]:
        cfg = self.config
        short = cfg.pools.get(cfg.placement.short_pool)
        n_short = len(short.workers) if short else 0
        n_long = sum(
            len(p.workers) for name, p in cfg.pools.items() if name != cfg.placement.short_pool
        )
        return {
            "b_short": cfg.b_short,
            "gamma": cfg.placement.gamma,
            "n_short": n_short,
            "n_long": n_long,
        }

    def _authorize(self, request: HttpRequest) -> None:
        if not self.key:
            raise PermissionDenied(
                "admin routes are disabled: set auth.admin_key", code="admin_disabled"
            )
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode(), self.key.encode()):
            raise PermissionDenied("admin routes need the admin key", code="admin_key_required")

    async def handle(self, request: HttpRequest, responder: Responder) -> None:
        try:
            self._authorize(request)
            if request.method != "GET":
                raise InvalidRequest("admin routes are GET only")
            if request.path == "/admin/plan/histogram":
                body = orjson.dumps(self.traffic.document(self.current()))
            elif request.path == "/admin/plan":
                body = orjson.dumps(await self._plan(request.query))
            else:
                err = GatewayError(f"no admin route {request.path}", code="not_found")
                err.status, err.type = 404, "not_found_error"
                raise err
        except GatewayError as exc:
            responder.send(exc.status, [*_JSON, *exc.headers()], exc.body())
            return
        responder.send(200, _JSON, body)

    async def _plan(self, query: str) -> dict[str, Any]:
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        slo_ms = _number(params, "slo_ms", 500.0)
        pc = _number(params, "pc", 1.0)
        if not 0 <= pc <= 1:
            raise InvalidRequest("pc must be within [0, 1]", param="pc")
        explain = params.get("explain", "0") not in ("0", "false", "")
        doc = self.traffic.document(self.current())
        if doc["requests"] == 0:
            raise InvalidRequest("no traffic observed yet: nothing to plan on", code="no_traffic")
        return await asyncio.to_thread(_run_planner, doc, slo_ms / 1000.0, pc, explain)


def _number(params: dict[str, str], key: str, default: float) -> float:
    if key not in params:
        return default
    try:
        value = float(params[key])
    except ValueError:
        raise InvalidRequest(f"{key} must be a number", param=key) from None
    if not math.isfinite(value) or (value <= 0 and key != "pc"):
        raise InvalidRequest(f"{key} must be a positive number", param=key)
    return value


def _run_planner(doc: dict[str, Any], slo_s: float, pc: float, explain: bool) -> dict[str, Any]:
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
