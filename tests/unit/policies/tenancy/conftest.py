"""Both entitlement stores behind one fixture: the in-memory one, and the Redis one against
a real redis-server this module starts on a free loopback port. Both run on a manual clock
(the Redis store passes it to its scripts instead of the server's TIME)."""

from __future__ import annotations

import uuid

import pytest

from policies.clock import ManualClock
from policies.tenancy.ledger import StoreConfig
from policies.tenancy.store import MemoryStore
from tests.procs import Procs


@pytest.fixture(scope="session")
def redis_url():
    ps = Procs()
    try:
        proc = ps.redis()
        yield f"redis://127.0.0.1:{proc.port}/0"
    finally:
        ps.close()


def make_store(kind: str, clock: ManualClock, url: str | None, config: StoreConfig):
    if kind == "memory":
        return MemoryStore(clock, config)
    from gateway.store_redis import RedisStore

    # a fresh key prefix per store: tests share one server, never each other's keys
    return RedisStore.from_url(
        url, timeout_s=2.0, config=config, clock=clock.now, prefix=f"t{uuid.uuid4().hex[:8]}"
    )


@pytest.fixture(params=["memory", "redis"])
def kind(request):
    return request.param


@pytest.fixture
def clock():
    return ManualClock(100.0)


@pytest.fixture
async def stores(kind, clock, request):
    """A factory: stores(config) → a store of this test's kind (closed at the end)."""
    made = []
    url = request.getfixturevalue("redis_url") if kind == "redis" else None

    def factory(config: StoreConfig | None = None):
        s = make_store(kind, clock, url, config or StoreConfig())
        made.append(s)
        return s

    yield factory
    for s in made:
        await s.close()
