#!/usr/bin/env python3
"""Instructions per request of the gateway's hot path, under callgrind: a load-independent measure.

Wall-clock CPU per request (bench/gateway_overhead.py) moves by 10-20 % with the machine's
load; the instructions a request executes do not. This script starts bench/mock_worker.py,
then the gateway (`python -m fleetgate serve --config <quiet config>`) under
`valgrind --tool=callgrind --instr-atstart=no`, with the health checks, the scrapes and the
configuration reload effectively off (intervals of an hour), so no periodic work runs while
it measures. For every point (mode x concurrency), a client of its own (asyncio, raw
HTTP/1.1 keep-alive, outside valgrind):

1. opens `c` connections and sends --warmup requests over them (instrumentation off);
2. `callgrind_control -z` then `-i on`; sends exactly --requests requests (the connections
   stay open, so connection set-up and tear-down are not counted); waits for every answer;
3. `callgrind_control -i off` then `-d`; reads the dump's total Ir and divides by the count.

The event loop's own timers (uvicorn's 0.1 s tick, ...) run during the measured window too,
and their share grows with its wall time, which the machine's load sets (a point takes
~10-60 s under valgrind). So the script first measures the idle process's instructions per
second (--idle-seconds) and reports `net` = (total − idle rate × window) / requests beside
the raw figure: compare `net` figures. PYTHONHASHSEED is fixed so dict/set layouts repeat.

The tree measured is the one on PYTHONPATH (put first), so the same script measures any
checkout:

    PYTHONPATH=/work/wt/base python bench/callgrind_requests.py
    PYTHONPATH=$PWD python bench/callgrind_requests.py --points nonstream:1,nonstream:16 \
        --requests 1000 --repeat 2 --out runs.jsonl
    ... --annotate DIR   # keep the dumps there (callgrind_annotate --inclusive=yes FILE)

Needs Linux, valgrind (callgrind_control) and the repository's Python environment. Only
127.0.0.1; every process started here is stopped on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "bench"
PATH = "/v1/chat/completions"
_running: list[subprocess.Popen[bytes]] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quiet_config(upstream: str) -> str:
    """The `--upstream URL --model mock` pool, with every periodic task an hour apart."""
    return (
        "listen:\n  reload_poll_s: 0\n  access_log: false\n"
        "pools:\n  short:\n    max_model_len: 8192\n    models: [mock]\n"
        f"    workers:\n      - url: {upstream}\n"
        "health:\n  interval_s: 3600\n"
        "telemetry:\n  scrape_interval_s: 3600\n  stale_after_s: 36000\n"
    )


def body(stream: bool) -> bytes:
    # bench/loadgen.lua's request
    return (
        '{"model":"mock","messages":[{"role":"user","content":"Say hello in one short '
        'sentence."}],"max_tokens":20,"temperature":0,"stream":%s}'
        % ("true" if stream else "false")
    ).encode()


def request_bytes(port: int, stream: bool) -> bytes:
    b = body(stream)
    head = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-bench\r\nContent-Length: {len(b)}\r\n\r\n"
    )
    return head.encode() + b


async def read_answer(reader: asyncio.StreamReader, stream: bool) -> None:
    """One whole HTTP/1.1 answer (content-length or chunked); raises unless 200 and complete."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    if status != b"200":
        raise RuntimeError(f"answer {status!r}: {head[:300]!r}")
    lower = head.lower()
    m = re.search(rb"\r\ncontent-length:\s*(\d+)", lower)
    if m is not None:
        data = await reader.readexactly(int(m.group(1)))
    else:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            parts.append(chunk[:-2])
        data = b"".join(parts)
    want = b"data: [DONE]" if stream else b'"choices"'
    if want not in data:
        raise RuntimeError(f"incomplete answer: {data[-200:]!r}")


class Client:
    """`conc` keep-alive connections; `run(n)` sends exactly n requests over them (closed loop)."""

    def __init__(self, port: int, conc: int, stream: bool) -> None:
        self.port, self.conc, self.stream = port, conc, stream
        self.req = request_bytes(port, stream)
        self.conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def open(self) -> None:
        for _ in range(self.conc):
            self.conns.append(await asyncio.open_connection("127.0.0.1", self.port))

    async def run(self, n: int) -> int:
        left = [n]

        async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
            done = 0
            while left[0] > 0:
                left[0] -= 1
                writer.write(self.req)
                await read_answer(reader, self.stream)
                done += 1
            return done

        counts = await asyncio.gather(*(one(r, w) for r, w in self.conns))
        return sum(counts)

    async def close(self) -> None:
        for _, w in self.conns:
            w.close()
        for _, w in self.conns:
            try:
                await w.wait_closed()
            except OSError:
                pass
        self.conns = []


