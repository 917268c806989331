"""Watching EndpointSlices for the pools with `discovery` (the I/O around gateway/discovery.py).

Per pool, one task: list the slices the selector matches, apply them, then watch from the
list's resourceVersion (bookmarks on, `watch_timeout_s` per watch request, resumed from the
last resourceVersion when the server ends it). A 410 Gone — as an HTTP status or as the
watch's ERROR event, which is how the API server says the resourceVersion is too old —
re-lists at once; any other failure keeps the workers found so far and re-lists after
`retry_s` (doubling to 30 s). Every change goes to `Fleet.set_discovered`: the same diff
as a reload (kept workers keep their state, gone or not-ready ones drain).

The client is the official one's asyncio port, `kubernetes_asyncio` (the `kubernetes`
extra), imported only when a pool uses discovery. Its configuration is the pod's service
account (in-cluster) unless the pool names a kubeconfig file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson

from gateway.config import GatewayConfig, KubernetesDiscovery, Worker
from gateway.discovery import SliceError, SliceSet
from gateway.workers import FleetDiff, FleetError

log = logging.getLogger("fleetgate.discovery")

MAX_EVENT_BYTES = 16 * 1024 * 1024  # one watch event (a slice holds at most 1000 endpoints)
MAX_RETRY_S = 30.0
LIST_TIMEOUT_S = 30.0
FIRST_SYNC_S = 10.0  # start waits this long for every pool's first list

Apply = Callable[[str, tuple[Worker, ...]], FleetDiff]
# (pool, event): list, gone (a 410: listed again), error, applied (the workers changed),
# refused (the fleet refused the change: FleetError) — fleetgate_discovery_events_total
Count = Callable[[str, str], None]


def _uncounted(pool: str, event: str) -> None:
    pass


class Gone(Exception):
    """The resourceVersion is too old (410): list again."""


def _client_module() -> Any:
    try:
        import kubernetes_asyncio
    except ImportError:  # pragma: no cover - the message is the point
        raise RuntimeError(
            "pools.*.discovery: kubernetes needs the kubernetes extra:"
            " pip install 'fleetgate[kubernetes]'"
        ) from None
    return kubernetes_asyncio


class PoolWatch:
    """Lists and watches one pool's EndpointSlices for as long as it runs."""

    def __init__(
        self, pool: str, spec: KubernetesDiscovery, apply: Apply, count: Count = _uncounted
    ) -> None:
        self.pool = pool
        self.spec = spec
        self.apply = apply
        self.count = count
        self.slices = SliceSet()
        self.synced = asyncio.Event()  # set by the first good list
        self.applied: tuple[Worker, ...] | None = None
        self.relists = 0

    async def run(self) -> None:
        k8s = _client_module()
        api_client = None
        delay = self.spec.retry_s
        try:
            while True:
                try:
                    if api_client is None:  # the credentials too may not be there yet
                        api_client = await self._api_client(k8s)
                    api = k8s.client.DiscoveryV1Api(api_client)
                    await self._list(api)
                    delay = self.spec.retry_s
                    while True:
                        await self._watch(api)
                except Gone:
                    self.count(self.pool, "gone")
                    log.info("pool %s: resourceVersion expired (410): listing again", self.pool)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the API server's, the network's, a bad answer
                    self.count(self.pool, "error")
                    log.warning(
                        "pool %s: EndpointSlice discovery failed (%s: %s); keeping %d"
                        " workers found so far, listing again in %.3g s",
                        self.pool,
                        type(exc).__name__,
                        exc,
                        len(self.applied or ()),
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_S)
        finally:
            if api_client is not None:
                await api_client.close()

    async def _api_client(self, k8s: Any) -> Any:
        cfg = k8s.client.Configuration()
        if self.spec.kubeconfig:
            await k8s.config.load_kube_config(
                config_file=self.spec.kubeconfig, client_configuration=cfg
            )
        else:
            k8s.config.load_incluster_config(client_configuration=cfg)
        return k8s.client.ApiClient(configuration=cfg)

    def _args(self) -> dict[str, Any]:
        return {"label_selector": self.spec.selector, "_preload_content": False}

    async def _list(self, api: Any) -> None:
        self.relists += 1
        resp = await api.list_namespaced_endpoint_slice(
            self.spec.namespace, **self._args(), _request_timeout=LIST_TIMEOUT_S
        )
        try:
            await _check(resp)
            body = await resp.read()
        finally:
            resp.release()
        try:
            self.slices.replace(orjson.loads(body))
        except orjson.JSONDecodeError as exc:
            raise SliceError(f"the list answer is not JSON: {exc}") from None
        self.count(self.pool, "list")
        self._publish()
        self.synced.set()

    async def _watch(self, api: Any) -> None:
        """One watch request, until the server ends it (the caller resumes)."""
        resp = await api.list_namespaced_endpoint_slice(
            self.spec.namespace,
            **self._args(),
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=self.slices.resource_version,
            timeout_seconds=self.spec.watch_timeout_s,
            _request_timeout=(LIST_TIMEOUT_S, self.spec.watch_timeout_s + LIST_TIMEOUT_S),
        )
        buf = b""
        try:
            await _check(resp)
            async for chunk in resp.content.iter_any():
                buf += chunk
                while (nl := buf.find(b"\n")) >= 0:
                    line, buf = buf[:nl], buf[nl + 1 :]
                    if line.strip():
                        self._event(line)
                if len(buf) > MAX_EVENT_BYTES:
                    raise SliceError(f"a watch event longer than {MAX_EVENT_BYTES} bytes")
            if buf.strip():
                self._event(buf)
        finally:
            resp.release()

    def _event(self, line: bytes) -> None:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise SliceError(f"a watch event that is not JSON: {exc}") from None
        if not isinstance(event, dict):
            raise SliceError(f"a watch event that is not an object: {line[:200]!r}")
        if event.get("type") == "ERROR":
            status = event.get("object") or {}
            code = status.get("code") if isinstance(status, dict) else None
            if code == 410:
                raise Gone()
            raise SliceError(f"the watch ended with an error: {status}")
        self.slices.apply(event)
        if event.get("type") != "BOOKMARK":
            self._publish()

    def _publish(self) -> None:
        workers = self.slices.workers(self.spec)
        if workers == self.applied:
            return
        try:
            diff = self.apply(self.pool, workers)
        except FleetError as exc:
            self.count(self.pool, "refused")
            log.error("pool %s: discovered workers not applied: %s", self.pool, exc)
            return
        self.applied = workers
        self.count(self.pool, "applied")
        if diff.changed:
            log.info(
                "pool %s: discovery: added %s, draining %s (%d ready endpoints)",
                self.pool,
                list(diff.added),
                list(diff.draining),
                len(workers),
            )


