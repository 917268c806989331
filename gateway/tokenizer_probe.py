"""`tokenizer: auto` (the default): which counter each pool's prompts are counted with.

At start the gateway asks one routable worker of every pool with `tokenizer: auto` or
`engine` for its `/tokenize` (docs/WIRE_SPEC.md §3), once per form:

    chat     {"model", "messages": [{"role": "user", "content": "Hello"}],
              "add_generation_prompt": true}          vLLM; SGLang versions with `messages`
    prompt   {"model", "prompt": "Hello", "add_special_tokens": true}   vLLM and SGLang

and settles the pool's counter, exported as `fleetgate_tokenizer_info{pool,source}` = 1
and logged:

    engine          both forms answer with a count: the engine counts borderline prompts
    engine_prompt   only the prompt form (SGLang without `messages`): completions are
                    counted by the engine, chats locally
    hf              `tokenizer: hf:<folder>`: the model's own tokenizer.json and template
    cl100k          `tokenizer: cl100k`, or nothing answered: OpenAI's vocabulary in the
                    Llama-3.0 layout — exact only for the emulator, the stated fallback

A pool left on cl100k whose models are not OpenAI's is logged as an error at start:
its counts are wrong by up to a quarter for Llama-3 and Qwen3 text (more for CJK), and
requests compressed to its T_c may still overflow (the engine's 400 then retries them
on the long pool, gateway/proxy.py's safety net). A pool whose workers are all down at
start is exported as cl100k and then counted as `engine` would be: each request that
needs a count asks, vLLM for both forms, SGLang for prompts, and falls back to cl100k
when nobody answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from compressor.served import AUTO, ENGINE, parse_spec
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.tokenize import EngineTokenizer
from gateway.upstream import UpstreamClient
from gateway.workers import Fleet

log = logging.getLogger("fleetgate.tokenize")

OPENAI_PREFIXES = ("gpt-", "gpt4", "o1", "o3", "o4", "chatgpt", "text-davinci", "davinci")
_PROBE_TEXT = "Hello"


def openai_model(name: str) -> bool:
    """Does `name` look like an OpenAI model (whose vocabulary cl100k or o200k is)?"""
    base = name.rsplit("/", 1)[-1].lower()
    return base.startswith(OPENAI_PREFIXES)


async def probe(engine: EngineTokenizer, model: str) -> str:
    """Ask the pool's `/tokenize` once per form; set `engine.chat_form`/`prompt_form` and
    return the source ("engine", "engine_prompt", or "cl100k" when neither answered)."""
    chat, prompt = await asyncio.gather(
        engine.count(model, messages=[{"role": "user", "content": _PROBE_TEXT}], probing=True),
        engine.count(model, prompt=_PROBE_TEXT, probing=True),
    )
    if chat is None and prompt is None and engine.unreachable:
        return "cl100k"  # nobody to ask now: leave the forms unknown, ask per request
    engine.chat_form = chat is not None
    engine.prompt_form = prompt is not None
    if chat is not None:
        return ENGINE
    return "engine_prompt" if prompt is not None else "cl100k"


async def settle(
    pools: Mapping[str, tuple[str, Iterable[str]]],
    engines: Mapping[str, EngineTokenizer],
    metrics: GatewayMetrics,
) -> dict[str, str]:
    """The source of every pool (`pools`: name → (tokenizer spec, models)); probes the
    pools in `engines` concurrently, exports and logs the outcome."""

    async def one(name: str, spec: str, models: list[str]) -> str:
        kind, _ = parse_spec(spec)
        if kind == "hf":
            return "hf"
        if kind in (AUTO, ENGINE) and name in engines:
            return await probe(engines[name], models[0] if models else "")
        return "cl100k"

    names = list(pools)
    found = await asyncio.gather(*(one(n, pools[n][0], list(pools[n][1])) for n in names))
    sources = dict(zip(names, found, strict=True))
    for name, source in sources.items():
        spec, models = pools[name]
        metrics.tokenizer_info.labels(name, source).set(1)
        log.info("pool %s: prompts counted with %s (tokenizer: %s)", name, source, spec)
        foreign = [m for m in models if not openai_model(m)]
        if source == "cl100k" and foreign:
            log.error(
                "pool %s serves %s but counts prompts with cl100k (OpenAI's vocabulary): "
                "counts can be off by a quarter or more and compressed requests may overflow "
                "its context. Give it `tokenizer: hf:<the model's tokenizer folder>`, or serve "
                "it from an engine with /tokenize (vLLM) and `tokenizer: auto`.",
                name,
                ", ".join(foreign),
            )
    return sources


async def settle_fleet(
    config: GatewayConfig,
    client: UpstreamClient,
    fleet: Fleet,
    metrics: GatewayMetrics,
    now: Callable[[], float],
    short_engine: EngineTokenizer | None,
) -> dict[str, str]:
    """`settle` for a configured fleet: the short pool is probed through the engine
    tokenizer that counts its borderline requests (so what is found is what is used);
    other pools through one made for the probe."""
    engines: dict[str, EngineTokenizer] = {}
    for name, pool in config.pools.items():
        if parse_spec(pool.tokenizer)[0] not in (AUTO, ENGINE):
            continue
        if short_engine is not None and name == short_engine.pool:
            engines[name] = short_engine
        else:
            engines[name] = EngineTokenizer(
                client, fleet, name, pool.tokenize_timeout_s, metrics, now
            )
    pools = {n: (p.tokenizer, p.models) for n, p in config.pools.items()}
    return await settle(pools, engines, metrics)
