"""Active health checks: `GET /health` on every worker every `health.interval_s`.

Both engines answer 200 with an empty body when they can serve and 503 (or nothing) when
they cannot (WIRE_SPEC §1). Posture: a worker is routable from the start (so a gateway
that starts before its workers recovers as soon as they answer), becomes unhealthy after
`unhealthy_after` failed checks in a row and healthy again after `healthy_after` good
ones. `fleetgate_worker_healthy` shows the result, `fleetgate_health_check_failures_total`
the failures. Readiness (/readyz, /health) is stricter than routability: it needs a
routable worker that has passed a health check (or a scrape) since start, so a gateway in
front of a dead fleet answers 503 from its first request (`Fleet.any_ready`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from gateway.periodic import FollowsTheFleet, PerWorkerLoops
from gateway.workers import WorkerState
from policies.spec import HealthSpec

log = logging.getLogger("fleetgate.health")


class HealthChecker(FollowsTheFleet):
    def __init__(
        self,
        workers: list[WorkerState],
        client: httpx.AsyncClient,
        config: HealthSpec,
        on_failure: Callable[[WorkerState], None],
    ) -> None:
        self.workers = workers
        self.client = client
        self.config = config
        self.on_failure = on_failure
        self._loops = PerWorkerLoops(workers, config.interval_s, self.check)

    async def check(self, worker: WorkerState) -> bool:
        try:
            r = await self.client.get(worker.url + "/health", timeout=self.config.timeout_s)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        except Exception:  # never fatal to the start-up round or the loop
            log.exception("health check of %s failed", worker.id)
            ok = False
        was = worker.healthy
        worker.health_result(ok, self.config.unhealthy_after, self.config.healthy_after)
        if not ok:
            self.on_failure(worker)
        if was != worker.healthy:
            log.warning(
                "worker %s is now %s", worker.id, "healthy" if worker.healthy else "UNHEALTHY"
            )
        return ok

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in self.workers))

    async def stop(self) -> None:
        await self._loops.stop()
