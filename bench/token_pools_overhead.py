#!/usr/bin/env python3
"""What token-pool admission adds per request: CPU with the in-memory store, latency with
Redis on loopback, and Redis round trips on the hot path — beside the plain gateway.

Three parts, one run:

1. CPU per request in process (`time.process_time`, no HTTP): the `token_pools` admitter's
   admit + settle + release on the in-memory ledger, against `always` (the plain
   gateway's admitter). Target (issue 14): ≤ 0.02 ms.
2. Whole gateways under wrk, with bench/gateway_overhead.py's machinery (the mock worker,
   pinning, rounds, medians): the plain gateway (`fleetgate`), the same configuration with
   `token_pools` on the in-memory store (`pools-memory`) and on a `redis-server` on
   loopback (`pools-redis`). Its tables give each target's latency added over the mock;
   the table after them gives what admission adds over the plain gateway of the same
   round (p50, p99, CPU ms/req: the gateway process only — Redis's own CPU is shown
   apart).
3. Redis commands per request: `MONITOR` while the Redis-backed gateway answers
   `--monitor-requests` requests one at a time, each EVALSHA named by its script's SHA-1;
   then `INFO commandstats` over part 2's Redis runs. Target: one round trip at admission
   (the RESERVE script) and one at completion (FINISH), nothing else on the hot path (the
   heartbeat and the control step are background, once per interval, not per request).

    python bench/token_pools_overhead.py [--reps 3] [--requests 2000] [--concurrency 1,16]
        [--modes nonstream] [--monitor-requests 300] [--cpu-requests 200000] [--unpinned]
        [--no-redis] [--keyed] [--baseline REV]

`--keyed` adds `pools-memory-key`: the in-memory store with the request's API key
(`Bearer sk-bench`, bench/loadgen.lua's) naming the entitlement — the HMAC lookup, the
per-entitlement metrics and the `x-fleetgate-entitlement` header on every request
(`pools-memory` admits on `default_entitlement`, which skips all three).
`--baseline REV` adds the same in-memory target(s) running the code of git revision REV
(`<name>@base`, extracted to a temporary directory), measured in the same rounds, so a
change's effect is read against the plain gateway of the same round, before and after.
`--no-redis` leaves out the Redis-backed gateway and part 3.

Needs Linux, wrk, taskset and redis-server; only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import gateway_overhead as go
import yaml
from overhead_tables import GATEWAY, report

sys.path.insert(0, str(go.ROOT))

from gateway import store_redis_lua as lua
from policies.admission import AdmitAll, make_admitter
from policies.types import Outcome, RequestInfo, Status

POOL = {"slots": 1_000_000, "tokens_per_s": 1e12, "kv_bytes": 1 << 60, "bytes_per_token": 1}
ENTITLEMENT = {
    "pool": "p",
    "class": "guaranteed",
    "tokens_per_s": 1e11,
    "kv_bytes": 1 << 59,
    "concurrency": 1_000_000,
}
SCRIPTS = {
    hashlib.sha1(src.encode()).hexdigest(): name
    for name, src in vars(lua).items()
    if name.isupper() and isinstance(src, str) and name != "PRELUDE"
}


# --- 1. CPU in process --------------------------------------------------------------------
def cpu_per_request(n: int) -> dict[str, float]:
    """µs of CPU per request: admit, settle, release (token_pools) vs admit (always)."""
    params = {"pools": {"p": POOL}, "entitlements": {"bench": ENTITLEMENT}}
    pools = make_admitter("token_pools", params)
    plain = AdmitAll()
    outcome = Outcome(Status.OK, 12, 20, 0.01, None, 0.05)
    reqs = [RequestInfo(f"r{i}", "mock", 0.0, 12, 20, entitlement="bench") for i in range(n)]

    def run_pools() -> None:
        for i, r in enumerate(reqs):
            now = i * 1e-4
            charge = pools.admit(r, now)
            charge.settle(outcome, now)  # type: ignore[union-attr]
            charge.release()  # type: ignore[union-attr]

    def run_plain() -> None:
        for i, r in enumerate(reqs):
            plain.admit(r, i * 1e-4)

    out = {}
    for name, fn in (("always", run_plain), ("token_pools", run_pools)):
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
        out[name] = 1e6 * best / n
    out["added"] = out["token_pools"] - out["always"]
    return out


# --- 2. gateways under wrk ------------------------------------------------------------------
def config(mock_url: str, admission: dict[str, Any] | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "pools": {
            "short": {"max_model_len": 32768, "models": ["mock"], "workers": [{"url": mock_url}]}
        },
    }
    if admission is not None:
        cfg["admission"] = admission
        if any("keys" in e for e in admission["params"]["entitlements"].values()):
            cfg["auth"] = {"key_secret": KEY_SECRET}
    return cfg


def pools_admission(keyed: bool = False, **store: Any) -> dict[str, Any]:
    """`keyed`: the entitlement has bench/loadgen.lua's API key instead of being the
    default one."""
    if keyed:
        ents: dict[str, Any] = {"bench": {**ENTITLEMENT, "keys": [BENCH_KEY]}}
        return {"policy": "token_pools", "params": {"pools": {"p": POOL}, "entitlements": ents}}
    return {
        "policy": "token_pools",
        "params": {
            "pools": {"p": POOL},
            "entitlements": {"bench": ENTITLEMENT},
            "default_entitlement": "bench",
            **store,
        },
    }


BENCH_KEY = "sk-bench"  # what bench/loadgen.lua sends
KEY_SECRET = "bench-secret-0123456789"


def baseline_tree(rev: str, into: Path) -> Path:
    """The repository at `rev`, extracted (git archive) under `into`."""
    out = into / "base"
    out.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(go.ROOT), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def start_redis(logdir: Path, cpu: int | None) -> tuple[subprocess.Popen[bytes], int]:
    """redis-server on a free loopback port, pinned to the gateway's core: the gateway
    waits idle for each reply, so Redis gets that core at once (on the load generator's
    busy core every round trip would wait for a time slice); its CPU is shown apart."""
    port = go.free_port()
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("token_pools_overhead: redis-server is not installed")
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        go._pin(cpu) + argv, stdout=(logdir / "redis.log").open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    go._running.append(proc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    raise SystemExit("token_pools_overhead: redis-server did not start")


def redis_cmd(port: int, *args: str) -> bytes:
    """One command, the raw reply (enough for INFO)."""
    with socket.create_connection(("127.0.0.1", port), 2) as s:
        s.sendall(b"*%d\r\n" % len(args) + b"".join(
            b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args
        ))  # fmt: skip
        s.settimeout(2)
        data = b""
        while b"\r\n" not in data:
            data += s.recv(65536)
        head, _, rest = data.partition(b"\r\n")
        size = int(head[1:]) if head.startswith(b"$") else 0
        while len(rest) < size + 2:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        return rest[:size]


def commandstats(port: int) -> dict[str, int]:
    text = redis_cmd(port, "INFO", "commandstats").decode()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"cmdstat_(\w+):calls=(\d+)", text)}


def redis_cpu_s(proc: subprocess.Popen[bytes]) -> float:
    return go.tree_cpu_s(proc.pid)


def added_table(runs: list[dict[str, Any]], w: Any) -> None:
    """Per target and point: its p50/p99/CPU minus the plain gateway's of the same round."""
    by = {(r["mode"], r["conc"], r["rep"], r["target"]): r for r in runs}
    points = sorted({(r["mode"], r["conc"]) for r in runs})
    w.write(
        "\n### token-pool admission over the plain gateway (same round; medians)\n\n"
        "| mode | conc | target | added p50 ms | added p99 ms | added CPU ms/req "
        "| added CPU min–max | Redis CPU ms/req |\n|---|---|---|---|---|---|---|---|\n"
    )
    targets = sorted({r["target"] for r in runs} - {GATEWAY, "direct"})
    for mode, conc in points:
        reps = sorted({r["rep"] for r in runs if (r["mode"], r["conc"]) == (mode, conc)})
        for target in targets:
            d50, d99, dcpu, rcpu = [], [], [], []
            for rep in reps:
                base, t = by.get((mode, conc, rep, GATEWAY)), by.get((mode, conc, rep, target))
                if base is None or t is None:
                    continue
                d50.append((t["p50_us"] - base["p50_us"]) / 1000)
                d99.append((t["p99_us"] - base["p99_us"]) / 1000)
                dcpu.append(t["proxy_cpu_ms_per_req"] - base["proxy_cpu_ms_per_req"])
                if "redis_cpu_ms_per_req" in t:
                    rcpu.append(t["redis_cpu_ms_per_req"])
            if not d50:
                continue
            med = statistics.median
            w.write(
                f"| {mode} | {conc} | {target} | {med(d50):+.3f} | {med(d99):+.3f} | "
                f"{med(dcpu):+.4f} | {min(dcpu):+.4f} – {max(dcpu):+.4f} | "
                + (f"{med(rcpu):.4f} |\n" if rcpu else "- |\n")
            )


