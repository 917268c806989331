"""Workers found in Kubernetes appear and disappear under load, and every request is answered.

No cluster runs here: the gateway process watches a stand-in API server on 127.0.0.1
(tests/k8s_apiserver.py) that serves EndpointSlice list and watch answers in the API
server's shapes (written to the API reference, not recorded from a cluster) — ADDED /
MODIFIED / DELETED events, and an ERROR 410 Gone after a
compaction that forces a re-list — through a kubeconfig file, with the real
kubernetes_asyncio client. The workers are emulator processes; each "pod" is one slice
whose named port `http` is the emulator's port (every emulator listens on 127.0.0.1).

A pod leaving follows Kubernetes' order: its endpoint goes (or turns not ready) first, the
process stops only once the gateway has drained it (a pod's grace period).
"""

from __future__ import annotations

import threading
from collections import Counter

import httpx
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway, wait_until
from tests.k8s_apiserver import StandInApiServer, endpoint
from tests.procs import Proc

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
pytest.importorskip("kubernetes_asyncio")

KEY = "admin-secret"
ADMIN = {"authorization": f"Bearer {KEY}"}
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
LABELS = {"kubernetes.io/service-name": "vllm-llama"}
MAX_REQUESTS = 20_000  # the load's bound; the test ends it well before (asserted)


def _id(pod: str, p: Proc) -> str:
    return f"{pod}@127.0.0.1:{p.port}"


def _active(gw: Proc) -> set[str]:
    r = httpx.get(gw.url + "/admin/workers", headers=ADMIN, timeout=5)
    assert r.status_code == 200, r.text
    return {w["id"] for w in r.json()["data"] if w["state"] == "active"}


def _listed(gw: Proc) -> set[str]:
    r = httpx.get(gw.url + "/admin/workers", headers=ADMIN, timeout=5)
    return {w["id"] for w in r.json()["data"]}


class Load:
    """Clients sending requests one after another until stopped (at most MAX_REQUESTS)."""

    def __init__(self, url: str, threads: int = 6) -> None:
        self.url = url
        self.stop = threading.Event()
        self.sent = 0
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []
        self.workers: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                with self.lock:
                    if self.sent >= MAX_REQUESTS:
                        return
                    self.sent += 1
                try:
                    r = client.post(self.url + "/v1/chat/completions", json=BODY)
                except httpx.HTTPError as exc:
                    with self.lock:
                        self.failures.append(repr(exc))
                    continue
                with self.lock:
                    self.statuses[r.status_code] += 1
                    if r.status_code == 200:
                        self.workers[r.headers["x-fleetgate-worker"]] += 1
                    else:
                        self.failures.append(f"{r.status_code} {r.text[:200]}")

    def served_by(self, worker: str) -> int:
        with self.lock:
            return self.workers[worker]

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def test_discovered_workers_come_and_go_under_load_and_every_request_is_answered(fresh_procs):
    emus = [emulator(fresh_procs, f"pod{i}", 8192) for i in range(4)]
    for e in emus:
        e.wait_ready()
    e0, e1, e2, e3 = emus
    with StandInApiServer() as api:

        def pod(name: str, p: Proc, **conditions: bool) -> None:
            api.put_slice(
                f"vllm-llama-{name}", [endpoint(name, "127.0.0.1", **conditions)],
                port=p.port, labels=LABELS,
            )  # fmt: skip

        pod("pod0", e0)
        cfg = gateway_config([], [], auth={"admin_key": KEY}, listen={"reload_poll_s": 0})
        cfg["pools"] = {
            "short": {
                "max_model_len": 8192,
                "models": [MODEL],
                "discovery": {
                    "kind": "kubernetes",
                    "namespace": "llm",
                    "selector": "kubernetes.io/service-name=vllm-llama",
                    "port": "http",
                    "kubeconfig": str(api.kubeconfig(fresh_procs.dir / "kubeconfig")),
                    "retry_s": 0.1,
                },
            }
        }
        gw = start_gateway(fresh_procs, cfg)
        assert wait_until(lambda: _active(gw) == {_id("pod0", e0)})
        assert wait_until(lambda: httpx.get(gw.url + "/readyz").status_code == 200)

        with Load(gw.url) as load:
            assert wait_until(lambda: load.served_by(_id("pod0", e0)) > 10)
            # scale up: two pods become ready
            pod("pod1", e1)
            pod("pod2", e2, ready=False)  # started, not ready yet: no traffic
            assert wait_until(lambda: load.served_by(_id("pod1", e1)) > 10)
            assert _id("pod2", e2) not in _listed(gw)
            pod("pod2", e2)
            assert wait_until(lambda: load.served_by(_id("pod2", e2)) > 10)

            # pod0 is deleted: its slice goes, it drains, then its process stops
            api.delete_slice("vllm-llama-pod0")
            assert wait_until(lambda: _id("pod0", e0) not in _listed(gw), timeout=15)
            e0.stop()

            # pod1 terminates: ready false / terminating true, then the process stops
            pod("pod1", e1, ready=False, terminating=True)
            assert wait_until(lambda: _id("pod1", e1) not in _listed(gw), timeout=15)
            e1.stop()

            # the API server compacts: the watch gets 410 Gone, the gateway lists again and
            # finds what changed meanwhile (pod3 ready)
            lists = api.count("list")
            api.compact()
            pod("pod3", e3)
            assert wait_until(lambda: api.count("list") > lists, timeout=15)
            assert wait_until(lambda: load.served_by(_id("pod3", e3)) > 10, timeout=15)
            assert _active(gw) == {_id("pod2", e2), _id("pod3", e3)}
            text = httpx.get(gw.url + "/metrics", timeout=5).text
            events = {
                e: metric(text, "fleetgate_discovery_events_total", pool="short", event=e)
                for e in ("list", "gone", "error", "applied")
            }
            assert events["list"] == api.count("list") and events["gone"] >= 1
            assert events["error"] == 0 and events["applied"] >= 5
            ended_by_test = not load.stop.is_set() and load.sent < MAX_REQUESTS
        assert ended_by_test, "the load's bound ran out before the changes were made"
        assert load.failures == [], load.failures[:5]
        assert set(load.statuses) == {200}
        answered = sum(load.statuses.values())
        assert answered == load.sent and answered > 50
        assert set(load.workers) == {
            _id(p, e) for p, e in zip(("pod0", "pod1", "pod2", "pod3"), emus, strict=True)
        }
