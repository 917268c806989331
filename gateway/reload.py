"""Configuration reload: SIGHUP, the file's modification time, or POST /admin/reload.

Only the fleet (`pools`: their workers, models and contexts) is applied live; see
`config.LIVE_SECTIONS`. A reload re-reads the file the way the start did (FLEETGATE_*
environment overrides, then the command line's `listen.*` flags), validates it whole and:

- refuses a bad file: the error names the full key path, is logged, counted
  (`fleetgate_config_reloads_total{result="error"}`) and the running fleet stays;
- applies a good one as a diff of the fleet (`Fleet.apply`): new workers join, workers no
  longer listed drain and leave, kept workers keep their in-flight requests, breakers and
  telemetry; every other section that changed is logged as not applied (restart needed).

SIGHUP is handled on the main thread only (so under `fleetgate serve` with one process and
under `uvicorn --factory` without --workers; uvicorn's own --workers supervisor restarts
its processes on SIGHUP). The file poll runs in every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from gateway.config import ConfigError, ConfigSource, GatewayConfig, file_stamp, live_merge
from gateway.workers import Fleet, FleetDiff, FleetError

log = logging.getLogger("fleetgate.reload")


@dataclass(frozen=True)
class ReloadResult:
    diff: FleetDiff
    not_applied: list[str] = field(default_factory=list)


class Reloader:
    """Reads `source`, applies its fleet to `fleet`; one reload at a time."""

    def __init__(
        self,
        source: ConfigSource,
        fleet: Fleet,
        get_config: Callable[[], GatewayConfig],
        set_config: Callable[[GatewayConfig], None],
        count: Callable[[str], None],
    ) -> None:
        self.source = source
        self.fleet = fleet
        self.get_config = get_config
        self.set_config = set_config
        self.count = count
        self._lock = asyncio.Lock()
        # as of the read the running configuration came from (else as of now)
        self._stamp = source.stamp if source.stamp is not None else file_stamp(source.path)
        self._poll: asyncio.Task[None] | None = None
        self._previous_hup: Any = None
        self._hup_installed = False

    async def reload(self, why: str) -> ReloadResult:
        """Raises ConfigError (the file) or FleetError (the change) and changes nothing."""
        async with self._lock:
            self._stamp = file_stamp(self.source.path)
            try:
                new = await asyncio.to_thread(self.source.load)
                # from here to the end of `apply` there is no await: one atomic change
                merged, not_applied = live_merge(self.get_config(), new)
                diff = self.fleet.apply(merged)
            except (ConfigError, FleetError) as exc:
                self.count("error")
                log.error("%s: configuration reload refused, the fleet is unchanged: %s", why, exc)
                raise
            self.set_config(merged)
            self.count("ok")
            if not_applied:
                log.warning(
                    "%s: configuration reloaded; these keys changed but need a restart and were"
                    " not applied: %s",
                    why,
                    ", ".join(not_applied),
                )
            log.info(
                "%s: configuration reloaded (added %s, draining %s, kept %d)",
                why,
                list(diff.added),
                list(diff.draining),
                len(diff.kept),
            )
            return ReloadResult(diff, not_applied)

    async def _quiet(self, why: str) -> None:
        with contextlib.suppress(ConfigError, FleetError):
            await self.reload(why)

    # --- triggers --------------------------------------------------------------------------
    def start(self, poll_s: float, loop: asyncio.AbstractEventLoop) -> None:
        if poll_s > 0:
            self._poll = loop.create_task(self._watch(poll_s))
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGHUP"):
            self._previous_hup = signal.getsignal(signal.SIGHUP)

            def on_sighup(sig: int, frame: FrameType | None) -> None:
                loop.call_soon_threadsafe(_spawn, loop, self._quiet("SIGHUP"))

            signal.signal(signal.SIGHUP, on_sighup)
            self._hup_installed = True

    async def _watch(self, poll_s: float) -> None:
        while True:
            await asyncio.sleep(poll_s)
            stamp = file_stamp(self.source.path)
            if stamp != self._stamp and stamp is not None:
                await self._quiet(f"{self.source.path} changed")

    async def stop(self) -> None:
        if self._hup_installed:
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signal.SIGHUP, self._previous_hup or signal.SIG_DFL)
            self._hup_installed = False
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
            self._poll = None


_background: set[asyncio.Task[None]] = set()


def _spawn(loop: asyncio.AbstractEventLoop, coro: Awaitable[None]) -> None:
    async def run() -> None:
        await coro

    task = loop.create_task(run())
    _background.add(task)  # held until done (the loop keeps only a weak reference)
    task.add_done_callback(_background.discard)
