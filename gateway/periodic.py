"""One background loop per worker: probe it every `interval` seconds until stopped.

Loops start at a random phase within the first interval, so that a fleet is not probed
in lockstep (and a hundred scrapes do not land in the same event-loop tick).

Loops follow the fleet: `add` starts one for a worker that joined (its first probe at
once, so that a new worker is known within one interval), `remove` cancels the loop of a
worker that left (synchronously; the task ends on the loop's next turn).

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
        self.workers = list(workers)
        self.interval = interval
        self.probe = probe
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False

    def start(self) -> None:
        self._started = True
        for w in self.workers:
            self._spawn(w, random.random() * self.interval)

    def add(self, worker: WorkerState) -> None:
        self.workers = [*self.workers, worker]
        if self._started:
            self._spawn(worker, 0.0)

    def remove(self, worker: WorkerState) -> None:
        self.workers = [w for w in self.workers if w is not worker]
        task = self._tasks.pop(worker.id, None)
        if task is not None:
            task.cancel()

    def running(self) -> frozenset[str]:
        """The ids of the workers with a loop (for tests and introspection)."""
        return frozenset(wid for wid, t in self._tasks.items() if not t.done())

    def _spawn(self, worker: WorkerState, delay: float) -> None:
        old = self._tasks.pop(worker.id, None)
        if old is not None:
            old.cancel()
        self._tasks[worker.id] = asyncio.get_running_loop().create_task(self._loop(worker, delay))

    async def _loop(self, worker: WorkerState, delay: float) -> None:
        await asyncio.sleep(delay)
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
        self._started = False
        tasks = list(self._tasks.values())
        self._tasks = {}
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t


class FollowsTheFleet:
    """A component that probes every worker in its own `PerWorkerLoops` (`_loops`) and,
    as a fleet listener, starts and stops a worker's loop as it joins and leaves."""

    _loops: PerWorkerLoops

    def start(self) -> None:
        self._loops.start()

    def worker_added(self, worker: WorkerState) -> None:
        self._loops.add(worker)

    def worker_removed(self, worker: WorkerState) -> None:
        self._loops.remove(worker)

    def looping(self) -> frozenset[str]:
        return self._loops.running()
