"""Session affinity: a session's requests go to the same worker — consistent hashing with
bounded loads (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads");
docs/CACHE_ROUTING.md.

The session key is `RequestInfo.session` (the gateway fills it from a header or the
request's `user` field). Each worker owns `vnodes` points on a 64-bit ring (BLAKE2b of
"<worker id>#<i>", stable across processes and replicas); a key goes to the first worker
clockwise from its own point that is under the load bound

    load_j + 1 ≤ ⌈c · (Σ_k load_k + 1) / n⌉          (c = `balance`, default 1.25)

so no worker takes more than c times the mean, and a worker joining or leaving moves only
the keys it owned (about 1/n of them). A request without a session routes least-loaded.

As a profile: the default filters → `bounded_load(c)` → `RingDistance` (the clockwise
distance from the key's point to the worker's nearest point, so the lowest is the first
worker met walking the ring) → `LowestScore`.
Reads: `healthy`, `stale`, `has_room`'s fields, `running`, `waiting`, `in_flight`.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from policies.protocols.routing import config_from, register
from policies.routing.least_loaded import least_loaded
from policies.routing.profile import DEFAULT_FILTERS, Filter, LowestScore, Profile
from policies.types import RequestInfo, WorkerView

_RING = 1 << 64


def ring_point(key: str) -> int:
    """A key's point on the ring: BLAKE2b-64, the same in every process."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")


def bounded_load(balance: float) -> Filter:
    """Workers whose load, with one more request, stays within `balance` × the mean."""

    def keep(request: RequestInfo, workers: list[WorkerView]) -> list[WorkerView]:
        if not workers:
            return workers
        total = sum(w.load for w in workers) + 1
        cap = math.ceil(balance * total / len(workers))
        kept = [w for w in workers if w.load + 1 <= cap]
        return kept or workers  # never empty at balance ≥ 1; belt and braces

    keep.__name__ = f"bounded_load({balance})"
    return keep


@dataclass(slots=True)
class RingDistance:
    """Scorer: clockwise distance on the ring from the request's session key to the
    worker's nearest point, as a fraction of the ring (lower is better); 0 without key."""

    vnodes: int = 64
    name: str = "session_affinity"
    _points: dict[str, list[int]] = field(default_factory=dict)
    _key: tuple[str, int] = ("", 0)  # the last session key and its point

    def points(self, worker: str) -> list[int]:
        got = self._points.get(worker)
        if got is None:
            if len(self._points) > 4096:  # workers come and go: keep the cache bounded
                self._points.clear()
            got = self._points[worker] = sorted(
                ring_point(f"{worker}#{i}") for i in range(self.vnodes)
            )
        return got

    def score(self, request: RequestInfo, worker: WorkerView) -> float:
        key = request.session
        if not key:
            return 0.0
        if self._key[0] != key:
            self._key = (key, ring_point(key))
        at = self._key[1]
        points = self.points(worker.id)
        i = bisect.bisect_left(points, at)
        nearest = points[i] if i < len(points) else points[0] + _RING
        return (nearest - at) / _RING


@dataclass(frozen=True, slots=True)
class SessionAffinityConfig:
    balance: float = 1.25  # c: no worker above c × the mean load (1 + ε in the paper)
    vnodes: int = 64  # ring points per worker

    def __post_init__(self) -> None:
        if not 1.0 <= self.balance < float("inf"):
            raise ValueError("balance: must be finite and >= 1")
        if self.vnodes < 1:
            raise ValueError("vnodes: must be >= 1")


@dataclass(slots=True)
class SessionAffinityRouter:
    # what a driver fills for it before Core.start (policies/build.py request_fields)
    request_fields: ClassVar[tuple[str, ...]] = ("session",)
    config: SessionAffinityConfig
    name: str = "session_affinity"
    fallback: Profile = field(default_factory=least_loaded)
    _profile: Profile = field(init=False)

    def __post_init__(self) -> None:
        c = self.config
        filters = (*DEFAULT_FILTERS, bounded_load(c.balance))
        self._profile = Profile(self.name, LowestScore(), ((RingDistance(c.vnodes), 1.0),), filters)

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        if not request.session:
            return self.fallback.choose(request, candidates)
        return self._profile.choose(request, candidates)


NAME = "session_affinity"


@register(NAME)
def _factory(params: Mapping[str, Any]) -> SessionAffinityRouter:
    return SessionAffinityRouter(config_from(SessionAffinityConfig, params))
