"""The gateway CPU a request pays for count-when-uncertain placement (issue 24's must-show:
"non-borderline traffic must not pay for it").

    python bench/placement_cpu.py [--reps 7] [--requests 3000] [--concurrency 8]
        [--base COMMIT] [--mock PATH] [--out rows.json]

One run, every variant side by side against one mock engine per pool (the shared
bench's mock_upstream.py: a fixed small answer, no tokenizer), each a `fleetgate serve` process
with the same two-pool configuration (short 8,192, long 65,536, both on the mock, C&R
the default placement, `tokenizer` the default `auto`):

- `on`: this tree;
- `off`: this tree with the count-when-uncertain path taken out (the Intake built without
  `ByteBounds`, as before issue 24: the ASCII fast-path floor back at 3 bytes a token, no
  script, no interval, no count) — the same code otherwise;
- `base` (with `--base COMMIT`): that commit's tree (`git archive`, the compiled helper
  copied in), e.g. the code before a change.

Bodies (chat completions, `max_tokens` 20, not streamed), English prose from the GPL:
- `1KB`: plain short traffic (every variant's ASCII fast path);
- `20KB`: non-borderline prose (~4,600 tokens) between the logs' floor and prose's:
  unclassified before issue 24, classified and scripted with it (b4f3783), scripted only
  since (its script's floor);
- `26KB`: prose whose bytes-per-token interval holds B_short (≈5,900 cl100k tokens, up to
  ~9,000 at 2.9 bytes a token): counted exactly with the path on (the mock has no
  /tokenize, so locally, on the compressor thread), placed on the estimate with it off.

For each repetition, body and variant — variants in a rotated order each repetition, so
drift on the shared machine falls on all of them — wrk (one thread, closed loop, exactly
`--requests` answers over `--concurrency` connections) drives one gateway while the others
idle, and the gateway process's utime+stime (/proc/PID/stat, 10 ms ticks) over the run is
divided by the answers: CPU ms per request. Reported per body and variant: the median over
repetitions, its min–max, and the median of the per-repetition difference to `off`.
`--engine emulator` puts a `fleetgate emulate` (vLLM, cl100k, time-scale 0.02) behind each
pool instead, whose `/tokenize` answers, so `auto` counts with the engine: what a counted
request costs the gateway then (with `--base`, against a tree that also counted it locally).
Only 127.0.0.1; every process started here is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.procs import ROOT, Proc, Procs, free_port

MOCK = Path("/work/shared/bench/mock_upstream.py")
LUA = Path(__file__).with_suffix(".lua")
TEXT = Path("/usr/share/common-licenses/GPL-3")
SIZES = {"1KB": 1_000, "20KB": 20_000, "26KB": 26_000}
_CLK = os.sysconf("SC_CLK_TCK")

# `off`: the GatewayDriver builds its Intake without the intervals (bounds=None: the Intake then
# keeps the pre-issue-24 fast path; the scripter is never called)
_OFF = (
    "import sys, gateway.proxy as p; p.ByteBounds = lambda: None; "
    "from fleetgate.cli import main; sys.exit(main(sys.argv[1:]))"
)
# `base`: another tree first on sys.path
_BASE = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from fleetgate.cli import main; sys.exit(main(sys.argv[1:]))"
)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / _CLK


def uncertain_total(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith("fleetgate_compress_uncertain_total "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def body(size: int) -> bytes:
    text = TEXT.read_text()
    while len(text) < size:
        text += "\n\n" + text
    content = text[:size] + "\n\nWhich freedoms does this text grant, in one sentence?"
    msg = {"role": "user", "content": content}
    return json.dumps({"model": "mock", "messages": [msg], "max_tokens": 20}).encode()


def base_tree(commit: str, where: Path) -> Path:
    out = where / f"base-{commit[:9]}"
    out.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    for so in (ROOT / "compressor").glob("_fast*.so"):
        shutil.copy(so, out / "compressor" / so.name)
    return out


def gateway(procs: Procs, name: str, config: Path, code: str | None) -> Proc:
    port = free_port()
    serve = ["serve", "--config", str(config), "--port", str(port), "--log-level", "warning"]
    if code is None:
        return procs.fleetgate(name, *serve, port=port)
    argv = [sys.executable, "-c", code, *serve]
    proc = Proc(name, argv, port, procs.dir / f"{name}.log")
    procs.procs.append(proc)
    return proc.start()


def run_wrk(url: str, body_file: Path, n: int, conc: int) -> dict[str, Any]:
    env = dict(os.environ, BENCH_REQUESTS=str(n), BENCH_BODY=str(body_file))
    argv = ["wrk", "-t1", f"-c{conc}", "-d120s", "--timeout", "30s", "-s", str(LUA)]
    out = subprocess.run(
        [*argv, url + "/v1/chat/completions"], env=env, capture_output=True, text=True, timeout=200
    )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"wrk said:\n{out.stdout}\n{out.stderr}")
    result: dict[str, Any] = json.loads(line[6:])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--base", help="a commit to run beside this tree")
    ap.add_argument("--mock", type=Path, default=MOCK)
    ap.add_argument(
        "--engine", choices=("mock", "emulator"), default="mock",
        help="the pools' workers: the shared bench's mock (no /tokenize: counts are local), or "
        "fleetgate's emulator (its /tokenize, cl100k: `auto` counts with the engine)",
    )  # fmt: skip
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk (apt-get install -y wrk)")
    print(f"load average {os.getloadavg()[0]:.1f} at start; {os.cpu_count()} cores")
    procs = Procs()
    where = Path(tempfile.mkdtemp(prefix="placement-cpu-"))
    try:
        mocks = {}
        for pool, n in (("short", 8192), ("long", 65536)):  # a worker is in one pool: one each
            if args.engine == "emulator":  # answers /tokenize (cl100k): `auto` finds `engine`
                mocks[pool] = procs.emulator(
                    f"emulator-{pool}", "--model", "mock", "--max-model-len", str(n),
                    "--time-scale", "0.02",
                )  # fmt: skip
            else:
                port = free_port()
                argv = [sys.executable, str(args.mock), "--port", str(port)]
                mocks[pool] = Proc(f"mock-{pool}", argv, port, procs.dir / f"mock-{pool}.log")
                procs.procs.append(mocks[pool])
                mocks[pool].start()
            mocks[pool].wait_ready("/health")
        cfg = {
            "pools": {
                pool: {"max_model_len": n, "models": ["mock"], "workers": [{"url": m.url}]}
                for (pool, m), n in zip(mocks.items(), (8192, 65536), strict=True)
            },
            "listen": {"drain_delay_s": 0},
        }
        config = where / "gateway.yaml"
        config.write_text(yaml.safe_dump(cfg))
        variants: dict[str, str | None] = {"on": None, "off": _OFF}
        if args.base:
            variants["base"] = _BASE.format(root=str(base_tree(args.base, where)))
        gws = {name: gateway(procs, name, config, code) for name, code in variants.items()}
        bodies = {}
        for label in args.sizes.split(","):
            bodies[label] = where / f"{label}.json"
            bodies[label].write_bytes(body(SIZES[label]))
        for gw in gws.values():
            gw.wait_ready("/healthz", timeout=60)
            for f in bodies.values():  # warm: imports, the compressor's caches, ĉ_k
                for _ in range(20):
                    r = httpx.post(gw.url + "/v1/chat/completions", content=f.read_bytes(),
                                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
                    r.raise_for_status()
        rows = []
        order = list(gws)
        for rep in range(args.reps):
            for label, f in bodies.items():
                for name in order[rep % len(order) :] + order[: rep % len(order)]:
                    gw = gws[name]
                    assert gw.popen is not None
                    c0, t0 = cpu_seconds(gw.popen.pid), time.monotonic()
                    out = run_wrk(gw.url, f, args.requests, args.concurrency)
                    cpu = cpu_seconds(gw.popen.pid) - c0
                    n = out["requests"]
                    rows.append({
                        "rep": rep, "body": label, "variant": name, "n": n, "bad": out["bad"],
                        "cpu_ms": 1e3 * cpu / max(n, 1), "wall_s": time.monotonic() - t0,
                        "p50_ms": out["p50_us"] / 1e3, "load": os.getloadavg()[0],
                    })  # fmt: skip
            print(f"rep {rep + 1}/{args.reps} done, load {os.getloadavg()[0]:.1f}", flush=True)
        # the `off` switch is a patch of gateway.proxy: check it took (nothing counted there)
        for name, gw in gws.items():
            counted = uncertain_total(httpx.get(gw.url + "/metrics", timeout=10).text)
            print(f"{name}: fleetgate_compress_uncertain_total {counted:.0f}")
            if name == "off" and counted:
                raise RuntimeError("the `off` gateway counted requests: its patch did not apply")
        report(rows, list(gws), list(bodies))
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=1))
    finally:
        procs.close()
        shutil.rmtree(where, ignore_errors=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


def report(rows: list[dict[str, Any]], variants: list[str], bodies: list[str]) -> None:
    print("\n| body | variant | CPU ms/req median | min–max | Δ vs off, median (min–max) | bad |")
    print("|---|---|---|---|---|---|")
    for label in bodies:
        off = {r["rep"]: r["cpu_ms"] for r in rows if r["body"] == label and r["variant"] == "off"}
        for name in variants:
            rs = [r for r in rows if r["body"] == label and r["variant"] == name]
            cpu = [r["cpu_ms"] for r in rs]
            delta = [r["cpu_ms"] - off[r["rep"]] for r in rs if r["rep"] in off]
            d = (
                f"{statistics.median(delta):+.3f} ({min(delta):+.3f}…{max(delta):+.3f})"
                if name != "off" and delta
                else "—"
            )
            print(
                f"| {label} | {name} | {statistics.median(cpu):.3f} | "
                f"{min(cpu):.3f}–{max(cpu):.3f} | {d} | {sum(r['bad'] for r in rs)} |"
            )


if __name__ == "__main__":
    raise SystemExit(main())
