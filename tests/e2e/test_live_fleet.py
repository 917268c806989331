"""Live fleet changes through real processes: the admin API (/admin/workers, /admin/reload)
and a configuration reload (SIGHUP), under steady load, without a failed request."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter

import httpx
import pytest
import yaml

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway, wait_until
from tests.procs import Proc, Procs

pytestmark = pytest.mark.e2e

KEY = "admin-secret"
ADMIN = {"authorization": f"Bearer {KEY}"}
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _id(p: Proc) -> str:
    return p.url.split("://")[1]


def _served(p: Proc) -> float:
    """The emulator's own count of requests it finished."""
    return metric(httpx.get(p.url + "/metrics", timeout=5).text, "vllm:request_success_total")


def _workers(gw: Proc) -> dict[str, dict[str, object]]:
    r = httpx.get(gw.url + "/admin/workers", headers=ADMIN, timeout=5)
    assert r.status_code == 200, r.text
    return {w["id"]: w for w in r.json()["data"]}


def _start(
    ps: Procs, n: int, *emulator_args: str, **overrides: object
) -> tuple[list[Proc], Proc, dict[str, object]]:
    emus = [emulator(ps, f"e{i}", 8192, *emulator_args) for i in range(n)]
    for e in emus:
        e.wait_ready()
    cfg = gateway_config([e.url for e in emus[:2]], [], auth={"admin_key": KEY}, **overrides)
    return emus, start_gateway(ps, cfg), cfg