class Discovery:
    """The watches of every pool that has `discovery`; follows configuration reloads."""

    def __init__(
        self, apply: Apply, forget: Callable[[str], None], count: Count = _uncounted
    ) -> None:
        self.apply = apply
        self.forget = forget  # a pool no longer discovered: its discovered workers go
        self.count = count
        self.watches: dict[str, tuple[PoolWatch, asyncio.Task[None]]] = {}

    def reconcile(self, config: GatewayConfig) -> None:
        """Start a watch for each pool with discovery, stop those whose pool or spec went
        (a changed spec starts anew)."""
        wanted = {p: pool.discovery for p, pool in config.pools.items() if pool.discovery}
        for pool, (watch, task) in list(self.watches.items()):
            if wanted.get(pool) != watch.spec:
                task.cancel()
                del self.watches[pool]
                if pool not in wanted:
                    self.forget(pool)
        for pool, spec in wanted.items():
            if pool not in self.watches:
                watch = PoolWatch(pool, spec, self.apply, self.count)
                task = asyncio.get_running_loop().create_task(watch.run())
                task.add_done_callback(_report)
                self.watches[pool] = (watch, task)

    async def wait_synced(self, within_s: float = FIRST_SYNC_S) -> bool:
        """Every pool's first list applied, or False after `within_s` seconds."""
        events = [w.synced.wait() for w, _ in self.watches.values()]
        if not events:
            return True
        try:
            async with asyncio.timeout(within_s):
                await asyncio.gather(*events)
        except TimeoutError:
            late = [p for p, (w, _) in self.watches.items() if not w.synced.is_set()]
            log.warning("discovery: no EndpointSlice list yet for pools %s", late)
            return False
        return True

    async def stop(self) -> None:
        tasks = [t for _, t in self.watches.values()]
        self.watches.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


async def _check(resp: Any) -> None:
    """The client does not check the status of an answer it does not read itself; the
    API server's message says what is wrong (a 403 names the missing RBAC verb)."""
    if resp.status == 410:
        raise Gone()
    if resp.status != 200:
        text = (await resp.content.read(500)).decode("utf-8", "replace")
        raise SliceError(f"the API server answered {resp.status}: {text}")


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("discovery stopped: %s", task.exception())
