"""`fleetgate serve`: run the gateway until SIGINT/SIGTERM.

fleetgate serve --config config/gateway.yaml
fleetgate serve --upstream http://127.0.0.1:9000 --model my-model   # one worker, no file
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from gateway.app import Gateway
from gateway.config import ConfigError, GatewayConfig, load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetgate serve", description="Run the fleetgate gateway.")
    p.add_argument("--config", "-c", help="gateway YAML configuration")
    p.add_argument("--host", help="listen address (overrides listen.host)")
    p.add_argument("--port", type=int, help="listen port (overrides listen.port)")
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


def build_config(args: argparse.Namespace) -> GatewayConfig:
    if args.config and args.upstream:
        raise ConfigError("give either --config or --upstream, not both")
    if args.upstream:
        return load_config(data=quick_config(args.upstream, args.model, args.max_model_len))
    if not args.config:
        raise ConfigError(
            "no configuration: pass --config FILE (see config/gateway.yaml) or --upstream URL"
        )
    return load_config(args.config)


async def serve(config: GatewayConfig, host: str | None, port: int | None) -> None:
    gateway = Gateway(config)
    bound = await gateway.start(host, port)
    logging.getLogger("fleetgate").info(
        "fleetgate gateway on http://%s:%d (%d pools, %d workers)",
        host or config.listen.host,
        bound,
        len(config.pools),
        len(gateway.fleet.workers),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logging.getLogger("fleetgate").info("shutting down: finishing in-flight requests")
    await gateway.stop()


def install_loop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        pass


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape is noise
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"fleetgate serve: {exc}", file=sys.stderr)
        return 2
    install_loop()
    try:
        asyncio.run(serve(config, args.host, args.port))
    except OSError as exc:
        print(f"fleetgate serve: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0
