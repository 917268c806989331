"""Step 4 for the gateway: the core's `Fit` — count a prompt exactly and compress it to
the placement's target — on parsed HTTP requests.

The decision (what to count, when to compress, what a result means) is the pure core's
(policies/core.py over policies/intake.py), the same the simulator drives. This module adds
what only the gateway has: the real compressor run off the event loop, the engine's
`/tokenize` (tokenizer: engine|auto), the rewritten request body, the
`fleetgate_compress_*` metrics and the observed-traffic histogram.

Off the event loop: the exact count and compression (milliseconds of CPU) run on a thread
pool (`placement.compress_workers`, default 1; 0 runs them inline), so a borderline
request does not stall the streams the loop is relaying.

Failure posture: compression that cannot reach T_c sends the original request to the
placement's fallback (the long pool); with no fallback the answer is 400
`context_length_exceeded` naming why.
`fleetgate_compress_*` metrics tell borderline, compressed and fell-back requests apart.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable
from concurrent.futures import Executor
from typing import Any

from compressor.compress import Compression, CompressorConfig, fit_request
from compressor.hf_template import TemplateError
from compressor.template import ServedTemplate, Tools, default_template
from gateway.errors import ContextLengthExceeded
from gateway.metrics import GatewayMetrics
from gateway.openai_request import CHAT, ParsedRequest
from gateway.tokenize import EngineTokenizer, fit_with_engine
from gateway.traffic import TrafficHistogram
from policies.actions import Action, Fit, Refuse
from policies.core import Core
from policies.events import Fitted
from policies.ticket import Ticket
from policies.uncertainty import counted_in_band


def compressed_header(ticket: Ticket) -> str | None:
    """`before->after` prompt tokens, the x-fleetgate-compressed header's value."""
    c = ticket.placed.compressed
    return None if c is None else f"{c[0]}->{c[1]}"


def rewritten_body(parsed: ParsedRequest, ticket: Ticket) -> dict[str, Any] | None:
    """The request body to send when compression changed the text, else None."""
    c = ticket.placed.compression
    if c is None:
        return None
    body = dict(parsed.body)
    if c.messages is not None:
        body["messages"] = c.messages
    else:
        body["prompt"] = c.prompt
    return body


class PromptFitter:
    """Counts a prompt exactly and compresses it to the target placement asked for (the
    `Fit` action), then tells the core (`Fitted`)."""

    def __init__(
        self,
        core: Core,
        metrics: GatewayMetrics,
        traffic: TrafficHistogram,
        executor: Executor | None = None,
        served: ServedTemplate | None = None,
        compressor: CompressorConfig | None = None,
        engine: EngineTokenizer | None = None,
    ) -> None:
        self.core = core
        # tokenizer: engine — the short pool's workers count borderline requests
        self.engine = engine
        # the short pool's tokenizer and chat template: T_c is in its tokens
        self.served = served or default_template()
        self.compressor = compressor or CompressorConfig()
        self.metrics = metrics
        self.traffic = traffic
        self.executor = executor  # where compression runs; None: inline on the event loop

    async def fit(self, parsed: ParsedRequest, fit: Fit) -> Action:
        """Count exactly and compress to `fit.target`, as placement asked; the core's
        next action.

        The count and compression take milliseconds of CPU (8–12K-token prompts): they run
        on `executor` so the event loop keeps relaying every other request's stream."""
        ticket = fit.ticket
        placed = ticket.placed
        target = fit.target
        param = "messages" if parsed.endpoint == CHAT else "prompt"
        placement = placed.placement
        m = self.metrics
        if placement.borderline:
            m.compress_borderline.inc()
        if placement.uncertain:
            m.compress_uncertain.inc()
        prompt = parsed.body.get("prompt") if parsed.endpoint != CHAT else None
        if parsed.prompt_token_ids or (parsed.endpoint != CHAT and not isinstance(prompt, str)):
            # token ids or a batch of prompts: counted as given, never rewritten
            exact = parsed.prompt_token_ids or placed.info.prompt_tokens
            result = Compression(
                target, exact, exact, detail="token-id and batched prompts are not compressed"
            )
        else:
            messages = parsed.body["messages"] if parsed.endpoint == CHAT else None
            raw_tools = parsed.body.get("tools") if parsed.endpoint == CHAT else None
            tools: Tools = raw_tools if isinstance(raw_tools, list) else ()

            async def run(aim: int, may: bool, likely: bool) -> Compression:
                call = functools.partial(
                    _timed_fit,
                    aim,
                    prompt,
                    messages,
                    may,
                    likely,
                    self.served,
                    tools,
                    self.compressor,
                )
                if self.executor is None:
                    out, seconds = call()
                else:
                    loop = asyncio.get_running_loop()
                    out, seconds = await loop.run_in_executor(self.executor, call)
                m.compress_seconds.observe(seconds)
                return out

            engine_result = None
            if self.engine is not None:
                engine_result = await fit_with_engine(
                    self.engine,
                    parsed.model,
                    target,
                    placement.may_compress,
                    lambda aim: run(aim, True, False),
                    lambda: _count_of(run(0, False, False)),
                    messages=messages,
                    prompt=prompt if isinstance(prompt, str) else None,
                    tools=list(tools) or None,
                    compress_within=placement.compress_within,
                )
            if engine_result is not None:
                result = engine_result
            elif placement.uncertain:  # issue 24: count, then compress only within the band
                result = await run(target, False, True)
                within = placement.compress_within
                if (
                    placement.may_compress
                    and not result.fits
                    and within is not None
                    and result.tokens_before <= within
                ):
                    result = await run(target, True, False)
            else:  # counted locally: the served template, or the engine's fallback
                result = await run(target, placement.may_compress, not placement.borderline)
        action = self.core.on(ticket, Fitted(result, param), asyncio.get_running_loop().time())
        if counted_in_band(placement, result.tokens_before):  # placed by the count
            self.traffic.band()
            if placement.may_compress:
                m.compress_borderline.inc()
                self.traffic.compression(ticket.placed.compression is not None)
        if placement.borderline:
            self.traffic.compression(result.fits)
        if isinstance(action, Refuse) and action.code == "too_long":
            raise ContextLengthExceeded(action.reason, param=param)
        if not result.fits:
            m.compress_fallback.inc()
        elif result.changed:
            m.compress_compressed.inc()
            m.compress_tokens_removed.inc(result.tokens_removed)
        return action


async def _count_of(fit: Awaitable[Compression]) -> int:
    """The local count of a request: a count-only fit's tokens before."""
    return (await fit).tokens_before


def _timed_fit(
    target: int,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    may_compress: bool,
    likely_fits: bool,
    served: ServedTemplate,
    tools: Tools,
    config: CompressorConfig,
) -> tuple[Compression, float]:
    """fit_request and the CPU seconds it took (measured where it runs)."""
    t0 = time.perf_counter()
    try:
        result = fit_request(
            target,
            prompt=prompt,
            messages=messages,
            may_compress=may_compress,
            likely_fits=likely_fits,
            template=served,
            tools=tools,
            config=config,
        )
    except TemplateError as exc:  # the model's template refuses it: the engine would too
        result = Compression(target, target + 1, target + 1, detail=str(exc))
    return result, time.perf_counter() - t0
