"""A redis-server on a free loopback port for the Redis store's tests (shared with the
store contract suite's fixture)."""

from tests.unit.policies.tenancy.conftest import redis_url  # noqa: F401
