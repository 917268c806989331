"""`fleetgate demo` (what `make run` runs): an emulated fleet and the gateway in front of it.

Starts two short-context emulated vLLM workers (max_model_len 8192) and one long-context
worker (65536) as child processes on loopback, then the gateway on 127.0.0.1:8080 with
the in-memory defaults, prints how to call it, and serves until Ctrl-C, when it stops
everything it started.

The emulators also end when the demo ends any other way — the terminal closed (SIGHUP), a
supervisor's SIGTERM then SIGKILL, `kill -9`: on Linux each child asks the kernel for a
parent-death signal (prctl PR_SET_PDEATHSIG) right after fork, so no emulator outlives it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

MODEL = "llama-3.1-8b"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleetgate demo", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="the gateway's port (default 8080)")
    p.add_argument("--short-workers", type=int, default=2)
    p.add_argument("--long-workers", type=int, default=1)
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="emulator wall seconds per engine second"
    )
    p.add_argument("--personality", choices=["vllm", "sglang"], default="vllm")
    p.add_argument(
        "--request-log", default=None, help="write the JSONL request log here ('-' for stdout)"
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the gateway config it would use and exit"
    )
    return p


def demo_config(args: argparse.Namespace, ports: dict[str, list[int]]) -> dict[str, object]:
    def workers(pool: str) -> list[dict[str, object]]:
        return [{"url": f"http://127.0.0.1:{p}", "engine": args.personality} for p in ports[pool]]

    return {
        # no load balancer to notice a drain: SIGTERM stops at once (in flight still finishes)
        "listen": {"host": args.host, "port": args.port, "drain_delay_s": 0},
        "pools": {
            "short": {"max_model_len": 8192, "models": [MODEL], "workers": workers("short")},
            "long": {"max_model_len": 65536, "models": [MODEL], "workers": workers("long")},
        },
        "placement": {"short_pool": "short", "b_short": 8192},
        "request_log": {"path": args.request_log},
    }


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when this process dies, however it
    dies (the signal is sent when the forking thread ends: here the main thread, which lives
    as long as the process). None off Linux, where there is no such call."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not between fork and exec
    parent = os.getpid()

    def preexec() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        # the parent may have died before the request took effect: nobody would signal us
        if os.getppid() != parent:
            os._exit(126)

    return preexec


def _start_emulator(
    port: int, max_model_len: int, args: argparse.Namespace, logdir: Path
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "fleetgate", "emulate",
        "--host", "127.0.0.1", "--port", str(port),
        "--personality", args.personality,
        "--model", MODEL,
        "--max-model-len", str(max_model_len),
        "--time-scale", str(args.time_scale),
    ]  # fmt: skip
    log = (logdir / f"emulator-{port}.log").open("ab")
    # its own session: a Ctrl-C reaches the demo only, which then stops the emulators in order
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )


def _wait_healthy(procs: dict[int, subprocess.Popen[bytes]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    pending = set(procs)
    while pending and time.monotonic() < deadline:
        for port in list(pending):
            if procs[port].poll() is not None:
                raise RuntimeError(
                    f"the emulator on port {port} exited with {procs[port].returncode}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    pending.discard(port)
        time.sleep(0.1)
    if pending:
        raise RuntimeError(f"emulators on ports {sorted(pending)} did not become healthy")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ports = {
        "short": [_free_port() for _ in range(args.short_workers)],
        "long": [_free_port() for _ in range(args.long_workers)],
    }
    raw = demo_config(args, ports)
    if args.print_config:
        print(yaml.safe_dump(raw, sort_keys=False))
        return 0
    from gateway.cli import run
    from gateway.config import ConfigError, load_config

    try:
        config = load_config(data=raw)
    except ConfigError as exc:
        print(f"fleetgate demo: {exc}", file=sys.stderr)
        return 2
    with socket.socket() as s:
        try:
            s.bind((args.host, args.port))
        except OSError:
            print(f"fleetgate demo: port {args.port} is in use; try --port N", file=sys.stderr)
            return 1
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logdir = Path(os.environ.get("FLEETGATE_DEMO_LOGS", "logs"))
    logdir.mkdir(parents=True, exist_ok=True)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for p in ports["short"]:
            procs[p] = _start_emulator(p, 8192, args, logdir)
        for p in ports["long"]:
            procs[p] = _start_emulator(p, 65536, args, logdir)
        _wait_healthy(procs)
        url = f"http://{args.host}:{args.port}"
        print(
            f"\nfleetgate demo: gateway on {url} in front of {len(ports['short'])} short "
            f"(8192) and {len(ports['long'])} long (65536) emulated {args.personality} workers "
            f"(logs in {logdir}/). Ctrl-C to stop.\n\n"
            f"  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
            f'    -d \'{{"model":"{MODEL}","messages":[{{"role":"user","content":"Hello!"}}],"max_tokens":32}}\'\n\n'
            f"  python -c \"from openai import OpenAI; c = OpenAI(base_url='{url}/v1', api_key='none'); "
            f"print(c.chat.completions.create(model='{MODEL}', messages=[{{'role':'user','content':'Hello!'}}], "
            f'max_tokens=32).choices[0].message.content)"'
            "   # the openai SDK: pip install openai\n",
            flush=True,
        )
        run(config)
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:
        print(f"fleetgate demo: {exc}", file=sys.stderr)
        return 1
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    return 0
