"""A pool's workers from Kubernetes EndpointSlices (discovery.k8s.io/v1): the state, no I/O.

`SliceSet` holds the EndpointSlices a label selector matches, as a list and the watch events
after it leave them (ADDED, MODIFIED, DELETED; BOOKMARK only moves the resourceVersion), and
turns them into the pool's workers: one per *ready* endpoint (`conditions.ready` true or
absent, which the API defines as ready; a terminating pod's endpoint is not ready), at its
first address and the configured port. gateway/discovery_k8s.py drives it from the API
server and hands the workers to `Fleet.set_discovered`, the same diff a reload applies.

A worker's name is `<pod>@<address>:<port>` (`<address>:<port>` without a pod): a pod that
comes back at another address is another worker, so a change of address never clashes
with the worker still draining at the old one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gateway.config import KubernetesDiscovery, Worker, header_safe

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})


class SliceError(ValueError):
    """An answer from the API server that is not what discovery.k8s.io/v1 sends."""


class SliceSet:
    """The EndpointSlices one selector matches, by name, and the resourceVersion they are
    as of (a watch resumes from it)."""

    def __init__(self) -> None:
        self.slices: dict[str, Mapping[str, Any]] = {}
        self.resource_version: str | None = None

    def replace(self, listing: Mapping[str, Any]) -> None:
        """A list answer (an EndpointSliceList): the whole state."""
        if not isinstance(listing, Mapping) or not isinstance(listing.get("items") or [], list):
            raise SliceError("a list answer is an object with an `items` list")
        slices = {}
        for item in listing.get("items") or ():
            slices[_name(item)] = item
        self.slices = slices
        self.resource_version = _rv(listing)

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event (not ERROR: the caller handles that)."""
        kind, obj = event.get("type"), event.get("object")
        if kind not in EVENT_TYPES or not isinstance(obj, Mapping):
            raise SliceError(f"a watch event of type {kind!r} (keys {sorted(event)[:5]})")
        rv = _rv(obj)
        if kind == "BOOKMARK":
            self.resource_version = rv or self.resource_version
            return
        name = _name(obj)
        if kind == "DELETED":
            self.slices.pop(name, None)
        else:
            self.slices[name] = obj
        self.resource_version = rv or self.resource_version

    def workers(self, spec: KubernetesDiscovery) -> tuple[Worker, ...]:
        """The ready endpoints of every slice, as workers (sorted by name, each once)."""
        found: dict[str, Worker] = {}
        for obj in self.slices.values():
            for w in slice_workers(obj, spec):
                found.setdefault(w.id, w)
        return tuple(found[k] for k in sorted(found))


def slice_workers(obj: Mapping[str, Any], spec: KubernetesDiscovery) -> Iterable[Worker]:
    port = _port(obj, spec.port)
    if port is None:
        return
    ipv6 = obj.get("addressType") == "IPv6"
    for ep in obj.get("endpoints") or ():
        if not isinstance(ep, Mapping):
            continue
        conditions = ep.get("conditions") or {}
        if conditions.get("ready") is False:  # absent (nil) means ready
            continue
        addresses = ep.get("addresses") or ()
        if not addresses or not isinstance(addresses[0], str):
            continue
        # "clients may choose to only use the first element" (the API's own words)
        host = f"[{addresses[0]}]" if ipv6 else addresses[0]
        ref = ep.get("targetRef") or {}
        pod = ref.get("name") if isinstance(ref, Mapping) else None
        name = f"{pod}@{host}:{port}" if isinstance(pod, str) and pod else f"{host}:{port}"
        if not header_safe(name):
            continue
        yield Worker(
            url=f"{spec.scheme}://{host}:{port}",
            engine=spec.engine,
            name=name,
            api_key=spec.api_key,
        )


def _port(obj: Mapping[str, Any], want: int | str) -> int | None:
    if isinstance(want, int):
        return want
    for p in obj.get("ports") or ():
        if isinstance(p, Mapping) and p.get("name") == want and isinstance(p.get("port"), int):
            return int(p["port"])
    return None


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise SliceError("an EndpointSlice without metadata.name")
    return name


def _rv(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return rv if isinstance(rv, str) and rv else None
