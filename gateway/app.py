"""The gateway process: builds every component from the configuration and routes paths.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /healthz
(the process is up), GET /readyz (at least one worker can take traffic), GET /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import orjson

from gateway.admin import Admin
from gateway.config import GatewayConfig
from gateway.errors import GatewayError, error_body
from gateway.health import HealthChecker
from gateway.httpserver import HttpRequest, HttpServer, Responder
from gateway.metrics import CONTENT_TYPE, GatewayMetrics
from gateway.openai_request import CHAT, COMPLETIONS
from gateway.proxy import Pipeline
from gateway.requestlog import RequestLog
from gateway.telemetry import Scraper
from gateway.traffic import TrafficHistogram
from gateway.upstream import Timeouts, UpstreamClient
from gateway.workers import Fleet

log = logging.getLogger("fleetgate.gateway")

_JSON = [("content-type", "application/json")]


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.fleet = Fleet(config)
        self.started_at = int(time.time())
        self.port = 0
        self._server: HttpServer | None = None

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        cfg = self.config
        loop = asyncio.get_running_loop()
        now = loop.time
        self.metrics = GatewayMetrics(self.fleet, now)
        self.client = UpstreamClient(
            Timeouts(
                cfg.upstream.connect_timeout_s,
                cfg.upstream.first_byte_timeout_s,
                cfg.upstream.idle_timeout_s,
                cfg.upstream.pool_wait_timeout_s,
            ),
            max_connections_per_worker=cfg.upstream.max_connections_per_worker,
            max_response_bytes=cfg.upstream.max_response_bytes,
        )
        self.request_log = RequestLog(
            cfg.request_log.path, cfg.request_log.max_bytes, cfg.request_log.backups
        )
        self.traffic = TrafficHistogram(cfg.traffic.window_s, now)
        self.admin = Admin(cfg, self.traffic)
        self.pipeline = Pipeline(
            cfg, self.fleet, self.client, self.metrics, self.request_log, self.traffic
        )
        # httpx is right for the slow side: scrapes and health checks a few times a second
        self.control = httpx.AsyncClient(
            timeout=cfg.telemetry.timeout_s, limits=httpx.Limits(max_keepalive_connections=64)
        )
        workers = list(self.fleet.workers.values())
        self.scraper = Scraper(
            workers,
            self.control,
            cfg.telemetry.scrape_interval_s,
            now,
            lambda w, reason: self.metrics.scrape_errors.labels(w.id, reason).inc(),
        )
        self.health = HealthChecker(
            workers,
            self.control,
            cfg.health,
            lambda w: self.metrics.health_failures.labels(w.id).inc(),
        )
        # one round before serving, so that /readyz and routing start from real state
        await asyncio.gather(self.health.check_all(), *(self.scraper.scrape(w) for w in workers))
        self.scraper.start()
        self.health.start()
        self.request_log.start()
        self._server = HttpServer(self.handle, max_body_bytes=cfg.limits.max_body_bytes)
        self.port = await self._server.start(
            host or cfg.listen.host, cfg.listen.port if port is None else port
        )
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
        await self.scraper.stop()
        await self.health.stop()
        await self.client.close()
        await self.control.aclose()
        await self.request_log.close()

    async def handle(self, request: HttpRequest, responder: Responder) -> None:
        path = request.path
        method = request.method
        if path == "/v1/chat/completions" or path == "/v1/completions":
            if method != "POST":
                return _method_not_allowed(responder, "POST")
            await self.pipeline.handle(
                request, responder, CHAT if path == "/v1/chat/completions" else COMPLETIONS
            )
            return
        if path.startswith("/admin/"):
            await self.admin.handle(request, responder)
            return
        if method not in ("GET", "HEAD") and path in (
            "/v1/models",
            "/healthz",
            "/readyz",
            "/metrics",
        ):
            return _method_not_allowed(responder, "GET")
        if path == "/v1/models":
            return self._models(responder)
        if path == "/healthz":
            responder.send(200, _JSON, b'{"status":"ok"}')
            return
        if path == "/readyz":
            ready = self.fleet.any_routable(asyncio.get_running_loop().time())
            status = 200 if ready else 503
            responder.send(
                status, _JSON, orjson.dumps({"status": "ready" if ready else "no routable worker"})
            )
            return
        if path == "/metrics":
            responder.send(200, [("content-type", CONTENT_TYPE)], self.metrics.render())
            return
        err = GatewayError(f"no route for {method} {path}", code="not_found")
        err.type = "not_found_error"
        responder.send(404, _JSON, err.body())

    def _models(self, responder: Responder) -> None:
        data = [
            {
                "id": m,
                "object": "model",
                "created": self.started_at,
                "owned_by": "fleetgate",
                "max_model_len": L,
            }
            for m, L in sorted(self.fleet.models.items())
        ]
        responder.send(200, _JSON, orjson.dumps({"object": "list", "data": data}))


def _method_not_allowed(responder: Responder, allow: str) -> None:
    responder.send(
        405,
        [*_JSON, ("allow", allow)],
        error_body(
            f"method not allowed; use {allow}", "invalid_request_error", "method_not_allowed"
        ),
    )
