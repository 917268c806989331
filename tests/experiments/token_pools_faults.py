"""The shared ledger through Redis faults, live: two gateway replicas, one global
concurrency limit, one real redis-server, and the faults an operator meets.

    python bench/token_pools_faults.py                 # docs/TENANCY.md's table (~1 min)
    python bench/token_pools_faults.py --stall-s 5 --limit 8 --clients 24

One set of processes (a counting engine, redis-server, two gateways) runs one sequence:

1. unreachable at start: the gateways start while nothing listens on Redis's port, and
   serve load; then redis-server starts;
2. restarted empty: redis-server SIGKILLed under load, `down_s` away, a new empty one on
   the same port;
3. stalled: redis-server SIGSTOPped under load for `stall_s`, then SIGCONTed (with a
   heartbeat TTL shorter than the stall);
4. one replica SIGKILLed under load (its clients move to the other).

The oracle is the engine's own count of requests it is answering at once
(tests/misbehaving_engine.py, `/stats/window`: the peak since the last read), sampled
every 50 ms — not the gateway's count. For each fault: the engine's peak during the
fault (against the stated bound: docs/TENANCY.md, "Redis faults"), from the fault's
end to `settle_s` after (the bound still), and from then on (the limit), the gateway's
5xx answers to the guaranteed class (0), and at the end the holds left in Redis within a
heartbeat TTL + 3 s of the load's end, well before the holds' TTL (0). The CI test (tests/e2e/test_ledger_faults.py) runs the same
sequence with shorter phases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.procs import Proc, Procs, free_port, procs

SECRET = "bench-secret-0123456789abcdef"
KEY = "sk-team"
MODEL = "llama-test"


FAULTS = ("unreachable at start", "restarted empty", "stalled", "replica SIGKILLed")


@dataclass(frozen=True)
class Settings:
    limit: int = 8  # the guaranteed entitlement's global concurrency r_e
    replicas: int = 2
    clients: int = 16  # concurrent clients, each retrying a 429 after 2 ms
    steady_s: float = 1.0  # healthy load before each fault
    unreachable_s: float = 2.0
    down_s: float = 1.0  # restarted empty: Redis away this long
    stall_s: float = 3.0
    killed_s: float = 2.0  # observed after a replica's SIGKILL
    settle_s: float = 2.0  # after a fault ends, the limit holds again within this
    after_s: float = 1.5  # observed after settling, before the next fault
    heartbeat_ttl_s: float = 1.5
    # long enough that no hold comes back by its TTL while the sequence runs: holds must
    # come back because their requests ended (or their replica died), not by expiring
    hold_ttl_s: float = 20.0
    engine_delay_s: float = 0.01  # per SSE chunk; 4 chunks per answer
    # the faults to run, in the sequence's order (Redis is unreachable at start either
    # way: the gateways start before it; a run of only that fault ends after its settling)
    faults: tuple[str, ...] = FAULTS

    @property
    def share(self) -> int:
        """What one replica admits while Redis is away: ⌊limit / expected replicas⌋."""
        return self.limit // self.replicas

    def bound(self, fault: str) -> int:
        """The stated bound on requests in flight during `fault` (docs/TENANCY.md: token pools,
        Redis faults). Redis away: each replica admits while its own in flight (what Redis
        granted before, and what it granted itself since) is under its share, so the
        fleet holds at most limit + (N − 1) × share, and no more than N × share once the
        requests admitted before the fault have ended. Never seen Redis: N × share."""
        if fault in ("restarted empty", "stalled"):
            return self.limit + (self.replicas - 1) * self.share
        if fault == "unreachable at start":
            return self.replicas * self.share
        return self.limit

    def settle_bound(self, fault: str) -> int:
        """From Redis answering again until every replica has registered what it admitted
        on its own (its first call after): limit + (N − 1) × share, as during an outage."""
        if fault == "replica SIGKILLed":
            return self.limit
        return self.limit + (self.replicas - 1) * self.share


@dataclass
class FaultResult:
    name: str
    limit: int
    bound: int
    settle_bound: int
    peak_during: int = 0
    peak_settling: int = 0  # from the fault's end to settle_s after
    peak_after: int = 0  # from then until the next fault
    over_s: float = 0.0  # after the fault's end, the engine above the limit until this
    answered: int = 0  # 200s to the guaranteed class during the fault
    refused: int = 0  # 429s
    five_xx: int = 0  # gateway 5xx answers to the guaranteed class, fault start → next
    lost: int = 0  # connections cut (the killed replica's requests)

    def violations(self) -> list[str]:
        out = []
        if self.peak_during > self.bound:
            out.append(f"{self.name}: engine peak {self.peak_during} during > bound {self.bound}")
        if self.peak_settling > self.settle_bound:
            out.append(
                f"{self.name}: engine peak {self.peak_settling} settling > {self.settle_bound}"
            )
        if self.peak_after > self.limit:
            out.append(f"{self.name}: engine peak {self.peak_after} after > limit {self.limit}")
        if self.five_xx:
            out.append(f"{self.name}: {self.five_xx} 5xx answers to the guaranteed class")
        if self.answered == 0:
            out.append(f"{self.name}: nothing answered during the fault")
        return out


@dataclass
class Report:
    settings: Settings
    faults: list[FaultResult] = field(default_factory=list)
    holds_left: int = -1
    holds_clear_s: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)

    def violations(self) -> list[str]:
        out = [v for f in self.faults for v in f.violations()]
        if self.holds_left != 0:
            out.append(
                f"{self.holds_left} holds left in Redis {self.holds_clear_s:.1f} s after the "
                f"load stopped (their TTL is {self.settings.hold_ttl_s:g} s)"
            )
        return out

    def table(self) -> str:
        s = self.settings
        rows = [
            f"limit {s.limit}, {s.replicas} replicas, {s.clients} clients, heartbeat TTL "
            f"{s.heartbeat_ttl_s:g} s, hold TTL {s.hold_ttl_s:g} s, stall {s.stall_s:g} s",
            "| fault | engine peak during (bound) | to +2 s after (bound) | later (limit) "
            "| over the limit until | 200 / 429 during | 5xx | cut |",
            "|---|---|---|---|---|---|---|---|",
        ]
        rows.extend(
            f"| {f.name} | {f.peak_during} ({f.bound}) | {f.peak_settling} ({f.settle_bound}) | "
            f"{f.peak_after} ({f.limit}) | +{f.over_s:.2f} s | {f.answered} / {f.refused} | "
            f"{f.five_xx} | "
            f"{f.lost} |"
            for f in self.faults
        )
        rows.append(
            f"holds left in Redis: {self.holds_left}, {self.holds_clear_s:.1f} s after the "
            f"load stopped (hold TTL {s.hold_ttl_s:g} s: none came back by expiring)"
        )
        return "\n".join(rows)


# --- processes ---------------------------------------------------------------------------
def gateway_config(s: Settings, engine: str, redis_url: str) -> dict[str, Any]:
    big = 1 << 50
    return {
        "pools": {
            "short": {"max_model_len": 8192, "models": [MODEL], "workers": [{"url": engine}]}
        },
        "telemetry": {"scrape_interval_s": 0.1, "stale_after_s": 1.0},
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "unhealthy_after": 1},
        "upstream": {"connect_timeout_s": 1.0, "first_byte_timeout_s": 30.0, "idle_timeout_s": 5.0},
        "listen": {"drain_delay_s": 0},
        "auth": {"keys": {"team": [KEY]}, "key_secret": SECRET},
        "admission": {
            "policy": "token_pools",
            "params": {
                "pools": {
                    "p": {"slots": 64, "tokens_per_s": 1e9, "kv_bytes": big, "bytes_per_token": 1}
                },
                "entitlements": {
                    "team": {
                        "pool": "p",
                        "class": "guaranteed",
                        "tokens_per_s": 1e9,
                        "kv_bytes": big,
                        "concurrency": s.limit,
                    }
                },
                "control_interval_s": 0.2,
                "store": "redis",
                "redis_url": redis_url,
                "hold_ttl_s": s.hold_ttl_s,
                "heartbeat_ttl_s": s.heartbeat_ttl_s,
                "timeout_s": 0.2,  # the breaker's settings are the defaults
                "expected_replicas": s.replicas,
            },
        },
    }


def start_gateway(ps: Procs, cfg: dict[str, Any], name: str) -> Proc:
    path = ps.dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = ps.fleetgate(name, "serve", "--config", str(path), "--port", "{port}")
    return proc.wait_ready("/healthz")


def start_redis(ps: Procs, port: int, name: str) -> Proc:
    import shutil

    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed")
    argv = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = Proc(name, argv, port, ps.dir / f"{name}.log")
    ps.procs.append(proc)
    proc.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc
        time.sleep(0.02)
    raise TimeoutError("redis-server did not start")


# --- the load and the oracle --------------------------------------------------------------
@dataclass
class Load:
    """`clients` streamed chats at a time through the replicas, a 429 retried after 2 ms,
    a cut connection retried on the next replica; every answer recorded (time, status)."""

    urls: list[str]
    clients: int
    records: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    dead: set[str] = field(default_factory=set)

    async def run(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4, "stream": True}  # fmt: skip
        headers = {"authorization": f"Bearer {KEY}"}
        limits = httpx.Limits(max_connections=self.clients * 2)
        async with httpx.AsyncClient(timeout=30, limits=limits) as c:

            async def client(i: int) -> None:
                while not self.stop.is_set():
                    live = [u for u in self.urls if u not in self.dead] or self.urls
                    url = live[i % len(live)]
                    i += 1
                    try:
                        async with c.stream("POST", url + "/v1/chat/completions", json=body,
                                            headers=headers) as r:  # fmt: skip
                            await r.aread()
                            status = str(r.status_code)
                    except httpx.HTTPError:
                        status = "cut"
                    self.records.append((time.monotonic(), status))
                    if status != "200":
                        await asyncio.sleep(0.002)

            await asyncio.gather(*(client(i) for i in range(self.clients)))

    def start(self) -> threading.Thread:
        t = threading.Thread(target=asyncio.run, args=(self.run(),), daemon=True)
        t.start()
        return t


@dataclass
class Sampler:
    """The engine's peak concurrency per 50 ms window: (window start, end, peak)."""

    engine: str
    samples: list[tuple[float, float, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=2) as c:
            last = time.monotonic()
            c.get(self.engine + "/stats/window")
            while not self.stop.is_set():
                time.sleep(0.05)
                peak = int(c.get(self.engine + "/stats/window").json()["peak_busy"])
                now = time.monotonic()
                self.samples.append((last, now, peak))
                last = now

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, daemon=True)
        t.start()
        return t

    def peak(self, start: float, end: float) -> int:
        """The highest count any window overlapping [start, end) saw."""
        return max((p for a, b, p in self.samples if b > start and a < end), default=0)

    def over_until(self, start: float, end: float, limit: int) -> float:
        """The end of the last window in [start, end) whose peak was above `limit`
        (`start` if none): when the count was back within the limit for good."""
        return max((b for a, b, p in self.samples if b > start and a < end and p > limit),
                   default=start)  # fmt: skip

    def peak_from(self, start: float, end: float, ends_by: bool = False) -> int:
        """The highest count of the windows that began in [start, end) (and, with
        `ends_by`, ended by `end`). A window that straddles `start` belongs to the phase
        before, one that straddles `end` (with `ends_by`) to the fault after: its peak may
        be from either side (on a loaded machine a 50 ms window can stretch to hundreds),
        and it is checked against that phase's looser bound (`peak` counts every window
        overlapping a fault), so no moment goes unchecked."""
        return max(
            (p for a, b, p in self.samples if start <= a < end and (b <= end or not ends_by)),
            default=0,
        )