# --- the admin API ----------------------------------------------------------------------------
def test_admin_workers_api(fresh_procs):
    emus, gw, _ = _start(fresh_procs, 3, listen={"reload_poll_s": 0})
    a, b, c = emus
    # behind the admin key
    assert httpx.get(gw.url + "/admin/workers").status_code == 403
    listed = _workers(gw)
    assert set(listed) == {_id(a), _id(b)}
    assert listed[_id(a)] == {
        "pool": "short",
        "id": _id(a),
        "url": a.url,
        "engine": "vllm",
        "state": "active",
        "healthy": True,
        "in_flight": 0,
    }
    # add: 201 with the worker; a duplicate is 409, bad input 400, each naming the field
    r = httpx.post(gw.url + "/admin/workers", headers=ADMIN, json={"pool": "short", "url": c.url})
    assert r.status_code == 201, r.text
    assert r.json()["id"] == _id(c) and r.json()["state"] == "active"
    dup = httpx.post(gw.url + "/admin/workers", headers=ADMIN, json={"pool": "short", "url": c.url})
    assert dup.status_code == 409
    assert dup.json()["error"]["param"] == "name"
    for body, param in (
        ({"pool": "nope", "url": c.url}, "pool"),
        ({"pool": "short", "url": "ftp://x"}, "url"),
        ({"pool": "short", "url": c.url, "colour": "red"}, "colour"),
        ({"url": c.url}, "pool"),
    ):
        bad = httpx.post(gw.url + "/admin/workers", headers=ADMIN, json=body)
        assert bad.status_code == 400, (body, bad.text)
        err = bad.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, err
    # the added worker serves
    seen = set()
    for _ in range(30):
        r = httpx.post(gw.url + "/v1/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 200
        seen.add(r.headers["x-fleetgate-worker"])
    assert _id(c) in seen
    # drain and delete answer 202 with the state; an idle worker leaves at once
    r = httpx.post(gw.url + f"/admin/workers/{_id(a)}/drain", headers=ADMIN)
    assert r.status_code == 202 and r.json()["state"] in ("draining", "removed")
    assert wait_until(lambda: _id(a) not in _workers(gw))
    r = httpx.delete(gw.url + f"/admin/workers/{_id(c)}", headers=ADMIN)
    assert r.status_code == 202 and r.json()["id"] == _id(c)
    assert wait_until(lambda: set(_workers(gw)) == {_id(b)})
    missing = httpx.delete(gw.url + f"/admin/workers/{_id(c)}", headers=ADMIN)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    # the removed workers' label sets are no longer exported
    text = httpx.get(gw.url + "/metrics").text
    assert f'worker="{_id(a)}"' not in text and f'worker="{_id(b)}"' in text
    # the routes are in the OpenAPI schema with typed models
    doc = httpx.get(gw.url + "/openapi.json").json()
    for path in ("/admin/workers", "/admin/workers/{worker_id}/drain", "/admin/reload"):
        assert path in doc["paths"], path
    for name in ("WorkerList", "WorkerInfo", "AddWorker", "DrainResult", "ReloadResult"):
        assert name in doc["components"]["schemas"], name


def test_admin_reload_reports_the_diff_and_refuses_a_bad_file(fresh_procs):
    emus, gw, _ = _start(fresh_procs, 3, listen={"reload_poll_s": 0})
    a, b, c = emus
    path = fresh_procs.dir / "gateway.yaml"
    new = gateway_config(
        [b.url, c.url],
        [],
        auth={"admin_key": KEY},
        listen={"reload_poll_s": 0, "port": 1},  # the --port flag still wins: no change
        breaker={"failures": 7},
    )
    path.write_text(yaml.safe_dump(new))
    r = httpx.post(gw.url + "/admin/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["added"] == [_id(c)] and body["draining"] == [_id(a)]
    assert body["kept"] == [_id(b)]
    assert body["not_applied"] == ["breaker.failures"]  # needs a restart: logged, not applied
    assert "breaker.failures" in gw.output()
    assert wait_until(lambda: set(_workers(gw)) == {_id(b), _id(c)})
    # a bad file: 400 naming the key path, the fleet unchanged, counted
    broken = gateway_config([b.url, "ftp://nowhere"], [], auth={"admin_key": KEY})
    path.write_text(yaml.safe_dump(broken))
    r = httpx.post(gw.url + "/admin/reload", headers=ADMIN, timeout=10)
    assert r.status_code == 400
    assert "pools.short.workers.1.url" in r.json()["error"]["message"]
    assert set(_workers(gw)) == {_id(b), _id(c)}
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_config_reloads_total", result="ok") == 1
    assert metric(text, "fleetgate_config_reloads_total", result="error") == 1


# --- the must-show: changes under steady load ------------------------------------------------
class Load:
    """A few client threads sending requests back to back; every status and worker kept."""

    def __init__(self, url: str, threads: int = 4) -> None:
        self.url = url
        self.stop = threading.Event()
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []
        self.workers: Counter[str] = Counter()
        self.first: dict[str, float] = {}  # monotonic time each worker's first answer arrived
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    r = client.post(self.url + "/v1/chat/completions", json=BODY)
                except httpx.HTTPError as exc:
                    with self.lock:
                        self.failures.append(repr(exc))
                    continue
                with self.lock:
                    self.statuses[r.status_code] += 1
                    if r.status_code == 200:
                        worker = r.headers["x-fleetgate-worker"]
                        self.workers[worker] += 1
                        self.first.setdefault(worker, time.monotonic())
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


@pytest.mark.slow
def test_fleet_changes_under_steady_load_drop_no_request(fresh_procs):
    """Two workers under load; one removed and one added through the admin API, then again
    through the file and SIGHUP, then a bad file: every request answers 200, the new
    workers serve, the removed ones get nothing once drained."""
    emus, gw, cfg = _start(fresh_procs, 4, listen={"reload_poll_s": 0})
    w0, w1, w2, w3 = emus
    path = fresh_procs.dir / "gateway.yaml"
    assert gw.popen is not None
    with Load(gw.url) as load:
        started = time.monotonic()
        assert wait_until(lambda: load.served_by(_id(w0)) > 20 and load.served_by(_id(w1)) > 20)

        # 1. through the admin API: add w2, remove w0
        added_at = time.monotonic()
        r = httpx.post(
            gw.url + "/admin/workers", headers=ADMIN, json={"pool": "short", "url": w2.url}
        )
        assert r.status_code == 201, r.text
        r = httpx.delete(gw.url + f"/admin/workers/{_id(w0)}", headers=ADMIN)
        assert r.status_code == 202 and r.json()["state"] in ("draining", "removed")
        assert wait_until(lambda: _id(w0) not in _workers(gw), timeout=15)
        time.sleep(0.3)  # the emulator's last answer is counted after it is sent
        w0_done = _served(w0)
        # the new worker serves (its first scrape and health check run when it joins)
        assert wait_until(lambda: load.served_by(_id(w2)) > 0, timeout=5)
        assert wait_until(lambda: _served(w2) > 0, timeout=5)
        print(f"w2 first answered {load.first[_id(w2)] - added_at:.3f} s after the add")

        # 2. through the file: w1 and w3 (w2 drained and removed, w3 added), SIGHUP
        new = dict(cfg)
        new["pools"] = gateway_config([w1.url, w3.url], [])["pools"]
        path.write_text(yaml.safe_dump(new))
        hup_at = time.monotonic()
        gw.popen.send_signal(signal.SIGHUP)
        assert wait_until(lambda: set(_workers(gw)) == {_id(w1), _id(w3)}, timeout=15)
        time.sleep(0.3)
        w2_done = _served(w2)
        assert wait_until(lambda: load.served_by(_id(w3)) > 0, timeout=5)
        print(f"w3 first answered {load.first[_id(w3)] - hup_at:.3f} s after SIGHUP")

        # 3. a bad file: refused, the fleet stays, requests still 200
        bad = dict(new)
        bad["pools"] = {"short": {**new["pools"]["short"], "max_model_len": -1}}  # type: ignore[index]
        path.write_text(yaml.safe_dump(bad))
        gw.popen.send_signal(signal.SIGHUP)
        assert wait_until(
            lambda: (
                metric(
                    httpx.get(gw.url + "/metrics").text,
                    "fleetgate_config_reloads_total",
                    result="error",
                )
                == 1
            )
        )
        assert set(_workers(gw)) == {_id(w1), _id(w3)}
        before = load.served_by(_id(w1)) + load.served_by(_id(w3))
        assert wait_until(lambda: load.served_by(_id(w1)) + load.served_by(_id(w3)) > before + 20)
        while time.monotonic() - started < 10:  # at least ~10 s of steady load in all
            time.sleep(0.1)

    print(f"requests: {dict(load.statuses)}, by worker: {dict(load.workers)}")
    assert load.failures == [], load.failures[:5]
    assert set(load.statuses) == {200}
    # the removed workers received nothing after their drain completed
    assert _served(w0) == w0_done
    assert _served(w2) == w2_done
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_config_reloads_total", result="ok") == 1
    assert metric(text, "fleetgate_config_reloads_total", result="error") == 1
    assert "pools.short.max_model_len" in gw.output()
    assert gw.popen.poll() is None  # SIGHUP did not end the process


def test_a_changed_file_is_reloaded_by_the_poll(fresh_procs):
    emus, gw, cfg = _start(fresh_procs, 3, listen={"reload_poll_s": 0.2})
    a, _, c = emus
    path = fresh_procs.dir / "gateway.yaml"
    new = dict(cfg)
    new["pools"] = gateway_config([a.url, c.url], [])["pools"]
    path.write_text(yaml.safe_dump(new))
    assert wait_until(lambda: set(_workers(gw)) == {_id(a), _id(c)})
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_config_reloads_total", result="ok") == 1
    # the file unchanged: no further reload
    time.sleep(0.6)
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_config_reloads_total", result="ok") == 1


def test_a_draining_worker_finishes_its_stream_then_leaves(fresh_procs):
    # engines in real time: 300 tokens take a few seconds, long enough to drain mid-stream
    emus, gw, _ = _start(fresh_procs, 2, "--time-scale", "1", listen={"reload_poll_s": 0})
    # ignore_eos: the emulator may end an answer early at EOS, before the drain is checked
    body = {**BODY, "max_tokens": 300, "stream": True, "ignore_eos": True}
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", gw.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        first = next(lines)
        assert first.startswith("data: ")
        busy = r.headers["x-fleetgate-worker"]
        other = ({_id(e) for e in emus} - {busy}).pop()
        d = httpx.post(gw.url + f"/admin/workers/{busy}/drain", headers=ADMIN)
        assert d.status_code == 202
        assert d.json() == {"id": busy, "pool": "short", "state": "draining", "in_flight": 1}
        assert _workers(gw)[busy]["state"] == "draining"
        # no new request goes to it while its stream runs
        for _ in range(5):
            n = httpx.post(gw.url + "/v1/chat/completions", json=BODY, timeout=10)
            assert n.status_code == 200 and n.headers["x-fleetgate-worker"] == other
        rest = list(lines)
    assert "data: [DONE]" in rest  # the stream ran to its end
    assert wait_until(lambda: busy not in _workers(gw))


def test_every_process_of_workers_n_reloads_the_changed_file(fresh_procs):
    """Under --workers 2 each process has its own fleet: the file poll reloads each."""
    emus = [emulator(fresh_procs, f"e{i}", 8192) for i in range(3)]
    for e in emus:
        e.wait_ready()
    a, b, c = emus
    cfg = gateway_config([a.url, b.url], [], auth={"admin_key": KEY}, listen={"reload_poll_s": 0.2})
    path = fresh_procs.dir / "multi.yaml"
    path.write_text(yaml.safe_dump(cfg))
    gw = fresh_procs.fleetgate(
        "multi", "serve", "--config", str(path), "--port", "{port}", "--workers", "2"
    ).wait_ready("/healthz")
    new = dict(cfg)
    new["pools"] = gateway_config([a.url, c.url], [])["pools"]
    path.write_text(yaml.safe_dump(new))

    def all_reloaded() -> bool:
        # new connections are spread over the processes: every answer must show the new fleet
        return all(set(_workers(gw)) == {_id(a), _id(c)} for _ in range(20))

    assert wait_until(all_reloaded, timeout=15)


# --- worker entries validated once, whatever way they come in (issue 23) --------------------
def test_bad_worker_entries_are_refused_by_the_admin_api_and_by_a_reload(fresh_procs):
    """Was: a worker key with CR LF injected headers into every engine request; a URL with
    credentials showed them in x-fleetgate-worker, /metrics and the Host header; a bad port
    answered 500 through the admin API and half-applied a reload with no error counted; a
    worker whose URL had a path and no name could not be drained or removed."""
    emus, gw, _ = _start(fresh_procs, 2, listen={"reload_poll_s": 0})
    a, b = emus
    before = set(_workers(gw))
    port = b.url.rsplit(":", 1)[1]
    body = {"pool": "short", "url": b.url, "name": "evil", "api_key": "k\r\nx-evil: 1"}
    r = httpx.post(gw.url + "/admin/workers", headers=ADMIN, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "api_key", r.text
    assert "x-evil" not in r.text
    for url in (f"http://user:s3cret-pw@127.0.0.1:{port}", "http://127.0.0.1:99999",
                "http://127.0.0.1:0", "http://a..b:80"):  # fmt: skip
        r = httpx.post(gw.url + "/admin/workers", headers=ADMIN, json={"pool": "short", "url": url})
        assert r.status_code == 400, (url, r.status_code, r.text)
        assert r.json()["error"]["param"] == "url" and "s3cret-pw" not in r.text
    text = httpx.get(gw.url + "/metrics").text
    assert "s3cret-pw" not in text
    assert set(_workers(gw)) == before

    # a URL with a path and no name: its id can be drained and removed
    r = httpx.post(gw.url + "/admin/workers", headers=ADMIN,
                   json={"pool": "short", "url": b.url + "/engine/x"})  # fmt: skip
    assert r.status_code == 201, r.text
    wid = r.json()["id"]
    assert wid == _id(b) + "/engine/x"
    r = httpx.post(gw.url + f"/admin/workers/{wid}/drain", headers=ADMIN)
    assert r.status_code == 202 and r.json()["id"] == wid, r.text
    assert wait_until(lambda: wid not in _workers(gw))
    r = httpx.delete(gw.url + f"/admin/workers/{wid}", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "worker_not_found"

    # a reload: refused whole, counted, nothing half-applied
    path = fresh_procs.dir / "gateway.yaml"
    for bad in ("http://127.0.0.1:99999", f"http://u:s3cret-pw@127.0.0.1:{port}"):
        broken = gateway_config([a.url, b.url, bad], [], auth={"admin_key": KEY},
                                listen={"reload_poll_s": 0})  # fmt: skip
        path.write_text(yaml.safe_dump(broken))
        r = httpx.post(gw.url + "/admin/reload", headers=ADMIN, timeout=10)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_config" and "pools.short.workers.2.url" in err["message"]
        assert "s3cret-pw" not in r.text
    assert set(_workers(gw)) == before
    text = httpx.get(gw.url + "/metrics").text
    assert metric(text, "fleetgate_config_reloads_total", result="error") == 2
    assert metric(text, "fleetgate_config_reloads_total", result="ok") == 0
    r = httpx.post(gw.url + "/v1/chat/completions", json=BODY, timeout=10)
    assert r.status_code == 200 and r.headers["x-fleetgate-worker"] in before
