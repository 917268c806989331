"""Live fleet changes (gateway/workers.py): add, drain, remove, apply a new configuration."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.config import ConfigError, GatewayConfig, Worker, live_merge, load_config
from gateway.metrics import GatewayMetrics
from gateway.periodic import PerWorkerLoops
from gateway.workers import Fleet, FleetError, WorkerState
from policies.leases import WorkerSlot


def _pool(*ports: int, max_model_len: int = 8192) -> dict[str, Any]:
    return {
        "max_model_len": max_model_len,
        "models": ["m"],
        "workers": [{"url": f"http://127.0.0.1:{p}"} for p in ports],
    }


def _config(**pools: dict[str, Any]) -> GatewayConfig:
    return load_config(data={"pools": pools}, environ={})


class Recorder:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []

    def worker_added(self, worker: WorkerState) -> None:
        self.added.append(worker.id)

    def worker_removed(self, worker: WorkerState) -> None:
        self.removed.append(worker.id)


def _fleet() -> tuple[Fleet, Recorder]:
    fleet = Fleet(_config(short=_pool(9, 10)))
    rec = Recorder()
    fleet.listeners.append(rec)
    return fleet, rec


def _routed(fleet: Fleet, pool: str = "short") -> set[str]:
    return {v.id for v in fleet.views(pool, 0.0)}


def test_an_added_worker_is_routed_and_its_listeners_hear_of_it():
    fleet, rec = _fleet()
    state = fleet.add_worker("short", Worker(url="http://127.0.0.1:11", name="new"))
    assert state.pool == "short" and state.max_model_len == 8192
    assert _routed(fleet) == {"127.0.0.1:9", "127.0.0.1:10", "new"}
    assert rec.added == ["new"]


def test_add_refuses_an_unknown_pool_and_a_duplicate_id_naming_the_field():
    fleet, rec = _fleet()
    with pytest.raises(FleetError) as bad_pool:
        fleet.add_worker("nope", Worker(url="http://127.0.0.1:11"))
    assert bad_pool.value.status == 400 and bad_pool.value.param == "pool"
    with pytest.raises(FleetError) as dup:
        fleet.add_worker("short", Worker(url="http://127.0.0.1:9"))
    assert dup.value.status == 409 and dup.value.param == "name"
    assert rec.added == [] and len(fleet.workers) == 2


def test_a_draining_worker_is_never_routed_and_leaves_after_its_last_request():
    fleet, rec = _fleet()
    w = fleet.workers["127.0.0.1:9"]
    slots = [WorkerSlot(w, 10), WorkerSlot(w, 10)]
    fleet.drain_worker(w.id)
    assert w.draining and w.id in fleet.workers  # still there: two requests in flight
    for _ in range(100):
        assert _routed(fleet) == {"127.0.0.1:10"}
    assert fleet.live_pools(10.0) == frozenset({"short"})
    slots[0].release()
    fleet.released(w)
    assert w.id in fleet.workers and rec.removed == []
    slots[1].release()
    fleet.released(w)
    assert w.id not in fleet.workers and rec.removed == [w.id]
    assert [x.id for x in fleet.pools["short"]] == ["127.0.0.1:10"]
    fleet.released(w)  # once more: nothing
    assert rec.removed == [w.id]


def test_an_idle_worker_is_removed_at_once_and_an_unknown_one_is_404():
    fleet, rec = _fleet()
    fleet.remove_worker("127.0.0.1:10")
    assert "127.0.0.1:10" not in fleet.workers and rec.removed == ["127.0.0.1:10"]
    with pytest.raises(FleetError) as missing:
        fleet.remove_worker("127.0.0.1:10")
    assert missing.value.status == 404


def test_a_pool_whose_workers_all_drain_is_down_for_placement_and_readiness():
    fleet, _ = _fleet()
    for w in list(fleet.workers.values()):
        w.proven = True
        WorkerSlot(w, 1)  # held: the workers stay, draining
        fleet.drain_worker(w.id)
    assert fleet.live_pools(1.0) == frozenset()
    assert not fleet.any_routable(1.0) and not fleet.any_ready(1.0)
    assert fleet.active_counts() == {"short": 0}


def test_apply_adds_drains_and_keeps_workers_untouched():
    fleet, rec = _fleet()
    kept = fleet.workers["127.0.0.1:10"]
    kept.open_until = 99.0  # breaker state and telemetry survive
    kept.telemetry.running = 7
    WorkerSlot(kept, 5)
    leaving = fleet.workers["127.0.0.1:9"]
    WorkerSlot(leaving, 5)
    diff = fleet.apply(
        _config(short=_pool(10, 11), long=_pool(12, max_model_len=65536)).model_copy()
    )
    assert set(diff.added) == {"127.0.0.1:11", "127.0.0.1:12"}
    assert diff.draining == ("127.0.0.1:9",) and diff.kept == ("127.0.0.1:10",)
    assert diff.pools_added == ("long",)
    assert fleet.workers["127.0.0.1:10"] is kept
    assert kept.open_until == 99.0 and kept.telemetry.running == 7 and kept.in_flight == 1
    assert leaving.draining and "127.0.0.1:9" not in _routed(fleet)
    assert _routed(fleet, "long") == {"127.0.0.1:12"}
    assert fleet.models == {"m": 65536}
    assert sorted(rec.added) == ["127.0.0.1:11", "127.0.0.1:12"]
    assert rec.removed == []
    leaving.in_flight = 0
    fleet.released(leaving)
    assert rec.removed == ["127.0.0.1:9"]


def test_apply_removes_a_pool_once_its_workers_are_gone():
    fleet = Fleet(_config(short=_pool(9), long=_pool(12, max_model_len=65536)))
    w = fleet.workers["127.0.0.1:12"]
    WorkerSlot(w, 1)
    diff = fleet.apply(_config(short=_pool(9)))
    assert diff.pools_removed == ("long",)
    assert [s.name for s in fleet.specs] == ["short"]  # placement no longer sees it
    assert fleet.views("long", 0.0) == [] and "long" not in fleet.live_pools(1.0)
    assert "long" in fleet.pools  # until its last worker leaves
    w.in_flight = 0
    fleet.released(w)
    assert "long" not in fleet.pools and set(fleet.workers) == {"127.0.0.1:9"}


def test_apply_refuses_a_changed_worker_under_the_same_id_and_changes_nothing():
    fleet, rec = _fleet()
    changed = _config(
        short={
            "max_model_len": 8192,
            "models": ["m"],
            "workers": [
                {"url": "http://127.0.0.1:13"},
                {"url": "http://127.0.0.1:14", "name": "127.0.0.1:10"},
            ],
        }
    )
    with pytest.raises(FleetError) as exc:
        fleet.apply(changed)
    assert exc.value.param == "pools.short.workers.1"
    assert "pools.short.workers.1" in str(exc.value)
    assert set(fleet.workers) == {"127.0.0.1:9", "127.0.0.1:10"}
    assert rec.added == [] and not any(w.draining for w in fleet.workers.values())


def test_apply_brings_back_a_draining_worker_that_is_configured_again():
    fleet, _ = _fleet()
    w = fleet.workers["127.0.0.1:9"]
    WorkerSlot(w, 1)
    fleet.drain_worker(w.id)
    fleet.apply(_config(short=_pool(9, 10)))
    assert not w.draining and "127.0.0.1:9" in _routed(fleet)


def test_removed_worker_label_sets_stop_being_exported():
    fleet = Fleet(_config(short=_pool(9, 10)))
    metrics = GatewayMetrics(fleet, lambda: 0.0)
    fleet.listeners.append(metrics)
    for wid in fleet.workers:
        metrics.scrape_errors.labels(wid, "timeout").inc()
        metrics.health_failures.labels(wid).inc()
        metrics.upstream_errors.labels("short", wid, "connect").inc()
        metrics.circuit_opens.labels(wid).inc()
    fleet.remove_worker("127.0.0.1:9")
    text = metrics.render().decode()
    assert '"127.0.0.1:9"' not in text
    assert text.count('"127.0.0.1:10"') >= 4


async def test_per_worker_loops_start_and_stop_with_the_worker():
    fleet, _ = _fleet()
    probed: list[str] = []

    async def probe(w: WorkerState) -> None:
        probed.append(w.id)

    loops = PerWorkerLoops(list(fleet.workers.values()), 0.01, probe)
    loops.start()
    added = fleet.add_worker("short", Worker(url="http://127.0.0.1:11"))
    loops.add(added)
    await asyncio.sleep(0.05)
    assert loops.running() == {"127.0.0.1:9", "127.0.0.1:10", "127.0.0.1:11"}
    assert "127.0.0.1:11" in probed
    gone = fleet.workers["127.0.0.1:9"]
    fleet.remove_worker(gone.id)
    loops.remove(gone)
    await asyncio.sleep(0.02)
    before = probed.count(gone.id)
    await asyncio.sleep(0.05)
    assert probed.count(gone.id) == before
    assert loops.running() == {"127.0.0.1:10", "127.0.0.1:11"}
    await loops.stop()
    assert loops.running() == frozenset()


def test_live_merge_applies_only_the_fleet_and_lists_the_other_changes():
    running = load_config(
        data={"pools": {"short": _pool(9)}, "breaker": {"failures": 3}}, environ={}
    )
    new = load_config(
        data={"pools": {"short": _pool(9, 10)}, "breaker": {"failures": 5}}, environ={}
    )
    merged, not_applied = live_merge(running, new)
    assert len(merged.pools["short"].workers) == 2
    assert merged.breaker.failures == 3 and not_applied == ["breaker.failures"]


def test_live_merge_refuses_what_the_running_placement_cannot_take():
    running = _config(short=_pool(9))
    with pytest.raises(ConfigError, match=r"placement\.short_pool"):
        live_merge(
            running,
            load_config(
                data={"pools": {"other": _pool(9)}, "placement": {"short_pool": "other"}},
                environ={},
            ),
        )
    with pytest.raises(ConfigError, match=r"pools\.short\.max_model_len"):
        live_merge(running, _config(short=_pool(9, max_model_len=4096)))


async def test_the_upstream_client_forgets_an_idle_endpoint_only():
    from gateway.upstream import Endpoint, UpstreamClient

    client = UpstreamClient()
    try:
        ep = Endpoint.from_url("http://127.0.0.1:9")
        assert not client.forget(ep)  # never used
        client._pool(ep)
        assert client.forget(ep) and ep not in client._pools
    finally:
        await client.close()
