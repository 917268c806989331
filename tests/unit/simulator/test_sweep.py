"""Sweeps (simulator/sweep.py): the same rows in process, on a process pool and on a local
Ray instance the test starts (skipped when the optional `ray` extra is not installed)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import pytest

from simulator.closed_loop import LoadShape, deal, simulate
from simulator.scenario import parse
from simulator.sweep import run_jobs
from tests.unit.simulator.test_closed_loop import SCENARIO, specs


@dataclass(frozen=True)
class Job:
    clients: int
    seed: int
    routing: str


def one(job: Job) -> dict[str, Any]:
    doc = {**SCENARIO, "policy": {**SCENARIO["policy"], "routing": {"policy": job.routing}}}
    shape = LoadShape(job.clients, think_s=0.1, requests=60, seed=job.seed)
    result, _ = simulate(parse(doc, "sweep"), shape, deal(specs(150, job.seed), job.clients))
    return {
        "job": (job.clients, job.seed, job.routing),
        "ends": [(r.id, r.arrival, r.finish, r.worker) for r in result.records],
    }


JOBS = [Job(n, s, r) for n in (3, 8) for s in (1, 2) for r in ("least_loaded", "power_of_two")]


def test_a_process_pool_gives_the_rows_of_a_serial_run() -> None:
    assert run_jobs(one, JOBS, workers=2) == [one(j) for j in JOBS]


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="ray is an optional extra (pip install 'fleetgate[ray]'): not installed here",
)
@pytest.mark.timeout(300)
def test_ray_gives_the_rows_of_a_process_pool() -> None:
    assert run_jobs(one, JOBS, ray="local") == run_jobs(one, JOBS, workers=2)
