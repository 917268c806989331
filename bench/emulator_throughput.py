"""Can one emulator process keep up with its own model? Prints a table, asserts nothing.

N streaming clients send at once (prompt P token ids, exactly M output tokens each,
one SSE chunk per token). The engine model says the burst takes
(⌈P/512⌉ + M) steps of W + H·N seconds; at `--time-scale s` that is × s wall seconds.
`keep-up` = model wall time / measured wall time: 1.0 means the emulator delivered at
the model's pace, below 1 it was CPU-bound (it then stretches engine time, honestly).

    PYTHONPATH=. /work/venv/bin/python bench/emulator_throughput.py [--quick]
"""

from __future__ import annotations

import asyncio
import math
import sys
import time

import aiohttp

from tests.procs import procs

W, H, CHUNK = 0.008, 0.00065, 512
P, M = 256, 64


async def burst(url: str, n: int) -> tuple[float, int]:
    body = {
        "model": "m",
        "prompt": list(range(1000, 1000 + P)),
        "max_tokens": M,
        "ignore_eos": True,
        "stream": True,
    }
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def one() -> int:
            chunks = 0
            async with session.post(url + "/v1/completions", json=body) as r:
                async for line in r.content:
                    chunks += line.startswith(b"data: {")
            return chunks

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - t0, sum(counts)


def main() -> None:
    quick = "--quick" in sys.argv
    scales = (1.0, 0.1) if quick else (1.0, 0.1, 0.01)
    sizes = (1, 16, 64) if quick else (1, 16, 64, 256)
    print(f"prompt {P} tokens, output {M} tokens, W={W * 1e3:g} ms, H={H * 1e3:g} ms")
    print(f"{'scale':>6} {'N':>5} {'model s':>9} {'wall s':>8} {'keep-up':>8} {'tokens/s':>10}")
    with procs() as ps:
        for scale in scales:
            p = ps.emulator(
                f"bench-{scale}", "--model", "m", "--time-scale", str(scale)
            ).wait_ready()
            for n in sizes:
                model = (math.ceil(P / CHUNK) + M) * (W + H * n) * scale
                wall, tokens = asyncio.run(burst(p.url, n))
                assert tokens == n * M
                print(
                    f"{scale:>6g} {n:>5} {model:>9.3f} {wall:>8.3f} {model / wall:>8.2f} {tokens / wall:>10.0f}"
                )
            p.stop()


if __name__ == "__main__":
    main()
