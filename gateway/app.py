"""The gateway as an ASGI app: `create_app(config)`.

    create_app(config) -> ASGI app
        ProxyRoutes (gateway/edge.py)   POST /v1/chat/completions, POST /v1/completions
        └── FastAPI (gateway/api.py)    everything else, /docs and /openapi.json;
                                        its lifespan starts and stops the `Gateway`
                                        (gateway/runtime.py: the components it starts)

Run it with `fleetgate serve` (uvicorn with the gateway's HTTP limits), or with any ASGI
server: `uvicorn --factory gateway.app:create_app` reads the configuration file named by
FLEETGATE_CONFIG. Wrap the returned app in your own ASGI middleware to extend it (wrap the
whole app: FastAPI's own middleware does not see the two proxy routes). When mounting it
inside another app whose server does not run its lifespan, run `app.gateway.start()` and
`app.gateway.stop()` from your own lifespan.

The fleet changes live (gateway/workers.py `Fleet`): the admin API adds and drains
workers, and with a configuration file (`source`) SIGHUP, the file's modification time or
POST /admin/reload re-read it and apply its fleet (gateway/reload.py); a pool with
`discovery` takes its workers from Kubernetes EndpointSlices (gateway/discovery_k8s.py),
applied through the same diff. The scrape and
health loops and the metrics listen to the fleet, so they follow every change.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import orjson

from gateway.api import build_api
from gateway.config import ConfigError, ConfigSource, GatewayConfig, load_config
from gateway.edge import ProxyRoutes
from gateway.protocol import HeadLimits
from gateway.runtime import Gateway

log = logging.getLogger("fleetgate.gateway")

CONFIG_ENV = "FLEETGATE_CONFIG"  # a YAML file, for `uvicorn --factory gateway.app:create_app`
CONFIG_JSON_ENV = "FLEETGATE_CONFIG_JSON"  # the validated config, handed to --workers children
# where that config came from ({"path", "listen"}), so that --workers children can reload it
CONFIG_SOURCE_ENV = "FLEETGATE_CONFIG_SOURCE"


def _config_from_environment() -> tuple[GatewayConfig, ConfigSource | None]:
    if CONFIG_JSON_ENV in os.environ:
        config = GatewayConfig.model_validate_json(os.environ[CONFIG_JSON_ENV])
        if not os.environ.get(CONFIG_SOURCE_ENV):
            return config, None
        raw = orjson.loads(os.environ[CONFIG_SOURCE_ENV])
        source = ConfigSource(raw["path"], raw.get("listen") or {}).stamped()
        # a --workers child started later (uvicorn restarts its processes on SIGHUP) reads
        # the file as it is now; one that cannot keeps the configuration the server had
        try:
            return source.load(), source
        except ConfigError as exc:
            log.error("%s; keeping the configuration the server started with", exc)
            return config, source
    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(
            f"no configuration: call create_app(config) or set {CONFIG_ENV} to a YAML file"
        )
    source = ConfigSource(path).stamped()
    return load_config(path), source


def create_app(config: GatewayConfig | None = None, source: ConfigSource | None = None) -> Any:
    """The gateway's ASGI app (its `.gateway` attribute is the `Gateway`). With `source`
    (the file `config` was read from) the fleet can be reloaded from it."""
    if config is None:
        config, source = _config_from_environment()
    # the HTTP protocol's limits are per process: uvicorn builds protocols after the app
    HeadLimits.max_bytes = config.limits.max_header_bytes
    HeadLimits.timeout_s = config.limits.head_timeout_s
    gateway = Gateway(config, source)
    app: Any = ProxyRoutes(build_api(gateway), gateway)
    if config.cors.allow_origins:
        from starlette.middleware.cors import CORSMiddleware

        c = config.cors
        app = CORSMiddleware(
            app,
            allow_origins=c.allow_origins,
            allow_methods=c.allow_methods,
            allow_headers=c.allow_headers,
            allow_credentials=c.allow_credentials,
            max_age=c.max_age_s,
            expose_headers=[
                "x-request-id",
                "x-fleetgate-pool",
                "x-fleetgate-worker",
                "x-fleetgate-tokens-estimated",
                "x-fleetgate-compressed",
                "retry-after",
            ],
        )
    app.gateway = gateway
    return app


__all__ = ["CONFIG_ENV", "CONFIG_JSON_ENV", "CONFIG_SOURCE_ENV", "Gateway", "create_app"]