def control(pid: int, *args: str) -> None:
    subprocess.run(
        ["callgrind_control", *args, str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )


def dump_total(outdir: Path, before: set[str]) -> tuple[int, str]:
    """The total Ir of the dump callgrind_control -d just wrote (and its path)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = sorted(set(glob.glob(str(outdir / "callgrind.out*"))) - before)
        for path in new:
            text = Path(path).read_text(errors="replace")
            # (with --instr-atstart=no, `summary:` stays 0: `totals:` holds the count)
            m = re.search(r"^totals:\s*(\d+)", text, re.M)
            if m is not None:
                return int(m.group(1)), path
        time.sleep(0.2)
    raise RuntimeError("no callgrind dump appeared")


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(
                f"exited {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}"
            )
        try:
            req = urllib.request.Request(
                url + PATH, body(False), {"content-type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"not ready on {url} after {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(
        argv,
        cwd=log.parent,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    _running.append(p)
    return p


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        except ProcessLookupError:
            pass


def measure_idle(pid: int, seconds: float, outdir: Path) -> float:
    """Instructions per second of wall time while no request runs (the event loop's timers:
    uvicorn's 0.1 s tick and the like)."""
    before = set(glob.glob(str(outdir / "callgrind.out*")))
    control(pid, "-z")
    control(pid, "-i", "on")
    t0 = time.monotonic()
    time.sleep(seconds)
    control(pid, "-i", "off")
    wall = time.monotonic() - t0
    control(pid, "-d")
    total, _ = dump_total(outdir, before)
    return total / wall


def measure_point(
    pid: int, port: int, mode: str, conc: int, a: argparse.Namespace, outdir: Path, idle: float
) -> dict[str, object]:
    stream = mode == "stream"

    async def go() -> dict[str, object]:
        client = Client(port, conc, stream)
        await client.open()
        try:
            await client.run(a.warmup)
            before = set(glob.glob(str(outdir / "callgrind.out*")))
            control(pid, "-z")
            control(pid, "-i", "on")
            t0 = time.monotonic()
            n = await client.run(a.requests)
            control(pid, "-i", "off")
            wall = time.monotonic() - t0
            control(pid, "-d")
            total, path = dump_total(outdir, before)
        finally:
            await client.close()
        return {
            "mode": mode,
            "conc": conc,
            "requests": n,
            "ir": total,
            "ir_per_request": total / n,
            # without the timers' share of the window (it grows with the wall time, which
            # the machine's load sets): the number to compare
            "ir_per_request_net": (total - idle * wall) / n,
            "idle_ir_per_s": idle,
            "wall_s": round(wall, 1),
            "dump": path,
        }

    return asyncio.run(go())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--points",
        default="nonstream:1,nonstream:16,nonstream:64,stream:1,stream:16,stream:64",
        help="mode:concurrency, comma-separated (modes: nonstream, stream)",
    )
    p.add_argument("--requests", type=int, default=1500, help="measured requests per point")
    p.add_argument("--warmup", type=int, default=300, help="requests before each point")
    p.add_argument("--repeat", type=int, default=1, help="measure every point this many times")
    p.add_argument("--chunks", type=int, default=20, help="the mock's SSE events per stream")
    p.add_argument("--out", help="append one JSON line per measurement")
    p.add_argument("--annotate", help="keep the callgrind dumps in this folder")
    p.add_argument(
        "--idle-seconds", type=float, default=10, help="the timers' cost, measured first"
    )
    p.add_argument("--start-timeout", type=float, default=300)
    a = p.parse_args(argv)
    if shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (callgrind_control)")
    points = []
    for spec in a.points.split(","):
        mode, conc = spec.split(":")
        if mode not in ("nonstream", "stream"):
            raise SystemExit(f"unknown mode {mode!r}")
        points.append((mode, int(conc)))

    work = Path(tempfile.mkdtemp(prefix="fleetgate-callgrind-"))
    outdir = Path(a.annotate) if a.annotate else work
    outdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONHASHSEED="0")
    # the tree measured: PYTHONPATH's first entry (else this checkout); the gateway runs in
    # a scratch folder, since `python -m` puts its working directory first on sys.path
    tree = env.get("PYTHONPATH", "").split(os.pathsep)[0] or str(ROOT)
    env["PYTHONPATH"] = os.pathsep.join(
        [tree, *[x for x in env.get("PYTHONPATH", "").split(os.pathsep)[1:] if x]]
    )
    try:
        mock_port = free_port()
        mock = start(
            [
                sys.executable,
                str(HERE / "mock_worker.py"),
                "--port",
                str(mock_port),
                "--chunks",
                str(a.chunks),
            ],
            work / "mock.log",
            env,
        )
        cfg = work / "gateway.yaml"
        cfg.write_text(quiet_config(f"http://127.0.0.1:{mock_port}"))
        port = free_port()
        gw = start(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={outdir}/callgrind.out.%p",
                sys.executable,
                "-m",
                "fleetgate",
                "serve",
                "--config",
                str(cfg),
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            work / "gateway.log",
            env,
        )
        wait_ready(f"http://127.0.0.1:{mock_port}", mock, work / "mock.log", 30)
        wait_ready(f"http://127.0.0.1:{port}", gw, work / "gateway.log", a.start_timeout)
        where = subprocess.run(
            [sys.executable, "-c", "import gateway; print(gateway.__file__)"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"# tree {tree} ({where}), gateway pid {gw.pid}", file=sys.stderr, flush=True)
        idle = measure_idle(gw.pid, a.idle_seconds, outdir)
        print(f"# idle: {idle:,.0f} Ir/s", file=sys.stderr, flush=True)
        out = open(a.out, "a") if a.out else None  # noqa: SIM115  (closed below)
        try:
            for rep in range(a.repeat):
                for mode, conc in points:
                    r = measure_point(gw.pid, port, mode, conc, a, outdir, idle)
                    r.update(tree=tree, rep=rep)
                    print(
                        f"{mode:9} c={conc:<3} rep={rep} {r['ir_per_request_net']:12,.0f} Ir/request "
                        f"net of timers ({r['ir_per_request']:,.0f} raw; {r['requests']} "
                        f"requests, {r['wall_s']} s)",
                        flush=True,
                    )
                    if out is not None:
                        out.write(json.dumps(r) + "\n")
                        out.flush()
        finally:
            if out is not None:
                out.close()
    finally:
        for proc in reversed(_running):
            stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
