"""Run an experiment's independent, seeded jobs: on a local process pool by default, on Ray
when an address is given (`ray="auto"`, `"ray://host:10001"`, `"local"` for a fresh local
instance). Each job carries its own seed and the function is pure in it, so the rows are
the same either way, in the order of `jobs`.

Ray is an optional extra (`pip install fleetgate[ray]`): only imported when asked for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

J = TypeVar("J")
R = TypeVar("R")


def run_jobs(
    fn: Callable[[J], R], jobs: Sequence[J], workers: int = 2, ray: str | None = None
) -> list[R]:
    """`[fn(j) for j in jobs]`, in parallel. `fn` and the jobs must pickle (a module-level
    function, frozen dataclasses)."""
    if ray is not None:
        return _on_ray(fn, jobs, ray)
    if workers <= 1 or len(jobs) <= 1:
        return [fn(j) for j in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(fn, jobs, chunksize=1))


def _on_ray(fn: Callable[[J], R], jobs: Sequence[J], address: str) -> list[R]:
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError("--ray needs the optional extra: pip install 'fleetgate[ray]'") from e
    started = not ray.is_initialized()
    if started:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address == "local":
            # a fresh instance on this machine: its workers import what the driver does
            kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}}
        else:  # a cluster's workers must have this package installed
            kwargs["address"] = address
        ray.init(**kwargs)
    try:
        remote = ray.remote(fn)
        return list(ray.get([remote.remote(j) for j in jobs]))
    finally:
        if started:
            ray.shutdown()