# --- 3. MONITOR ------------------------------------------------------------------------------
def monitor_count(port: int, gateway_url: str, n: int) -> tuple[Counter[str], float]:
    """Send n requests one at a time to the gateway while MONITOR lists every command;
    returns the commands seen (EVALSHA by script name; a script's own commands apart) and
    the window's length."""
    seen: Counter[str] = Counter()
    sock = socket.create_connection(("127.0.0.1", port), 2)
    sock.sendall(b"MONITOR\r\n")
    stop = threading.Event()
    # `[db client]`: a client's command; `[db lua]`: one a script ran inside that call
    pattern = re.compile(rb'\[\d+ ([^\]]+)\] "(\w+)"(?: "([0-9a-f]{40})")?')

    def read() -> None:
        sock.settimeout(0.2)
        buf = b""
        while not stop.is_set():
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\r\n")
            for line in lines:
                m = pattern.search(line)
                if m is None:
                    continue
                cmd = m.group(2).decode().upper()
                if cmd == "EVALSHA" and m.group(3):
                    cmd = "EVALSHA " + SCRIPTS.get(m.group(3).decode(), m.group(3).decode())
                if m.group(1) == b"lua":
                    cmd = "  (inside a script) " + cmd
                seen[cmd] += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.3)
    body = json.dumps(
        {"model": "mock", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
    ).encode()
    t0 = time.monotonic()
    for _ in range(n):
        req = urllib.request.Request(
            gateway_url + go.PATH, body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            r.read()
    window = time.monotonic() - t0
    time.sleep(0.5)  # the last completions' FINISH (fire-and-forget) reach Redis
    stop.set()
    reader.join(2)
    sock.close()
    return seen, window


# --- the run ---------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--modes", default="nonstream")
    p.add_argument("--monitor-requests", type=int, default=300)
    p.add_argument("--cpu-requests", type=int, default=200_000)
    p.add_argument(
        "--unpinned",
        action="store_true",
        help="no taskset: the OS places gateway, Redis, mock and wrk (on a shared host the "
        "pinned cores' other tenants can add milliseconds to every Redis round trip)",
    )
    p.add_argument("--out", help="append the wrk runs as JSON lines to this file")
    p.add_argument("--no-redis", action="store_true", help="no Redis-backed gateway, no part 3")
    p.add_argument("--keyed", action="store_true", help="add pools-memory-key (see above)")
    p.add_argument("--baseline", metavar="REV", help="add the in-memory targets at git REV")
    a = p.parse_args(argv)

    cpu = cpu_per_request(a.cpu_requests)
    print(
        "\n### 1. admission CPU per request, in process (best of 3 over "
        f"{a.cpu_requests:,} requests)\n\n| admitter | µs CPU / request |\n|---|---|\n"
        f"| always (plain gateway) | {cpu['always']:.2f} |\n"
        f"| token_pools, in-memory: admit + settle + release | {cpu['token_pools']:.2f} |\n"
        f"| added | {cpu['added']:.2f} (target ≤ 20) |"
    )
    if shutil.which("wrk") is None:
        print("token_pools_overhead: no wrk: parts 2 and 3 skipped", file=sys.stderr)
        return 2

    logdir = Path(tempfile.mkdtemp(prefix="fleetgate-pools-bench-"))
    signal.signal(signal.SIGTERM, go._exit_on_signal)
    runs: list[dict[str, Any]] = []
    try:
        pinned = (
            not a.unpinned and shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
        )
        redis_proc, redis_port = start_redis(logdir, 0 if pinned else None)
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        mock_port = go.free_port()
        mock_url = f"http://127.0.0.1:{mock_port}"
        py = sys.executable
        cmds = {}
        variants: list[tuple[str, dict[str, Any] | None]] = [
            (GATEWAY, None),
            ("pools-memory", pools_admission()),
        ]
        if a.keyed:
            variants.append(("pools-memory-key", pools_admission(keyed=True)))
        if a.baseline:  # the same in-memory targets, on the code of another revision
            base = baseline_tree(a.baseline, logdir)
            variants += [(f"{n}@base", adm) for n, adm in variants[1:]]
        if not a.no_redis:
            variants.append(("pools-redis", pools_admission(store="redis", redis_url=redis_url)))
        for name, adm in variants:
            path = logdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config(mock_url, adm)))
            # `python -m` puts the working directory first on the path: a baseline target
            # runs in its own tree (env -C) with only that tree on PYTHONPATH
            where = f"env -C {base} PYTHONPATH={base} " if name.endswith("@base") else ""
            cmds[name] = (
                f"{where}{py} -m fleetgate serve --config {path} --port {{port}} "
                "--log-level warning"
            )
        ports = {n: go.free_port() for n, _ in variants[1:]}
        wrk_args = [
            "--reps", str(a.reps), "--requests", str(a.requests),
            "--concurrency", a.concurrency, "--modes", a.modes, "--mock-port", str(mock_port),
            "--gateway-cmd", cmds[GATEWAY],
        ]  # fmt: skip
        ga = go._parser().parse_args(wrk_args)
        ga.target = [  # set here: argparse would read the commands' own options as its
            [name, f"http://127.0.0.1:{port}", *cmds[name].replace("{port}", str(port)).split()]
            for name, port in ports.items()
        ]
        if not pinned:
            ga.proxy_cpu = ga.gen_cpu = None
        # Redis's CPU and commands, per wrk run against the Redis-backed gateway
        calls: Counter[str] = Counter()
        redis_requests = 0
        measure = go.measure

        def measured(t: go.Target, mode: str, conc: int, args: Any, mock_pid: int) -> Any:
            nonlocal redis_requests
            r0, s0 = redis_cpu_s(redis_proc), commandstats(redis_port)
            r = measure(t, mode, conc, args, mock_pid)
            if t.name == "pools-redis":
                r["redis_cpu_ms_per_req"] = 1000 * (redis_cpu_s(redis_proc) - r0) / r["requests"]
                redis_requests += r["requests"]
                s1 = commandstats(redis_port)
                calls.update({k: s1[k] - s0.get(k, 0) for k in s1})
                calls["info"] -= 1  # the INFO that read them
            return r

        go.measure = measured  # type: ignore[assignment]
        go.run(ga, runs)
        for proc in [p for p in go._running if p is not redis_proc]:  # part 2's processes
            go.stop(proc)
            go._running.remove(proc)
        if a.no_redis:
            return _report(runs, None, 0, Counter(), 0)
        time.sleep(1.0)  # a replica's holds from part 2 stay in Redis: expired later
        # part 3 needs the Redis-backed gateway again (part 2 stopped it): start it alone
        t = go.Target("pools-redis", f"http://127.0.0.1:{ports['pools-redis']}",
                      cmds["pools-redis"].replace("{port}", str(ports["pools-redis"])))  # fmt: skip
        mock = go.Target(
            "direct", mock_url, f"{py} {go.HERE / 'mock_worker.py'} --port {mock_port}"
        )
        go.start(mock, ga.gen_cpu, logdir)
        go.wait_ready(mock, 30)
        go.start(t, ga.proxy_cpu, logdir)
        go.wait_ready(t, 60)
        seen, window = monitor_count(redis_port, t.url, a.monitor_requests)
    finally:
        for proc in reversed(go._running):
            go.stop(proc)
        if a.out and runs:
            with open(a.out, "a") as f:
                for r in runs:
                    f.write(json.dumps(r) + "\n")
        shutil.rmtree(logdir, ignore_errors=True)

    return _report(runs, (seen, window), a.monitor_requests, calls, redis_requests)


def _report(
    runs: list[dict[str, Any]],
    monitored: tuple[Counter[str], float] | None,
    n: int,
    calls: Counter[str],
    redis_requests: int,
) -> int:
    report(runs, sys.stdout)
    added_table(runs, sys.stdout)
    if monitored is None:
        return 0
    seen, window = monitored
    print(
        f"\n### 3. Redis commands while the gateway answered {n} requests one at a time "
        f"({window:.1f} s, MONITOR)\n\n| command | calls | per request |\n|---|---|---|"
    )
    for cmd, count in seen.most_common():
        print(f"| {cmd} | {count} | {count / n:.3f} |")
    print(
        f"\nINFO commandstats over part 2's measured Redis-backed runs ({redis_requests:,} "
        "requests; a script's own commands and the background loops included):\n\n"
        "| command | calls | per request |\n|---|---|---|"
    )
    for cmd, v in sorted(calls.items(), key=lambda kv: -kv[1]):
        if v:
            print(f"| {cmd} | {v:,} | {v / max(redis_requests, 1):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
