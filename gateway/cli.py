"""`fleetgate serve`: the gateway on uvicorn (uvloop, httptools) until SIGINT/SIGTERM.

fleetgate serve --config config/gateway.yaml
fleetgate serve --upstream http://127.0.0.1:9000 --model my-model   # one worker, no file
fleetgate serve --config gw.yaml --workers 4 --ssl-certfile c.pem --ssl-keyfile k.pem

Every option has a key in the `listen:` section of the configuration; a flag given here
wins over the file. The same app runs under any ASGI server
(`FLEETGATE_CONFIG=gw.yaml uvicorn --factory gateway.app:create_app`), but only
`fleetgate serve` adds the request-head size limit and read deadline (gateway/protocol.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gateway import logs
from gateway.config import ConfigError, ConfigSource, GatewayConfig, load_config

# flag -> listen.<key>
_LISTEN_FLAGS = {
    "host": "host",
    "port": "port",
    "workers": "workers",
    "root_path": "root_path",
    "proxy_headers": "proxy_headers",
    "forwarded_allow_ips": "forwarded_allow_ips",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "timeout_keep_alive": "keep_alive_s",
    "timeout_graceful_shutdown": "graceful_shutdown_s",
    "drain_delay": "drain_delay_s",
    "limit_concurrency": "limit_concurrency",
    "backlog": "backlog",
    "access_log": "access_log",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetgate serve", description="Run the fleetgate gateway.")
    p.add_argument("--config", "-c", help="gateway YAML configuration")
    p.add_argument(
        "--upstream",
        action="append",
        metavar="URL",
        help="serve a single pool of these workers instead of a config file (repeatable)",
    )
    p.add_argument(
        "--model", default="default", help="with --upstream: the model name the pool serves"
    )
    p.add_argument(
        "--max-model-len", type=int, default=8192, help="with --upstream: the pool's context"
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="json: one object a line"
    )
    s = p.add_argument_group("server (each overrides listen.* in the configuration)")
    s.add_argument("--host", help="listen address")
    s.add_argument("--port", type=int, help="listen port")
    s.add_argument("--workers", type=int, help="processes; each keeps its own soft state")
    s.add_argument("--root-path", help="the path prefix a reverse proxy strips")
    s.add_argument(
        "--proxy-headers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="trust X-Forwarded-For/-Proto from --forwarded-allow-ips",
    )
    s.add_argument("--forwarded-allow-ips", help="comma-separated addresses, or '*'")
    s.add_argument("--ssl-certfile", help="serve HTTPS with this certificate (PEM)")
    s.add_argument("--ssl-keyfile", help="... and this key (PEM)")
    s.add_argument("--timeout-keep-alive", type=float, help="idle client connections, seconds")
    s.add_argument(
        "--timeout-graceful-shutdown", type=float, help="in-flight requests on SIGTERM, seconds"
    )
    s.add_argument(
        "--drain-delay", type=float, help="on SIGTERM: seconds of readiness 503 before stopping"
    )
    s.add_argument("--limit-concurrency", type=int, help="connections + tasks before 503")
    s.add_argument("--backlog", type=int, help="the listen socket's backlog")
    s.add_argument(
        "--access-log", action=argparse.BooleanOptionalAction, default=None, help="uvicorn's"
    )
    return p


def quick_config(upstreams: list[str], model: str, max_model_len: int) -> dict[str, object]:
    return {
        "pools": {
            "short": {
                "max_model_len": max_model_len,
                "models": [model],
                "workers": [{"url": u} for u in upstreams],
            }
        }
    }


def config_source(args: argparse.Namespace) -> ConfigSource | None:
    """The file a reload re-reads, with the same command-line overrides."""
    if not args.config:
        return None
    return ConfigSource(os.path.abspath(args.config), _listen_overrides(args)).stamped()


def _listen_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        key: getattr(args, flag)
        for flag, key in _LISTEN_FLAGS.items()
        if getattr(args, flag, None) is not None
    }


def build_config(args: argparse.Namespace) -> GatewayConfig:
    if args.config and args.upstream:
        raise ConfigError("give either --config or --upstream, not both")
    if args.upstream:
        config = load_config(data=quick_config(args.upstream, args.model, args.max_model_len))
    elif args.config:
        config = load_config(args.config)
    else:
        raise ConfigError(
            "no configuration: pass --config FILE (see config/gateway.yaml) or --upstream URL"
        )
    overrides = _listen_overrides(args)
    if overrides:
        listen = config.listen.model_dump() | overrides
        data = config.model_dump() | {"listen": listen}
        try:
            config = GatewayConfig.model_validate(data)
        except ValueError as exc:
            raise ConfigError(f"command line: {exc}") from None
    return config


def uvicorn_options(config: GatewayConfig, log_level: str) -> dict[str, Any]:
    from gateway.protocol import GatewayHttpProtocol

    listen = config.listen
    return {
        "host": listen.host,
        "port": listen.port,
        "workers": listen.workers,
        "loop": "uvloop",
        "http": GatewayHttpProtocol,
        "ws": "none",
        "lifespan": "on",
        "root_path": listen.root_path,
        "proxy_headers": listen.proxy_headers,
        "forwarded_allow_ips": listen.forwarded_allow_ips,
        "ssl_certfile": listen.ssl_certfile,
        "ssl_keyfile": listen.ssl_keyfile,
        "timeout_keep_alive": listen.keep_alive_s,
        "timeout_graceful_shutdown": listen.graceful_shutdown_s,
        "limit_concurrency": listen.limit_concurrency,
        "backlog": listen.backlog,
        "access_log": listen.access_log,
        "server_header": False,
        "log_config": None,  # keep the process's logging (gateway/logs.py)
        "log_level": log_level,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    source = config_source(args)  # stamped before the read: a change after it is reloaded
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"fleetgate serve: {exc}", file=sys.stderr)
        return 2

    run(config, args.log_level, source)
    return 0


def run(config: GatewayConfig, log_level: str = "info", source: ConfigSource | None = None) -> None:
    """Serve `config` with uvicorn until SIGINT/SIGTERM (what `fleetgate serve` and
    `fleetgate demo` do once the configuration is settled)."""
    import uvicorn

    from gateway.app import CONFIG_JSON_ENV, CONFIG_SOURCE_ENV, create_app

    options = uvicorn_options(config, log_level)
    if config.listen.workers > 1:
        # each child process imports the factory and validates the same configuration
        os.environ[CONFIG_JSON_ENV] = config.model_dump_json()
        if source is not None:
            os.environ[CONFIG_SOURCE_ENV] = json.dumps(
                {"path": source.path, "listen": dict(source.listen_overrides)}
            )
        uvicorn.run("gateway.app:create_app", factory=True, **options)
    else:
        uvicorn.run(create_app(config, source), **options)
