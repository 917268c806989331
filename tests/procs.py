"""Real processes on loopback for the tests: free ports, start, wait until ready, stop.

Every process is started with this interpreter and the repository on PYTHONPATH, so a
worktree's tests run that worktree's code. Nothing here talks to anything but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


_given: set[int] = set()  # ports this process handed out: never the same one twice


def free_ports(n: int) -> int:
    """A base port with n consecutive ports free on loopback now (an emulator's per-rank
    API servers, --data-parallel-rank-ports)."""
    for _ in range(100):
        base = random.randint(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for g in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + g))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
        if not _given.intersection(range(base, base + n)):
            _given.update(range(base, base + n))
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def free_port() -> int:
    """A port nothing listens on now, and not one given before in this process (the kernel
    may hand a just-closed port out again: two workers of one test got the same one)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _given:
            _given.add(port)
            return port


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["PYTHONUNBUFFERED"] = "1"
    return e


@dataclass
class Proc:
    name: str
    args: Sequence[str]
    port: int
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Proc:
        self.popen = subprocess.Popen(
            list(self.args),
            cwd=ROOT,
            env=env(),
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def wait_ready(self, path: str = "/health", timeout: float = 30.0) -> Proc:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.popen.returncode}:\n{self.output()}"
                )
            try:
                r = httpx.get(self.url + path, timeout=1.0)
                if r.status_code < 500:
                    return self
            except httpx.HTTPError as exc:
                last = exc
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready on {self.url}{path}: {last}\n{self.output()}")

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 5.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.kill(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.popen.wait(timeout)


class Procs:
    """Starts processes and stops them all at the end, whatever happened."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fleetgate-test-"))
        self.procs: list[Proc] = []

    def fleetgate(self, name: str, *args: str, port: int | None = None) -> Proc:
        port = port or free_port()
        argv = [sys.executable, "-m", "fleetgate", *[a.replace("{port}", str(port)) for a in args]]
        proc = Proc(name, argv, port, self.dir / f"{name}.log")
        self.procs.append(proc)
        return proc.start()

    def python(self, name: str, module: str, *args: str, port: int | None = None) -> Proc:
        """`python -m module args` ({port} substituted)."""
        port = port or free_port()
        argv = [sys.executable, "-m", module, *[a.replace("{port}", str(port)) for a in args]]
        proc = Proc(name, argv, port, self.dir / f"{name}.log")
        self.procs.append(proc)
        return proc.start()

    def emulator(self, name: str, *args: str, port: int | None = None) -> Proc:
        return self.fleetgate(
            name, "emulate", "--host", "127.0.0.1", "--port", "{port}", *args, port=port
        )

    def redis(self) -> Proc:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (make test installs it)")
        port = free_port()
        argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        proc = Proc("redis", argv, port, self.dir / "redis.log")
        self.procs.append(proc)
        proc.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return proc
            time.sleep(0.05)
        raise TimeoutError("redis-server did not start")

    def close(self) -> None:
        # all at once: a gateway drains for `listen.drain_delay_s` after SIGTERM, and
        # stopping one process after another would add those delays up
        live = [p for p in reversed(self.procs) if p.popen is not None and p.popen.poll() is None]
        for p in live:
            p.kill(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for p in live:
            assert p.popen is not None
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill(signal.SIGKILL)
                p.popen.wait(5.0)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def procs() -> Iterator[Procs]:
    ps = Procs()
    try:
        yield ps
    finally:
        ps.close()