def held(url: str) -> int:
    r = redis.Redis.from_url(url, socket_timeout=1)
    try:
        return int(r.hlen("fg:{p}:holds"))
    except redis.RedisError:
        return -1
    finally:
        r.close()


def run(s: Settings = Settings(), ps: Procs | None = None) -> Report:
    with contextlib.ExitStack() as stack:
        if ps is None:
            ps = stack.enter_context(procs())
        return _run(s, ps)


def _run(s: Settings, ps: Procs) -> Report:
    report = Report(s)
    engine = ps.python(
        "engine", "tests.misbehaving_engine", "--port", "{port}", "--mode", "slow-sse",
        "--param", "n=4", "--param", f"delay={s.engine_delay_s}",
    ).wait_ready("/health")  # fmt: skip
    port = free_port()  # nothing listens yet: Redis is unreachable at start
    url = f"redis://127.0.0.1:{port}/0"
    cfg = gateway_config(s, engine.url, url)
    gws = [start_gateway(ps, cfg, f"gw{i}") for i in range(s.replicas)]
    load = Load([g.url for g in gws], s.clients)
    sampler = Sampler(engine.url)
    threads = [sampler.start(), load.start()]
    marks: list[tuple[str, float, float]] = []  # fault, start, end
    try:
        t0 = time.monotonic()
        time.sleep(s.unreachable_s)
        rs = start_redis(ps, port, "redis")
        if "unreachable at start" in s.faults:
            marks.append(("unreachable at start", t0, time.monotonic()))
        time.sleep(s.settle_s + s.after_s + s.steady_s)

        if "restarted empty" in s.faults:
            t0 = time.monotonic()
            rs.kill(signal.SIGKILL)
            assert rs.popen is not None
            rs.popen.wait(5)
            time.sleep(s.down_s)
            rs = start_redis(ps, port, "redis2")
            marks.append(("restarted empty", t0, time.monotonic()))
            time.sleep(s.settle_s + s.after_s + s.steady_s)

        if "stalled" in s.faults:
            t0 = time.monotonic()
            rs.kill(signal.SIGSTOP)
            time.sleep(s.stall_s)
            rs.kill(signal.SIGCONT)
            marks.append(("stalled", t0, time.monotonic()))
            time.sleep(s.settle_s + s.after_s + s.steady_s)

        if "replica SIGKILLed" in s.faults:
            t0 = time.monotonic()
            victim = gws[-1]
            victim.kill(signal.SIGKILL)
            load.dead.add(victim.url)
            time.sleep(s.killed_s)
            marks.append(("replica SIGKILLed", t0, time.monotonic()))
            time.sleep(s.settle_s + s.after_s)
    finally:
        load.stop.set()
        threads[1].join(30)
        sampler.stop.set()
        threads[0].join(5)
    stopped = time.monotonic()
    for i, (name, start, end) in enumerate(marks):
        nxt = marks[i + 1][1] if i + 1 < len(marks) else stopped
        r = FaultResult(name, s.limit, s.bound(name), s.settle_bound(name))
        r.peak_during = sampler.peak(start, end)
        r.peak_settling = sampler.peak(end, end + s.settle_s)
        # a window running into the next fault is judged with that fault's
        r.peak_after = sampler.peak_from(end + s.settle_s, nxt, ends_by=i + 1 < len(marks))
        r.over_s = sampler.over_until(end, nxt, s.limit) - end
        for t, status in load.records:
            if start <= t < end:
                r.answered += status == "200"
                r.refused += status == "429"
            if start <= t < nxt:
                r.five_xx += status.startswith("5")
                r.lost += status == "cut"
        report.faults.append(r)
    report.statuses = Counter(status for _, status in load.records)
    # every hold comes back once its request ended (a dead replica's once its heartbeat
    # lapsed), well before the holds' TTL would take them
    deadline = stopped + s.heartbeat_ttl_s + 3.0
    while time.monotonic() < deadline and held(url) != 0:
        time.sleep(0.1)
    report.holds_left = held(url)
    report.holds_clear_s = time.monotonic() - stopped
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--stall-s", type=float, default=5.0)
    ap.add_argument("--down-s", type=float, default=2.0)
    ap.add_argument("--steady-s", type=float, default=3.0)
    ap.add_argument("--heartbeat-ttl-s", type=float, default=1.5)
    args = ap.parse_args(argv)
    s = Settings(
        limit=args.limit,
        clients=args.clients,
        stall_s=args.stall_s,
        down_s=args.down_s,
        steady_s=args.steady_s,
        unreachable_s=3.0,
        killed_s=3.0,
        after_s=3.0,
        heartbeat_ttl_s=args.heartbeat_ttl_s,
    )
    report = run(s)
    print(report.table())
    print("statuses:", dict(report.statuses))
    bad = report.violations()
    for v in bad:
        print("VIOLATION:", v)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
