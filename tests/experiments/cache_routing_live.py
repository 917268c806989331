"""Cache-aware routing LIVE (issue 27; docs/CACHE_ROUTING.md): a gateway and emulators
with prefix caching on loopback, multi-turn chats through the official openai SDK.

    python bench/cache_routing_live.py [--clients 24] [--conversations 3]

- engines: `--workers` `fleetgate emulate` processes, each with a small batch and KV
  cache (`--max-num-seqs 16`, 1,024 blocks of 16 tokens: ~16k tokens, room for a dozen
  system prompts), compute-bound prefill (`prefill_token_s`, 3e-4 s a token — a larger
  model or a slower GPU than the simulator's 5e-5 —, 2,048 tokens a step) so a cached
  1,500-token prefix saves ~0.45 s of engine time, more than this shared machine's
  scheduling noise, `--enable-prompt-tokens-details` (usage.prompt_tokens_details
  .cached_tokens, as vLLM reports it), time-scaled (`--scale`: an engine second takes
  that many wall seconds). Engines and gateway restart for every router: cold caches.
- the load: `--clients` closed-loop clients, each running `--conversations`
  conversations back to back and thinking `think_s` (exponential) between turns; a
  conversation opens with one of `--templates` shared system prompts (Zipf 0.8,
  lognormal lengths of median 1,500 tokens: together about twice what one engine caches)
  and has 1–4 turns of a short user message; each answer (max_tokens 24) is appended to
  the conversation; with `ramp_s` the clients start one after another over that time
  (cold caches: all at once, the first prompts queue behind each other's prefills). Text is seeded random English words (~5 bytes a token, as prose: the
  gateway's 512-byte chunks then stand for ~128 tokens as it assumes). The
  conversation's id is the request's `user` field (session_affinity's key). Every router
  gets the same conversations.
- per request, from the stream: TTFT (first content chunk), prompt and cached tokens (the
  usage chunk, stream_options.include_usage). Hit rate = Σ cached / Σ prompt tokens.
  Times are engine seconds (wall ÷ scale).
- the engines' own TTFT (`vllm:time_to_first_token_seconds` from each emulator's
  /metrics before it stops, the engines' histograms added): arrival at the engine → first
  token in engine seconds, which host scheduling perturbs less (the engine's clock is a
  cursor that absorbs stalls under `--max-lag`). Its mean is exact (sum / count); its
  quantiles are interpolated in the buckets as PromQL's histogram_quantile does.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import yaml
from prometheus_client.parser import text_string_to_metric_families

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
    think_s: float = 0.5
    ramp_s: float = 0.0  # client c starts at c / clients × ramp_s (a linear ramp)
    prefill_token_s: float = 3e-4
    seed: int = 1


_WORDS = [
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
]


def words(n: int, rng: random.Random) -> str:
    """About `n` tokens of prose-like text (one cl100k token a word)."""
    return "".join(" " + rng.choice(_WORDS) for _ in range(max(0, n)))


def conversations(setup: Setup) -> list[list[tuple[str, str, list[str]]]]:
    """Per client: (conversation id, system prompt, user turns)."""
    rng = random.Random(f"{setup.seed}:live")
    lengths = random.Random(f"{setup.seed}:templates")
    system = [
        f"System prompt {t}:"
        + words(max(64, min(4000, round(lengths.lognormvariate(math.log(1500), 0.5)))), lengths)
        for t in range(setup.templates)
    ]
    weights = [1.0 / (k + 1) ** 0.8 for k in range(setup.templates)]
    out = []
    for c in range(setup.clients):
        convs = []
        for k in range(setup.conversations):
            t = rng.choices(range(setup.templates), weights)[0]
            turns = [
                f"Question {c}-{k}-{j}:" + words(rng.randint(10, 60), rng)
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
            "--prefill-token-s", str(setup.prefill_token_s), "--max-num-batched-tokens", "2048",
            "--enable-prompt-tokens-details", "--time-scale", str(setup.scale),
            "--max-lag", str(max(0.05, 0.2 * setup.scale)),
        )
        for i in range(setup.workers)
    ]  # fmt: skip
    for e in engines:
        e.wait_ready("/health")
    return engines


# a router as the live run names it: a policy and its parameters
ROUTERS: dict[str, dict[str, Any]] = {
    "least_loaded": {"policy": "least_loaded"},
    "prefix_overlap": {"policy": "prefix_overlap"},
    "kv_cost": {"policy": "kv_cost"},
    "kv_cost_w4": {"policy": "kv_cost", "params": {"overlap_weight": 4.0}},
    "session_affinity": {"policy": "session_affinity"},
}


def start_gateway(ps: Procs, engines: list[Proc], routing: str, name: str) -> Proc:
    cfg: dict[str, Any] = {
        "pools": {
            "short": {
                "max_model_len": 8192,
                "models": [MODEL],
                "workers": [{"url": e.url, "name": e.name} for e in engines],
                "routing": ROUTERS[routing],
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

    async def one(c: int, convs: list[tuple[str, str, list[str]]]) -> None:
        think = random.Random(f"{setup.seed}:think:{c}")
        if setup.ramp_s > 0:
            await asyncio.sleep(c / setup.clients * setup.ramp_s * setup.scale)
        for conv, system, turns in convs:
            messages = [{"role": "system", "content": system}]
            for turn in turns:
                messages.append({"role": "user", "content": turn})
                answer, reply = await chat(client, messages, conv)
                answers.append(answer)
                messages.append({"role": "assistant", "content": reply})
                if setup.think_s > 0:
                    await asyncio.sleep(think.expovariate(1.0 / setup.think_s) * setup.scale)

    await asyncio.gather(*(one(c, convs) for c, convs in enumerate(conversations(setup))))
    await client.close()
    return answers


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


ENGINE_TTFT = "vllm:time_to_first_token_seconds"


def engine_ttft(engines: list[Proc]) -> tuple[list[tuple[float, float]], float, float]:
    """The engines' TTFT histograms added: (cumulative (le, count) buckets, sum, count)."""
    buckets: dict[float, float] = {}
    total = count = 0.0
    for e in engines:
        text = httpx.get(e.url + "/metrics", timeout=10.0).text
        for fam in text_string_to_metric_families(text):
            if fam.name != ENGINE_TTFT:
                continue
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_sum"):
                    total += s.value
                elif s.name.endswith("_count"):
                    count += s.value
    return sorted(buckets.items()), total, count


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile: linear within the bucket holding rank q·count."""
    if not buckets or buckets[-1][1] == 0:
        return math.nan
    rank = q * buckets[-1][1]
    lo_le, lo_n = 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if math.isinf(le):
                return lo_le  # the highest finite bound, as PromQL answers
            return lo_le + (le - lo_le) * (rank - lo_n) / (n - lo_n) if n > lo_n else le
        lo_le, lo_n = le, n
    return lo_le


def run_router(ps: Procs, setup: Setup, routing: str) -> dict[str, Any]:
    engines = start_engines(ps, setup)
    gw = start_gateway(ps, engines, routing, f"gw-{routing}")
    t0 = time.perf_counter()
    answers = asyncio.run(drive(gw.url, setup))
    wall = time.perf_counter() - t0
    buckets, ttft_sum, ttft_count = engine_ttft(engines)
    for p in (gw, *engines):
        p.stop()
    ttft = [a.ttft / setup.scale for a in answers]
    return {
        "router": routing,
        "requests": len(answers),
        "hit": sum(a.cached_tokens for a in answers) / sum(a.prompt_tokens for a in answers),
        "ttft_p50": quantile(ttft, 0.5),
        "ttft_p90": quantile(ttft, 0.9),
        "ttft_p99": quantile(ttft, 0.99),
        "ttft_mean": sum(ttft) / len(ttft),
        "engine_ttft_mean": ttft_sum / ttft_count if ttft_count else math.nan,
        "engine_ttft_p50": histogram_quantile(0.5, buckets),
        "engine_ttft_p90": histogram_quantile(0.9, buckets),
        "engine_ttft_p99": histogram_quantile(0.99, buckets),
        "rps": len(answers) / (wall / setup.scale),
        "wall_s": wall,
    }
