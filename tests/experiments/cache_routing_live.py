"""Cache-aware routing LIVE (issue 27; docs/CACHE_ROUTING.md): a gateway and emulators
with prefix caching on loopback, multi-turn chats through the official openai SDK.

    python bench/cache_routing_live.py [--clients 24] [--conversations 3]

- engines: `--workers` `fleetgate emulate` processes, each with a small batch and KV
  cache (`--max-num-seqs 16`, 1,024 blocks of 16 tokens: ~16k tokens, room for a dozen
  system prompts), compute-bound prefill (5e-5 s a token, 2,048 tokens a step) so a cache
  hit saves time, `--enable-prompt-tokens-details` (usage.prompt_tokens_details
  .cached_tokens, as vLLM reports it), time-scaled (`--scale`: an engine second takes
  that many wall seconds). Engines and gateway restart for every router: cold caches.
- the load: `--clients` closed-loop clients, each running `--conversations`
  conversations back to back; a conversation opens with one of `--templates` shared
  system prompts (Zipf 0.8, lognormal lengths of median 600 tokens) and has 1–4 turns of
  a short user message; each answer (max_tokens 24) is appended to the conversation. The
  conversation's id is the request's `user` field (session_affinity's key). Seeded: every
  router gets the same conversations.
- per request, from the stream: TTFT (first content chunk), prompt and cached tokens (the
  usage chunk, stream_options.include_usage). Hit rate = Σ cached / Σ prompt tokens.
  Times are engine seconds (wall ÷ scale).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import openai
import yaml

from tests.procs import Proc, Procs

MODEL = "llama-test"


@dataclass(frozen=True, slots=True)
class Setup:
    workers: int = 3
    clients: int = 24
    conversations: int = 3  # per client
    templates: int = 24
    scale: float = 1.0
    max_num_seqs: int = 16
    kv_blocks: int = 1024
    seed: int = 1


def words(n: int) -> str:
    return " a" * max(0, n)  # one cl100k token each


def conversations(setup: Setup) -> list[list[tuple[str, str, list[str]]]]:
    """Per client: (conversation id, system prompt, user turns)."""
    rng = random.Random(f"{setup.seed}:live")
    lengths = random.Random(f"{setup.seed}:templates")
    system = [
        f"System prompt {t}:"
        + words(max(64, min(2000, round(lengths.lognormvariate(math.log(600), 0.5)))))
        for t in range(setup.templates)
    ]
    weights = [1.0 / (k + 1) ** 0.8 for k in range(setup.templates)]
    out = []
    for c in range(setup.clients):
        convs = []
        for k in range(setup.conversations):
            t = rng.choices(range(setup.templates), weights)[0]
            turns = [
                f"Question {c}-{k}-{j}:" + words(rng.randint(10, 60))
                for j in range(rng.randint(1, 4))
            ]
            convs.append((f"conv-{c}-{k}", system[t], turns))
        out.append(convs)
    return out


def start_engines(ps: Procs, setup: Setup) -> list[Proc]:
    engines = [
        ps.emulator(
            f"w{i}", "--model", MODEL, "--max-model-len", "8192",
            "--max-num-seqs", str(setup.max_num_seqs), "--num-kv-blocks", str(setup.kv_blocks),
            "--prefill-token-s", "5e-5", "--max-num-batched-tokens", "2048",
            "--enable-prompt-tokens-details", "--time-scale", str(setup.scale),
            "--max-lag", str(max(0.05, 0.2 * setup.scale)),
        )
        for i in range(setup.workers)
    ]  # fmt: skip
    for e in engines:
        e.wait_ready("/health")
    return engines


def start_gateway(ps: Procs, engines: list[Proc], routing: str, name: str) -> Proc:
    cfg: dict[str, Any] = {
        "pools": {
            "short": {
                "max_model_len": 8192,
                "models": [MODEL],
                "workers": [{"url": e.url, "name": e.name} for e in engines],
                "routing": {"policy": routing},
            }
        },
        "telemetry": {"scrape_interval_s": 0.1, "stale_after_s": 2.0},
        "health": {"interval_s": 0.5, "timeout_s": 2.0, "unhealthy_after": 3},
        "upstream": {"connect_timeout_s": 2.0, "first_byte_timeout_s": 600.0,
                     "idle_timeout_s": 120.0},
        "listen": {"drain_delay_s": 0.0, "graceful_shutdown_s": 2.0},
    }  # fmt: skip
    path = ps.dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return ps.fleetgate(name, "serve", "--config", str(path), "--port", "{port}").wait_ready(
        "/healthz"
    )


@dataclass(slots=True)
class Answer:
    ttft: float  # wall seconds
    prompt_tokens: int
    cached_tokens: int


async def chat(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], user: str
) -> tuple[Answer, str]:
    t0 = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    usage = None
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        user=user,
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and first is not None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return Answer(first - t0, usage.prompt_tokens, cached), "".join(text)


async def drive(url: str, setup: Setup) -> list[Answer]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    answers: list[Answer] = []

    async def one(convs: list[tuple[str, str, list[str]]]) -> None:
        for conv, system, turns in convs:
            messages = [{"role": "system", "content": system}]
            for turn in turns:
                messages.append({"role": "user", "content": turn})
                answer, reply = await chat(client, messages, conv)
                answers.append(answer)
                messages.append({"role": "assistant", "content": reply})

    await asyncio.gather(*(one(c) for c in conversations(setup)))
    await client.close()
    return answers


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def run_router(ps: Procs, setup: Setup, routing: str) -> dict[str, Any]:
    engines = start_engines(ps, setup)
    gw = start_gateway(ps, engines, routing, f"gw-{routing}")
    t0 = time.perf_counter()
    answers = asyncio.run(drive(gw.url, setup))
    wall = time.perf_counter() - t0
    for p in (gw, *engines):
        p.stop()
    ttft = [a.ttft / setup.scale for a in answers]
    return {
        "router": routing,
        "requests": len(answers),
        "hit": sum(a.cached_tokens for a in answers) / sum(a.prompt_tokens for a in answers),
        "ttft_p50": quantile(ttft, 0.5),
        "ttft_p99": quantile(ttft, 0.99),
        "rps": len(answers) / (wall / setup.scale),
        "wall_s": wall,
    }
