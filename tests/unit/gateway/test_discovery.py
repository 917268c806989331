"""Kubernetes discovery (gateway/discovery.py, gateway/discovery_k8s.py) against a stand-in
API server.

No cluster runs here: tests/k8s_apiserver.py serves EndpointSlice list and watch answers in
the API server's shapes (resourceVersion, ADDED / MODIFIED / DELETED / BOOKMARK events, and
the ERROR event with a 410 Gone Status that forces a re-list), from an EndpointSlice with the
fields the EndpointSlice controller writes (tests/data/k8s/endpointslice.json; written to the
API reference, not recorded: no cluster was at hand). The client is the
real kubernetes_asyncio, configured from a kubeconfig file; the fleet is the gateway's own
`Fleet`, so a change goes through the same diff as a configuration reload.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.config import GatewayConfig, KubernetesDiscovery, load_config
from gateway.discovery import SliceSet
from gateway.discovery_k8s import Discovery
from gateway.workers import Fleet
from tests.k8s_apiserver import StandInApiServer, endpoint

pytest.importorskip("kubernetes_asyncio")

LABELS = {"kubernetes.io/service-name": "vllm-llama", "model": "llama"}
SELECTOR = "kubernetes.io/service-name=vllm-llama"


def _config(kubeconfig: Path, **discovery: Any) -> GatewayConfig:
    return load_config(
        data={
            "pools": {
                "short": {
                    "max_model_len": 8192,
                    "models": ["llama"],
                    "discovery": {
                        "kind": "kubernetes",
                        "namespace": "llm",
                        "selector": SELECTOR,
                        "port": "http",
                        "kubeconfig": str(kubeconfig),
                        "retry_s": 0.05,
                        **discovery,
                    },
                }
            }
        }
    )


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def _active(fleet: Fleet) -> set[str]:
    return {w.id for w in fleet.workers.values() if not w.draining}


@pytest.fixture
def api() -> Any:
    with StandInApiServer() as server:
        yield server


@pytest.fixture
async def running(api: StandInApiServer, tmp_path: Path) -> AsyncIterator[tuple[Fleet, Discovery]]:
    cfg = _config(api.kubeconfig(tmp_path / "kubeconfig"))
    fleet = Fleet(cfg)
    disco = Discovery(fleet.set_discovered, lambda pool: fleet.discovered.pop(pool, None))
    disco.reconcile(cfg)
    yield fleet, disco
    await disco.stop()


async def test_ready_endpoints_join_and_removed_ones_drain_keeping_state(api, running):
    fleet, disco = running
    api.put_slice(
        "vllm-llama-a",
        [endpoint("vllm-0", "10.1.0.10"), endpoint("vllm-1", "10.1.0.11")],
        port=8000,
        labels=LABELS,
    )
    api.put_slice(  # another Service's slice: not selected
        "other-x", [endpoint("other-0", "10.9.0.1")], port=8000, labels={"app": "other"}
    )
    assert await disco.wait_synced(10)
    await _until(lambda: len(_active(fleet)) == 2)
    assert _active(fleet) == {"vllm-0@10.1.0.10:8000", "vllm-1@10.1.0.11:8000"}
    kept = fleet.workers["vllm-0@10.1.0.10:8000"]
    assert kept.url == "http://10.1.0.10:8000" and kept.engine == "vllm"
    assert kept.max_model_len == 8192
    # state the gateway holds about a kept worker survives every later change
    kept.telemetry.running = 7
    gone = fleet.workers["vllm-1@10.1.0.11:8000"]
    gone.in_flight = 1  # a request in flight on the worker that goes away
    # added: a second slice of the same Service (the controller splits large Services)
    api.put_slice("vllm-llama-b", [endpoint("vllm-2", "10.1.0.12")], port=8000, labels=LABELS)
    await _until(lambda: "vllm-2@10.1.0.12:8000" in _active(fleet))
    # removed: vllm-1 leaves the slice; it drains (out of routing, its request goes on)
    api.put_slice("vllm-llama-a", [endpoint("vllm-0", "10.1.0.10")], port=8000, labels=LABELS)
    await _until(lambda: gone.draining)
    assert fleet.workers.get(gone.id) is gone  # still there while its request runs
    assert gone.id not in {v.id for v in fleet.views("short", 0.0)}
    gone.in_flight = 0
    fleet.released(gone)
    assert gone.id not in fleet.workers
    # a whole slice deleted
    api.delete_slice("vllm-llama-b")
    await _until(lambda: _active(fleet) == {"vllm-0@10.1.0.10:8000"})
    assert fleet.workers["vllm-0@10.1.0.10:8000"] is kept and kept.telemetry.running == 7
    assert api.count("list") == 1  # all of it through one watch, no re-list


async def test_not_ready_and_terminating_endpoints_are_not_workers(api, running):
    fleet, disco = running
    api.put_slice(
        "vllm-llama-a",
        [
            endpoint("vllm-0", "10.1.0.10"),
            endpoint("vllm-1", "10.1.0.11", ready=False),  # starting: readiness probe failing
            endpoint("vllm-2", "10.1.0.12", ready=False, terminating=True),  # shutting down
        ],
        port=8000,
        labels=LABELS,
    )
    assert await disco.wait_synced(10)
    await _until(lambda: _active(fleet) == {"vllm-0@10.1.0.10:8000"})
    # vllm-1 becomes ready, vllm-0 starts terminating (ready false, serving true)
    api.put_slice(
        "vllm-llama-a",
        [
            endpoint("vllm-0", "10.1.0.10", ready=False, terminating=True),
            endpoint("vllm-1", "10.1.0.11"),
        ],
        port=8000,
        labels=LABELS,
    )
    await _until(lambda: _active(fleet) == {"vllm-1@10.1.0.11:8000"})


async def test_410_gone_forces_a_relist_that_sees_what_the_watch_missed(api, running):
    fleet, disco = running
    api.put_slice("vllm-llama-a", [endpoint("vllm-0", "10.1.0.10")], port=8000, labels=LABELS)
    api.put_slice("vllm-llama-b", [endpoint("vllm-1", "10.1.0.11")], port=8000, labels=LABELS)
    assert await disco.wait_synced(10)
    await _until(lambda: len(_active(fleet)) == 2)
    assert api.count("list") == 1
    # history compacted while the gateway watches: the watch ends with ERROR 410 Expired,
    # and the change made meanwhile (slice b deleted, a third pod) is only in a new list
    api.compact()
    api.delete_slice("vllm-llama-b")
    api.put_slice(
        "vllm-llama-a",
        [endpoint("vllm-0", "10.1.0.10"), endpoint("vllm-3", "10.1.0.13")],
        port=8000,
        labels=LABELS,
    )
    await _until(lambda: api.count("list") >= 2)
    await _until(lambda: _active(fleet) == {"vllm-0@10.1.0.10:8000", "vllm-3@10.1.0.13:8000"})
    # and the watch resumed after the list: later events arrive without another list
    lists = api.count("list")
    api.put_slice("vllm-llama-c", [endpoint("vllm-4", "10.1.0.14")], port=8000, labels=LABELS)
    await _until(lambda: "vllm-4@10.1.0.14:8000" in _active(fleet))
    assert api.count("list") == lists


async def test_a_watch_resumes_from_the_bookmark_without_a_relist(api, tmp_path):
    cfg = _config(api.kubeconfig(tmp_path / "kubeconfig"), watch_timeout_s=1)
    fleet = Fleet(cfg)
    disco = Discovery(fleet.set_discovered, lambda pool: None)
    disco.reconcile(cfg)
    try:
        api.put_slice("vllm-llama-a", [endpoint("vllm-0", "10.1.0.10")], port=8000, labels=LABELS)
        assert await disco.wait_synced(10)
        api.bookmark()
        watch = disco.watches["short"][0]
        await _until(lambda: watch.slices.resource_version == str(api.rv))
        # the server ends each watch after timeoutSeconds=1: the next starts at the bookmark
        await _until(lambda: any(r["rv"] == str(api.rv) for r in api.requests[1:]), 5)
        assert api.count("list") == 1
        assert _active(fleet) == {"vllm-0@10.1.0.10:8000"}
    finally:
        await disco.stop()


async def test_missing_credentials_are_retried_and_a_reload_can_fix_the_spec(api, tmp_path):
    cfg = _config(api.kubeconfig(tmp_path / "kubeconfig"))
    late = tmp_path / "late-kubeconfig"
    fleet = Fleet(cfg)
    disco = Discovery(fleet.set_discovered, lambda pool: None)
    disco.reconcile(_config(late))  # not there yet (a secret not mounted yet): retried
    try:
        assert not await disco.wait_synced(0.3)
        assert _active(fleet) == set()
        api.put_slice("vllm-llama-a", [endpoint("vllm-0", "10.1.0.10")], port=8000, labels=LABELS)
        api.kubeconfig(late)
        await _until(lambda: _active(fleet) == {"vllm-0@10.1.0.10:8000"})
        # a reload that changes the spec starts a new watch (the old one stops)
        old_task = disco.watches["short"][1]
        disco.reconcile(cfg)
        assert disco.watches["short"][1] is not old_task
        await _until(old_task.done)
        api.put_slice("vllm-llama-b", [endpoint("vllm-1", "10.1.0.11")], port=8000, labels=LABELS)
        await _until(lambda: "vllm-1@10.1.0.11:8000" in _active(fleet))
    finally:
        await disco.stop()


async def test_a_wrong_token_is_refused_and_retried_keeping_the_workers(api, running, tmp_path):
    """The API server's 401 (what a wrong or expired token gets) is an error like any other:
    the workers found so far stay; discovery lists again with backoff."""
    fleet, disco = running
    api.put_slice("vllm-llama-a", [endpoint("vllm-0", "10.1.0.10")], port=8000, labels=LABELS)
    assert await disco.wait_synced(10)
    await _until(lambda: len(_active(fleet)) == 1)
    import tests.k8s_apiserver as stand_in

    lists = api.count("list")
    old = stand_in.TOKEN
    stand_in.TOKEN = "rotated"  # the gateway's token no longer matches
    try:
        api.compact()  # the watch ends (410) and the next list is refused (401)
        await _until(lambda: api.count("list") >= lists + 2)
        assert _active(fleet) == {"vllm-0@10.1.0.10:8000"}
    finally:
        stand_in.TOKEN = old


async def test_a_reload_without_discovery_forgets_the_discovered_workers(api, running, tmp_path):
    fleet, disco = running
    api.put_slice("vllm-llama-a", [endpoint("vllm-0", "10.1.0.10")], port=8000, labels=LABELS)
    assert await disco.wait_synced(10)
    await _until(lambda: len(_active(fleet)) == 1)
    static = load_config(
        data={
            "pools": {
                "short": {
                    "max_model_len": 8192,
                    "models": ["llama"],
                    "workers": [{"url": "http://10.2.0.1:8000"}],
                }
            }
        }
    )
    diff = fleet.apply(static)
    disco.reconcile(static)
    assert diff.added == ("10.2.0.1:8000",) and diff.draining == ("vllm-0@10.1.0.10:8000",)
    assert disco.watches == {} and "short" not in fleet.discovered


# --- the pure part ---------------------------------------------------------------------------
def _spec(port: int | str = "http") -> KubernetesDiscovery:
    return KubernetesDiscovery(kind="kubernetes", namespace="llm", selector="a=b", port=port)


def _slice(name: str, eps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "5"},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8000}],
        "endpoints": eps,
        **extra,
    }


def test_slice_set_reads_the_api_shapes():
    s = SliceSet()
    s.replace({"metadata": {"resourceVersion": "7"}, "items": None})  # `items: null` = none
    assert s.slices == {} and s.resource_version == "7"
    no_conditions = {"addresses": ["10.0.0.1"]}  # absent `ready` means ready (the API's rule)
    no_pod = {"addresses": ["10.0.0.2"], "conditions": {"ready": True}}
    s.apply({"type": "ADDED", "object": _slice("a", [no_conditions, no_pod])})
    assert [w.id for w in s.workers(_spec())] == ["10.0.0.1:8000", "10.0.0.2:8000"]
    assert [w.url for w in s.workers(_spec(9000))] == [
        "http://10.0.0.1:9000",
        "http://10.0.0.2:9000",
    ]
    assert s.workers(_spec("grpc")) == ()  # no port of that name: no workers
    v6 = _slice("b", [{"addresses": ["fd00::1"]}], addressType="IPv6")
    s.apply({"type": "MODIFIED", "object": v6})
    assert "http://[fd00::1]:8000" in {w.url for w in s.workers(_spec())}
    # the same endpoint in two slices (the controller moving it) is one worker
    s.apply({"type": "ADDED", "object": _slice("c", [no_pod])})
    assert len(s.workers(_spec())) == 3
    s.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "99"}}})
    assert s.resource_version == "99" and len(s.slices) == 3
    s.apply({"type": "DELETED", "object": _slice("a", [])})
    assert {w.id for w in s.workers(_spec())} == {"10.0.0.2:8000", "[fd00::1]:8000"}


def test_discovery_config_is_validated_with_key_paths():
    base = {"max_model_len": 8192, "models": ["m"]}
    from gateway.config import ConfigError

    with pytest.raises(ConfigError, match=r"pools.short: workers: list at least one"):
        load_config(data={"pools": {"short": base}})
    bad = {
        "kind": "kubernetes",
        "namespace": "LLM",
        "selector": "",
        "port": 70000,
        "colour": 1,
    }
    with pytest.raises(ConfigError) as exc:
        load_config(data={"pools": {"short": {**base, "discovery": bad}}})
    text = str(exc.value)
    for key in ("namespace", "selector", "port", "colour"):
        assert f"pools.short.discovery.{key}:" in text, text
    with pytest.raises(ConfigError, match=r"pools.short.discovery.kind"):
        load_config(data={"pools": {"short": {**base, "discovery": {"kind": "consul"}}}})


def test_without_the_kubernetes_extra_the_config_is_refused_at_start(monkeypatch):
    import importlib.util

    from gateway.config import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "kubernetes_asyncio" else real(name, *a),
    )
    spec = {"kind": "kubernetes", "namespace": "llm", "selector": "a=b", "port": 8000}
    pool = {"max_model_len": 8192, "models": ["m"], "discovery": spec}
    with pytest.raises(ConfigError, match=r"pools.short.discovery: .*fleetgate\[kubernetes\]"):
        load_config(data={"pools": {"short": pool}})


async def test_a_reload_keeps_the_discovered_workers_and_their_state(api, running, tmp_path):
    """A reload applies the file's fleet (`Fleet.apply`, as gateway/reload.py does): the file
    lists no discovered worker, and they stay, kept with their state; a static worker the
    file adds joins beside them."""
    fleet, disco = running
    api.put_slice("vllm-llama-a", [endpoint("vllm-0", "10.1.0.10")], port=8000, labels=LABELS)
    assert await disco.wait_synced(10)
    await _until(lambda: len(_active(fleet)) == 1)
    kept = fleet.workers["vllm-0@10.1.0.10:8000"]
    kept.in_flight = 2
    data = _config(api.kubeconfig(tmp_path / "kubeconfig")).model_dump()
    data["pools"]["short"]["workers"] = [{"url": "http://10.2.0.1:8000"}]
    diff = fleet.apply(load_config(data=data, environ={}))
    assert diff.added == ("10.2.0.1:8000",) and diff.draining == ()
    assert diff.kept == ("vllm-0@10.1.0.10:8000",)
    assert fleet.workers["vllm-0@10.1.0.10:8000"] is kept and kept.in_flight == 2
    assert _active(fleet) == {"10.2.0.1:8000", "vllm-0@10.1.0.10:8000"}
