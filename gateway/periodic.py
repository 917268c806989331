"""One background loop per worker: probe it every `interval` seconds until stopped.

Loops start at a random phase within the first interval, so that a fleet is not probed
in lockstep (and a hundred scrapes do not land in the same event-loop tick).

No exception ends a loop: a probe that raises is logged (with its traceback the first time
in a row, then at debug level until a probe succeeds again) and the loop goes on; only
`stop()` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Sequence

from gateway.workers import WorkerState

log = logging.getLogger("fleetgate.periodic")


class PerWorkerLoops:
    def __init__(
        self,
        workers: Sequence[WorkerState],
        interval: float,
        probe: Callable[[WorkerState], Awaitable[object]],
    ) -> None:
        self.workers = workers
        self.interval = interval
        self.probe = probe
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._loop(w)) for w in self.workers]

    async def _loop(self, worker: WorkerState) -> None:
        await asyncio.sleep(random.random() * self.interval)
        failing = False
        while True:
            try:
                await self.probe(worker)
            except asyncio.CancelledError:
                raise
            except Exception:
                if not failing:
                    log.exception("probe of worker %s raised; the loop goes on", worker.id)
                else:
                    log.debug("probe of worker %s raised again", worker.id, exc_info=True)
                failing = True
            else:
                if failing:
                    log.info("probe of worker %s works again", worker.id)
                failing = False
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
