#!/usr/bin/env python3
"""What the gateway adds per request: latency (p50/p99) and CPU, against a worker called directly.

Method (the team's proxy comparison, "PERFORMANCE: what 'fast' means for a Python OpenAI-compatible
proxy", 2026-11-21; the tables are in
bench/overhead_tables.py): bench/mock_worker.py (a fixed-answer vLLM stand-in) runs pinned
to CPU 1; the gateway (`python -m fleetgate serve --upstream <mock> --model mock`) runs
pinned to CPU 0; wrk (one thread, bench/loadgen.lua) runs on CPU 1 and sends exactly
--requests chat completions per run over c keep-alive connections, each sending its next
request when the previous answer is complete (closed loop). For
every mode (non-streaming, 20-chunk stream) × concurrency: a warm-up run per target, then
--reps rounds, each measuring the mock directly and then every target in turn.

- added p50/p99 = target's p50/p99 − direct p50/p99 of the same round (then the median);
- CPU ms/req = Δ(utime+stime) of the target's process tree (/proc/PID/stat) / answers;
  it includes background work (scrapes, health checks) during the run and the ≤ c−1
  requests still in flight at the stop; the clock tick is 10 ms;
- gen CPU = (mock + wrk CPU) / wall: CPU 1's load; near 100% the generator, not the
  target, limits the run;
- CPU0 other = CPU 0's busy time not charged to the target / wall: other processes on
  the target's core (this machine is shared) and kernel softirq work.
Every column is the median over the rounds; min–max shows the spread.

At saturation a closed loop's latency is c / throughput (Little's law), so the added
latency at c = 16 is ~16 × the CPU per request whenever the target is the bottleneck.
`--think-ms N` makes each connection pause ~N ms (exponential) between requests, which
measures latency below saturation instead.

    python bench/gateway_overhead.py [--reps 3] [--requests 3000] [--concurrency 1,16,64]
        [--modes nonstream,stream] [--out runs.jsonl] [--think-ms 0]
        [--target NAME URL ["CMD"]]...   # other proxies, same run; {upstream} = the mock's URL
        [--gateway-cmd "CMD"]            # {python} {upstream} {port} are substituted
    python bench/gateway_overhead.py --report runs.jsonl     # the tables again

Needs Linux, `wrk` (apt-get install -y wrk) and taskset. Only 127.0.0.1; every run is
bounded by --max-seconds; every process started here is stopped on exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from overhead_tables import GATEWAY, report

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench"
PATH = "/v1/chat/completions"
DEFAULT_GATEWAY_CMD = (
    "{python} -m fleetgate serve --upstream {upstream} --model mock --port {port} "
    "--log-level warning"
)
_CLK = os.sysconf("SC_CLK_TCK")
_running: list[subprocess.Popen[bytes]] = []  # everything to stop on the way out


# --- CPU accounting ---------------------------------------------------------------------
def _proc_stats() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime+stime in ticks) for every live process."""
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
                out[int(d)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
            except (OSError, IndexError, ValueError):
                pass
    return out


def tree_cpu_s(root: int) -> float:
    """utime+stime of `root` and its live descendants, in seconds."""
    stats = _proc_stats()
    tree, todo = {root}, [root]
    while todo:
        p = todo.pop()
        for c, (ppid, _) in stats.items():
            if ppid == p and c not in tree:
                tree.add(c)
                todo.append(c)
    return sum(stats[p][1] for p in tree if p in stats) / _CLK


def cpu_busy_s(cpu: int | None) -> float:
    """Busy time of one CPU (everything but idle and iowait) from /proc/stat, in seconds."""
    if cpu is None:
        return 0.0
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                v = [int(x) for x in line.split()[1:]]
                return (sum(v[:8]) - v[3] - v[4]) / _CLK
    return 0.0


# --- processes --------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    url: str
    cmd: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env() -> dict[str, str]:
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def _pin(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None else []


def start(t: Target, cpu: int | None, logdir: Path) -> None:
    assert t.cmd is not None
    t.log = logdir / f"{t.name}.log"
    t.proc = subprocess.Popen(
        _pin(cpu) + shlex.split(t.cmd),
        cwd=ROOT,
        env=_env(),
        stdout=t.log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: stopped as a whole
    )
    _running.append(t.proc)


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        except ProcessLookupError:
            pass


def _post(url: str, stream: bool, model: str) -> bytes:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()
    # the key bench/loadgen.lua sends (a target may require it)
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    req = urllib.request.Request(url + PATH, body, headers)
    with urllib.request.urlopen(req, timeout=5) as r:
        return bytes(r.read()) if r.status == 200 else b""


def wait_ready(t: Target, timeout: float) -> float:
    """Seconds until `t` answers one non-streaming and one streaming request."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if t.proc is not None and t.proc.poll() is not None:
            raise RuntimeError(f"{t.name} exited with {t.proc.returncode}:\n{_tail(t.log)}")
        try:
            if b'"choices"' in _post(t.url, False, "mock") and b"[DONE]" in _post(
                t.url, True, "mock"
            ):
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{t.name} not ready on {t.url} after {timeout:.0f} s:\n{_tail(t.log)}")


def _tail(log: Path | None) -> str:
    try:
        return log.read_text(errors="replace")[-3000:] if log else ""
    except OSError:
        return ""


# --- one wrk run ------------------------------------------------------------------------
def run_wrk(url: str, conc: int, n: int, stream: bool, a: argparse.Namespace) -> dict[str, Any]:
    env = dict(
        os.environ,
        BENCH_REQUESTS=str(n),
        BENCH_STREAM="1" if stream else "0",
        BENCH_MODEL="mock",
        BENCH_THINK_MS=str(a.think_ms),
    )
    argv = [
        *_pin(a.gen_cpu),
        "wrk",
        "-t1",
        f"-c{conc}",
        f"-d{a.max_seconds}s",
        "--timeout",
        "30s",
        "-s",
        str(HERE / "loadgen.lua"),
        url + PATH,
    ]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    _running.append(p)
    try:
        assert p.stdout is not None
        out = p.stdout.read().decode(errors="replace")
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    except BaseException:  # Ctrl-C, SIGTERM: wrk goes too
        p.kill()
        p.wait()
        raise
    finally:
        _running.remove(p)
    line = next((ln for ln in out.splitlines() if ln.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"wrk gave no result against {url}:\n{out}")
    r: dict[str, Any] = json.loads(line[6:])
    r["wrk_cpu_s"] = ru.ru_utime + ru.ru_stime
    return r


def measure(
    t: Target, mode: str, conc: int, a: argparse.Namespace, mock_pid: int
) -> dict[str, Any]:
    pid = t.proc.pid if t.proc is not None else None
    c0 = tree_cpu_s(pid) if pid else 0.0
    m0, b0, w0 = tree_cpu_s(mock_pid), cpu_busy_s(a.proxy_cpu), time.monotonic()
    r = run_wrk(t.url, conc, a.requests, mode == "stream", a)
    wall = time.monotonic() - w0
    time.sleep(0.2)  # requests cut at the stop finish; their CPU is counted
    r.update(
        target=t.name, mode=mode, conc=conc, think_ms=a.think_ms, wall_s=wall, wanted=a.requests
    )
    r["rps"] = r["requests"] / max(r["duration_us"] / 1e6, 1e-9)
    r["gen_cpu_util"] = (tree_cpu_s(mock_pid) - m0 + r["wrk_cpu_s"]) / wall
    own = 0.0
    if pid:
        own = tree_cpu_s(pid) - c0
        r["proxy_cpu_s"] = own
        r["proxy_cpu_ms_per_req"] = 1000 * own / max(r["requests"], 1)
    if a.proxy_cpu is not None:
        r["cpu0_other"] = max(0.0, cpu_busy_s(a.proxy_cpu) - b0 - own) / (wall + 0.2)
    return r


# --- the run ----------------------------------------------------------------------------
def _targets(a: argparse.Namespace, upstream: str) -> list[Target]:
    def fill(cmd: str, port: int | None = None) -> str:
        cmd = cmd.replace("{python}", shlex.quote(sys.executable)).replace("{upstream}", upstream)
        return cmd.replace("{port}", str(port)) if port is not None else cmd

    port = a.gateway_port or free_port()
    out = [Target(GATEWAY, f"http://127.0.0.1:{port}", fill(a.gateway_cmd, port))]
    for spec in a.target:
        if len(spec) < 2:
            raise SystemExit("--target needs NAME URL [CMD]")
        cmd = fill(" ".join(spec[2:])) if len(spec) > 2 else None
        out.append(Target(spec[0], spec[1].rstrip("/"), cmd))
    return out


def _progress(r: dict[str, Any]) -> None:
    cpu = r.get("proxy_cpu_ms_per_req")
    print(
        f"{r['mode']:9} c={r['conc']:<3} rep={r['rep']} {r['target']:14} {r['rps']:8.0f} req/s "
        f"p50={r['p50_us'] / 1000:7.3f} p99={r['p99_us'] / 1000:7.3f} ms "
        f"cpu/req={'-' if cpu is None else f'{cpu:.3f}'} bad={r['bad']} "
        f"err={r['err_connect'] + r['err_read'] + r['err_write'] + r['err_timeout']}",
        file=sys.stderr,
        flush=True,
    )


def run(a: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    """Start everything, measure every point; `runs` collects the results as they come."""
    logdir = Path(tempfile.mkdtemp(prefix="fleetgate-bench-"))
    try:
        _run(a, runs, logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)  # error messages already hold the log tails


def _run(a: argparse.Namespace, runs: list[dict[str, Any]], logdir: Path) -> None:
    mock_port = a.mock_port or free_port()
    mock = Target(
        "direct",
        f"http://127.0.0.1:{mock_port}",
        f"{shlex.quote(sys.executable)} {HERE / 'mock_worker.py'} --port {mock_port}",
    )
    start(mock, a.gen_cpu, logdir)
    wait_ready(mock, 30)
    assert mock.proc is not None
    targets = _targets(a, mock.url)
    for t in targets:
        if t.cmd:
            start(t, a.proxy_cpu, logdir)
        print(f"# {t.name} ready after {wait_ready(t, a.start_timeout):.1f} s", file=sys.stderr)
    idle = {t.name: tree_cpu_s(t.proc.pid) for t in targets if t.proc is not None}
    time.sleep(2.0)
    for t in targets:
        if t.proc is not None:  # background work (scrapes, health checks) while idle
            t.extra["idle_cpu_ms_per_s"] = 1000 * (tree_cpu_s(t.proc.pid) - idle[t.name]) / 2.0
            print(f"# {t.name} idle CPU {t.extra['idle_cpu_ms_per_s']:.1f} ms/s", file=sys.stderr)
    out = open(a.out, "a") if a.out else None  # noqa: SIM115  (closed below)
    try:
        for mode in a.modes:
            for conc in a.concurrency:
                for t in [mock, *targets]:  # warm-up: pools, caches, first-call paths
                    run_wrk(t.url, conc, a.warmup, mode == "stream", a)
                for rep in range(a.reps):
                    for t in [mock, *targets]:
                        r = measure(t, mode, conc, a, mock.proc.pid)
                        r.update(rep=rep, **t.extra)
                        runs.append(r)
                        _progress(r)
                        if out:
                            out.write(json.dumps(r) + "\n")
                            out.flush()
    finally:
        if out:
            out.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--reps", type=int, default=3, help="rounds per point (the median is shown)")
    p.add_argument("--requests", type=int, default=3000, help="answers per run")
    p.add_argument(
        "--warmup", type=int, default=300, help="unmeasured answers per target and point"
    )
    p.add_argument("--concurrency", type=ints, default=[1, 16, 64], help="e.g. 1,16,64")
    p.add_argument("--modes", type=lambda s: s.split(","), default=["nonstream", "stream"])
    p.add_argument(
        "--think-ms", type=float, default=0.0, help="mean pause between a connection's requests"
    )
    p.add_argument("--out", help="append every run as a JSON line to this file")
    p.add_argument("--report", metavar="JSONL", help="only print the tables of saved runs")
    p.add_argument(
        "--target",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME URL [CMD]",
        help="another proxy to measure side by side; with CMD it is started pinned and stopped",
    )
    p.add_argument("--gateway-cmd", default=DEFAULT_GATEWAY_CMD, help="how to start the gateway")
    p.add_argument("--gateway-port", type=int, default=0, help="0: a free port")
    p.add_argument("--mock-port", type=int, default=0, help="0: a free port")
    p.add_argument("--proxy-cpu", type=int, default=0, help="the core of the gateway/proxies")
    p.add_argument(
        "--gen-cpu", type=int, default=1, help="the core of the mock, wrk and this script"
    )
    p.add_argument("--max-seconds", type=int, default=60, help="upper bound on one wrk run")
    p.add_argument("--start-timeout", type=float, default=60.0)
    return p


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.report:
        with open(a.report) as f:
            report([json.loads(ln) for ln in f if ln.strip()], sys.stdout)
        return 0
    if shutil.which("wrk") is None:
        print(
            "gateway_overhead: `wrk` is not installed. Install it (Debian/Ubuntu):\n"
            "    apt-get install -y wrk",
            file=sys.stderr,
        )
        return 2
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        print("gateway_overhead: no taskset or < 2 CPUs: running unpinned", file=sys.stderr)
        a.proxy_cpu = a.gen_cpu = None
    else:
        os.sched_setaffinity(0, {a.gen_cpu})  # this script sleeps while wrk runs
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGHUP, _exit_on_signal)
    # also when started in the background by a shell, which would have SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    load0 = os.getloadavg()
    runs: list[dict[str, Any]] = []
    rc = 0
    try:
        run(a, runs)
    except KeyboardInterrupt:
        print("gateway_overhead: interrupted; the tables of the runs so far:", file=sys.stderr)
        rc = 130
    except RuntimeError as exc:
        print(f"gateway_overhead: {exc}", file=sys.stderr)
        return 1
    finally:
        for p in reversed(_running):
            stop(p)
    report(runs, sys.stdout, load=(load0, os.getloadavg()))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
