import pytest

from tests.e2e.fleet import Fleet, start_fleet
from tests.procs import procs


@pytest.fixture(scope="module")
def fleet():
    with procs() as ps:
        yield start_fleet(ps)


@pytest.fixture
def fresh_procs():
    with procs() as ps:
        yield ps


__all__ = ["Fleet"]
