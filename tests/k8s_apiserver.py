"""A stand-in Kubernetes API server for EndpointSlices (discovery.k8s.io/v1), on 127.0.0.1.

No cluster runs here. This serves what the API server serves for the one resource the
gateway watches, in the API server's own shapes: `EndpointSliceList` answers with
`metadata.resourceVersion`, and watch streams (`?watch=true`, one JSON event per line:
ADDED / MODIFIED / DELETED with the whole object, BOOKMARK with only a resourceVersion when
`allowWatchBookmarks=true`, and `ERROR` with a `Status` object of code 410 / reason Expired
when the asked resourceVersion has been compacted away — which is how a real API server
forces a client to list again). Objects start from tests/data/k8s/endpointslice.json, an
EndpointSlice with the fields the EndpointSlice controller writes (labels, ownerReferences,
managedFields, conditions ready / serving / terminating, targetRef). These answers are
written to the discovery.k8s.io/v1 API reference, not recorded from a cluster (none was at
hand): a recording from a real API server can replace the template without changing a test.

The test drives it: `put_slice` / `delete_slice` make the events, `compact` makes every
older resourceVersion expire, `bookmark` sends a BOOKMARK, `requests` records every list
and watch it answered. It checks the bearer token the kubeconfig gives (`kubeconfig()`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

TEMPLATE = Path(__file__).parent / "data" / "k8s" / "endpointslice.json"
TOKEN = "stand-in-service-account-token"
PATH = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"


def _matches(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based selectors (`a=b,c==d,e!=f`), what the tests use."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
    return True


def endpoint(pod: str, ip: str, *, ready: bool = True, terminating: bool = False) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "conditions": {"ready": ready, "serving": ready or terminating, "terminating": terminating},
        "targetRef": {"kind": "Pod", "namespace": "llm", "name": pod, "uid": f"uid-{pod}"},
        "nodeName": "node-a",
        "zone": "zone-a",
    }


class StandInApiServer:
    """Runs an aiohttp app in its own thread and loop; the methods are thread-safe."""

    def __init__(self) -> None:
        self.rv = 1000
        self.slices: dict[str, dict[str, Any]] = {}  # (namespace/name) -> object
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.compacted = 0  # a watch from a resourceVersion below this gets 410
        self.requests: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._wake: asyncio.Event | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # --- the test's side ---------------------------------------------------------------------
    def put_slice(
        self,
        name: str,
        endpoints: Sequence[dict[str, Any]],
        *,
        port: int,
        port_name: str = "http",
        labels: dict[str, str] | None = None,
        namespace: str = "llm",
    ) -> str:
        """Create or replace a slice; its event is ADDED or MODIFIED. Returns its rv."""
        obj = json.loads(TEMPLATE.read_text())
        meta = obj["metadata"]
        meta["name"], meta["namespace"] = name, namespace
        meta["generateName"] = name.rsplit("-", 1)[0] + "-"
        if labels is not None:
            meta["labels"] = labels
        obj["endpoints"] = [copy.deepcopy(e) for e in endpoints]
        obj["ports"] = [{"name": port_name, "protocol": "TCP", "port": port}]
        with self._lock:
            key = f"{namespace}/{name}"
            kind = "MODIFIED" if key in self.slices else "ADDED"
            if kind == "MODIFIED":
                old = self.slices[key]["metadata"]
                meta["uid"], meta["creationTimestamp"] = old["uid"], old["creationTimestamp"]
                meta["generation"] = old["generation"] + 1
            return self._record(kind, key, obj)

    def delete_slice(self, name: str, namespace: str = "llm") -> str:
        with self._lock:
            key = f"{namespace}/{name}"
            obj = copy.deepcopy(self.slices[key])
            return self._record("DELETED", key, obj)

    def compact(self) -> None:
        """Every resourceVersion before now expires (what etcd compaction does)."""
        with self._lock:
            self.compacted = self.rv + 1
            self.history.clear()
        self._notify()

    def bookmark(self) -> None:
        with self._lock:
            self.rv += 1
            self.history.append((self.rv, "BOOKMARK", {}))
        self._notify()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "stand-in", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}
                    ],
                    "users": [{"name": "gateway", "user": {"token": TOKEN}}],
                    "contexts": [
                        {"name": "stand-in", "context": {"cluster": "stand-in", "user": "gateway"}}
                    ],
                    "current-context": "stand-in",
                }
            )
        )
        return path

    def count(self, kind: str) -> int:
        with self._lock:
            return sum(r["kind"] == kind for r in self.requests)

    # --- internals ---------------------------------------------------------------------------
    def _record(self, kind: str, key: str, obj: dict[str, Any]) -> str:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if kind == "DELETED":
            del self.slices[key]
        else:
            self.slices[key] = obj
        self.history.append((self.rv, kind, copy.deepcopy(obj)))
        self._notify()
        return str(self.rv)

    def _notify(self) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        """On the server's loop: wake every watch (each waits on the event it took)."""
        wake, self._wake = self._wake, asyncio.Event()
        if wake is not None:
            wake.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        ns = request.match_info["namespace"]
        selector = q.get("labelSelector", "")
        watch = _bool(q.get("watch"))
        authorized = request.headers.get("authorization") == f"Bearer {TOKEN}"
        with self._lock:
            self.requests.append(
                {"kind": "watch" if watch else "list", "rv": q.get("resourceVersion", "")}
                | dict(q)
                | {"authorized": str(authorized)}
            )
        if not authorized:
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        if not watch:
            with self._lock:
                items = [
                    copy.deepcopy(o)
                    for k, o in self.slices.items()
                    if k.startswith(ns + "/")
                    and _matches(selector, o["metadata"].get("labels", {}))
                ]
                rv = str(self.rv)
            body = {
                "kind": "EndpointSliceList",
                "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": rv},
                "items": items,
            }
            return web.json_response(body)
        return await self._watch(request, ns, selector)

    async def _watch(self, request: web.Request, ns: str, selector: str) -> web.StreamResponse:
        q = request.query
        since = int(q.get("resourceVersion") or 0)
        bookmarks = _bool(q.get("allowWatchBookmarks"))
        timeout = float(q.get("timeoutSeconds") or 1800)
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if since < self.compacted:
            status = _status(
                410, "Expired", f"too old resource version: {since} ({self.compacted - 1})"
            )
            await resp.write(_line({"type": "ERROR", "object": status}))
            return resp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        sent = since
        while loop.time() < deadline and not self._closing:
            wake = self._wake  # taken before reading: a change after this wakes it
            assert wake is not None
            with self._lock:
                if since < self.compacted:  # compacted while watching: the server ends it
                    events = None
                else:
                    events = [e for e in self.history if e[0] > sent]
            if events is None:
                status = _status(410, "Expired", "too old resource version")
                await resp.write(_line({"type": "ERROR", "object": status}))
                return resp
            for rv, kind, obj in events:
                sent = rv
                if kind == "BOOKMARK":
                    if bookmarks:
                        mark = {
                            "kind": "EndpointSlice",
                            "apiVersion": "discovery.k8s.io/v1",
                            "metadata": {"resourceVersion": str(rv), "creationTimestamp": None},
                            "endpoints": None,
                        }
                        await resp.write(_line({"type": "BOOKMARK", "object": mark}))
                    continue
                meta = obj["metadata"]
                if meta["namespace"] != ns or not _matches(selector, meta.get("labels", {})):
                    continue
                await resp.write(_line({"type": kind, "object": obj}))
            try:
                await asyncio.wait_for(wake.wait(), max(0.0, min(0.5, deadline - loop.time())))
            except TimeoutError:
                pass
        return resp

    # --- running -----------------------------------------------------------------------------
    def __enter__(self) -> StandInApiServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)

            async def start() -> None:
                self._wake = asyncio.Event()
                app = web.Application()
                app.router.add_get(PATH, self._handle)
                self._runner = web.AppRunner(app, shutdown_timeout=0.5)
                await self._runner.setup()
                site = web.TCPSite(self._runner, "127.0.0.1", 0)
                await site.start()
                self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

            loop.run_until_complete(start())
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="stand-in-apiserver")
        self._thread.start()
        assert ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        loop = self._loop
        assert loop is not None and self._runner is not None
        self._closing = True  # open watches end (as an API server's do when it stops)
        self._notify()
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(10)


def _bool(value: str | None) -> bool:
    """A query flag as the API server parses it (Go's strconv.ParseBool)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"
