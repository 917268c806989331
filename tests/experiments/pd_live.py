"""A live 1P/2D `pd` pool: gateway + emulated prefill and decode servers of each
personality, driven through the openai SDK (streamed and not), with TTFT, ITL and the
gateway's hand-off metrics (docs/PD.md).

    python bench/pd_live.py                  # both personalities, 4 and 16 concurrent clients
    python bench/pd_live.py --requests 200

Emulators in real time (--time-scale 1: an engine step of W + H·n ≈ 8–9 ms; a faster
scale on a loaded runner measures the runner, not the engines). Each client sends its next
request when its answer is in. TTFT: the first content chunk (streamed) or the whole
answer (not streamed); ITL: (last chunk − first chunk) / (chunks − 1) per stream.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx
import openai

from tests.e2e.fleet import gateway_config, metric, start_gateway
from tests.procs import procs

SCALE = 1.0  # real time: a loaded runner keeps up with it
MODEL = "llama-pd"
PROMPT = "Explain how a prefill server hands its KV cache to a decode server. " * 12


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def _one(client: openai.AsyncOpenAI, stream: bool, max_tokens: int) -> tuple[float, float]:
    t0 = time.monotonic()
    kw: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "extra_body": {"ignore_eos": True},
    }
    if not stream:
        r = await client.chat.completions.create(**kw)
        assert r.usage is not None and r.usage.completion_tokens == max_tokens
        return time.monotonic() - t0, float("nan")
    chunks = await client.chat.completions.create(stream=True, **kw)
    stamps = [time.monotonic() async for c in chunks if c.choices and c.choices[0].delta.content]
    ttft = stamps[0] - t0
    itl = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    return ttft, itl


async def _load(url: str, clients: int, requests: int, stream: bool) -> list[tuple[float, float]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    out: list[tuple[float, float]] = []
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            out.append(await _one(client, stream, 64))

    async with client:
        await asyncio.gather(*(worker() for _ in range(clients)))
    return out


def run(personality: str, requests: int, concurrency: tuple[int, ...]) -> list[dict[str, Any]]:
    rows = []
    with procs() as ps:
        common = ("--personality", personality, "--model", MODEL, "--time-scale", str(SCALE))
        prefill = ps.emulator(f"{personality}-p", *common, "--role", "prefill")
        decode = [ps.emulator(f"{personality}-d{i}", *common, "--role", "decode") for i in (0, 1)]
        for p in (prefill, *decode):
            p.wait_ready("/health")
        cfg = gateway_config([], [])
        cfg["pools"] = {
            "short": {
                "kind": "pd",
                "max_model_len": 8192,
                "models": [MODEL],
                "pd": {"protocol": personality},
                "workers": [
                    {"url": prefill.url, "engine": personality, "role": "prefill"},
                    *({"url": d.url, "engine": personality, "role": "decode"} for d in decode),
                ],
            }
        }
        gw = start_gateway(ps, cfg, f"gateway-{personality}")
        for c in concurrency:
            for stream in (False, True):
                got = asyncio.run(_load(gw.url, c, requests, stream))
                ttft = [t / SCALE for t, _ in got]
                itl = [i / SCALE for _, i in got if i == i]
                rows.append(
                    {
                        "personality": personality,
                        "clients": c,
                        "stream": stream,
                        "n": len(got),
                        "ttft_p50": _q(ttft, 0.5),
                        "ttft_p99": _q(ttft, 0.99),
                        "itl_p50_ms": _q(itl, 0.5) * 1000 if itl else float("nan"),
                    }
                )
                print(rows[-1], flush=True)
        text = httpx.get(gw.url + "/metrics", timeout=5).text
        rows.append(
            {
                "personality": personality,
                "handoffs_ok": metric(text, "fleetgate_pd_handoffs_total", outcome="ok"),
                "transfer_count": metric(text, "fleetgate_pd_transfer_seconds_count"),
                "transfer_mean_s": metric(text, "fleetgate_pd_transfer_seconds_sum")
                / max(1.0, metric(text, "fleetgate_pd_transfer_seconds_count"))
                / SCALE,
                "prefill_mean_s": metric(text, "fleetgate_pd_prefill_seconds_sum")
                / max(1.0, metric(text, "fleetgate_pd_prefill_seconds_count"))
                / SCALE,
            }
        )
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--personality", choices=("vllm", "sglang"), action="append")
    args = ap.parse_args(argv)
    for personality in args.personality or ["vllm", "sglang"]:
        run(personality, args.requests, (4, 16))


if __name__ == "__main__":
    main()
