"""Graceful shutdown on SIGTERM: refuse new work first, then finish what is in flight.

Kubernetes (or any orchestrator) sends SIGTERM and keeps routing to the pod until its
readiness probe fails. So on the first SIGTERM the gateway *drains* for
`listen.drain_delay_s`: `/readyz` and `/health` answer 503 and new proxy requests get 503
`shutting_down` with `Retry-After`, while it still accepts connections and every request
in flight continues. Then the server's own graceful shutdown starts: the listener
closes, in-flight requests get `listen.graceful_shutdown_s` to finish (streams included),
the lifespan's shutdown releases what the gateway holds, and the process exits 0.
A second SIGTERM skips the delay; SIGINT (Ctrl-C) is the server's as usual.

The handler chains to the ASGI server's own SIGTERM handler, so it works under
`fleetgate serve`, `--workers N` (each process drains itself) and `uvicorn --factory`.
uvicorn re-raises a signal it handled once it has shut down (the process then dies by
that signal); for uvicorn the drain sets its `should_exit` instead, so the exit is 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger("fleetgate.gateway")

Handler = Callable[[int, FrameType | None], Any] | int | None


class Drainable(Protocol):
    draining: bool


def install(gateway: Drainable, delay_s: float, loop: asyncio.AbstractEventLoop) -> None:
    """Put the drain in front of the current SIGTERM handler (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    previous: Handler = signal.getsignal(signal.SIGTERM)

    def on_sigterm(sig: int, frame: FrameType | None) -> None:
        if gateway.draining:  # a second SIGTERM: no more waiting
            _shut_down(previous, sig, frame)
            return
        gateway.draining = True
        log.info(
            "SIGTERM: draining for %.1f s (readiness 503, new requests 503), then finishing "
            "the requests in flight",
            delay_s,
        )
        loop.call_soon_threadsafe(loop.call_later, delay_s, _shut_down, previous, sig, frame)

    signal.signal(signal.SIGTERM, on_sigterm)


def _shut_down(previous: Handler, sig: int, frame: FrameType | None) -> None:
    server = getattr(previous, "__self__", None)
    if server is not None and hasattr(server, "should_exit"):
        server.should_exit = True  # uvicorn's graceful shutdown, without re-raising SIGTERM
    elif callable(previous):
        previous(sig, frame)
    else:
        raise SystemExit(0)
