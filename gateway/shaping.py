"""Steps 3–4 of the pipeline: estimate the token budget, place the request, compress it.

estimate (policies/budget: ⌈bytes/ĉ_k⌉ + template + max_tokens) → place
(policies/pools: short, compress-then-short, long; 404/413) → for a placement with a
target T_c, count exactly and compress (compressor/compress.fit_request) → the pools to
try and the body to send.

Off the event loop: the exact count and compression (milliseconds of CPU) run on a thread
pool (`placement.compress_workers`, default 1; 0 runs them inline), so a borderline
request does not stall the streams the loop is relaying.

Hot-path posture: a request whose L_total, estimated with the most pessimistic plausible
bytes-per-token (`_FLOOR_BYTES_PER_TOKEN`), is clearly below the short pool's boundary is
placed without running the content classifier (tens of µs) — its category cannot change
where it goes. Those requests are not fed to the ĉ_k estimator either; the ones near or
above the boundary, whose estimate matters, are. Compression (a few ms) runs inline only
for the borderline band and for the near-boundary requests that need an exact count.

Failure posture: compression that cannot reach T_c sends the original request to the
placement's fallback (the long pool); with no fallback the answer is 413 naming why.
`fleetgate_compress_*` metrics tell borderline, compressed and fell-back requests apart.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Collection
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from compressor.compress import Compression, fit_request
from compressor.content import classify
from gateway.errors import ContextLengthExceeded, ModelNotFound
from gateway.metrics import GatewayMetrics
from gateway.openai_request import CHAT, ParsedRequest
from gateway.traffic import TrafficHistogram
from policies.budget import BudgetConfig, ChatSize, TokenBudget, measure_chat, measure_prompt
from policies.pools import CompressAndRoute, Placement, ShortLongPlacement, Verdict
from policies.types import Category, PoolSpec, RequestInfo

# No cl100k text seen in the wild packs fewer than ~3 bytes per token outside CJK and
# base64-like data; below this ratio the estimate is an upper bound for the fast path.
_FLOOR_BYTES_PER_TOKEN = 3.0


@dataclass(slots=True)
class Shaped:
    """Where a request goes and what is sent there."""

    info: RequestInfo
    placement: Placement
    pools: tuple[str, ...]
    body: dict[str, Any] | None = None  # the rewritten request body, when compressed
    compressed: tuple[int, int] | None = None  # (tokens before, after)
    classified: bool = False  # category came from the classifier (feeds ĉ_k)
    size: ChatSize | None = None  # what was sent, for the ĉ_k update
    estimated_prompt_tokens: int = 0
    fit_target: int | None = None  # T_c to count (and compress) to before sending
    param: str = "messages"  # the field a 413 names

    @property
    def compressed_text(self) -> str | None:
        """`before->after` prompt tokens, the x-fleetgate-compressed header's value."""
        return None if self.compressed is None else f"{self.compressed[0]}->{self.compressed[1]}"


class Shaper:
    def __init__(
        self,
        placer: CompressAndRoute | ShortLongPlacement,
        budget: TokenBudget,
        b_short: int,
        metrics: GatewayMetrics,
        traffic: TrafficHistogram,
        executor: Executor | None = None,
    ) -> None:
        self.placer = placer
        self.executor = executor  # where compression runs; None: inline on the event loop
        self.budget = budget
        self.metrics = metrics
        self.traffic = traffic
        margin = getattr(placer, "verify_margin", 0.0)
        self._fast_limit = (1.0 - margin) * b_short if isinstance(placer, CompressAndRoute) else 0.0

    def shape(
        self,
        parsed: ParsedRequest,
        rid: str,
        now: float,
        specs: list[PoolSpec],
        healthy: Collection[str],
        known_models: Collection[str],
    ) -> Shaped:
        cfg: BudgetConfig = self.budget.config
        size = ChatSize(parsed.prompt_bytes, parsed.n_messages)
        max_tokens = parsed.max_tokens or cfg.default_max_tokens
        classified = False
        if parsed.prompt_token_ids:
            category, prompt_tokens = (
                Category.CODE,
                parsed.prompt_token_ids,
            )  # exact; ids never compress
        else:
            upper = math.ceil(size.content_bytes / _FLOOR_BYTES_PER_TOKEN) + max_tokens + 16
            if upper <= self._fast_limit:
                category = Category.CHAT if parsed.endpoint == CHAT else Category.PROSE
            else:
                category = self._classify(parsed)
                classified = True
            prompt_tokens = self.budget.estimate(size, category, max_tokens).prompt_tokens
        info = RequestInfo(
            id=rid,
            model=parsed.model,
            arrival=now,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            category=category,
            stream=parsed.stream,
        )
        placement = (
            self.placer.place(info, specs, healthy)
            if isinstance(self.placer, CompressAndRoute)
            else self.placer.place(info, specs)
        )
        if placement.verdict is Verdict.NO_MODEL:
            raise ModelNotFound(
                f"The model `{parsed.model}` does not exist. Available models: {', '.join(sorted(known_models))}.",
                param="model",
            )
        self.traffic.observe(info.total_tokens, info.prompt_tokens)
        param = "messages" if parsed.endpoint == CHAT else "prompt"
        if placement.verdict is Verdict.TOO_LONG:
            raise ContextLengthExceeded(
                f"This request needs about {info.total_tokens} tokens ({info.prompt_tokens} in the prompt, "
                f"estimated, + {info.max_tokens} for the completion), more than the largest context serving "
                f"`{parsed.model}` ({placement.limit} tokens). Shorten the prompt or lower max_tokens.",
                param=param,
            )
        shaped = Shaped(info, placement, placement.pools, classified=classified, size=size)
        shaped.estimated_prompt_tokens = prompt_tokens
        shaped.fit_target = placement.compress_to
        shaped.param = param
        return shaped

    def _classify(self, parsed: ParsedRequest) -> Category:
        if parsed.endpoint == CHAT:
            return classify(messages=parsed.body["messages"])
        prompt = parsed.body["prompt"]
        return classify(prompt=prompt if isinstance(prompt, str) else "\n".join(prompt))

    async def fit(self, parsed: ParsedRequest, shaped: Shaped) -> None:
        """Count exactly and compress to `shaped.fit_target`, if placement asked for it.

        The count and compression take milliseconds of CPU (8–12K-token prompts): they run
        on `executor` so the event loop keeps relaying every other request's stream."""
        target = shaped.fit_target
        if target is None:
            return
        param = shaped.param
        placement = shaped.placement
        m = self.metrics
        if placement.borderline:
            m.compress_borderline.inc()
        prompt = parsed.body.get("prompt") if parsed.endpoint != CHAT else None
        if parsed.prompt_token_ids or (parsed.endpoint != CHAT and not isinstance(prompt, str)):
            # token ids or a batch of prompts: counted as given, never rewritten
            exact = parsed.prompt_token_ids or shaped.info.prompt_tokens
            result = Compression(
                target, exact, exact, detail="token-id and batched prompts are not compressed"
            )
        else:
            call = functools.partial(
                _timed_fit,
                target,
                prompt,
                parsed.body["messages"] if parsed.endpoint == CHAT else None,
                placement.may_compress,
                not placement.borderline,
            )
            if self.executor is None:
                result, seconds = call()
            else:
                result, seconds = await asyncio.get_running_loop().run_in_executor(
                    self.executor, call
                )
            m.compress_seconds.observe(seconds)
        if result.fits:
            shaped.info.prompt_tokens = result.tokens_after  # exact from here on
            if result.changed:
                body = dict(parsed.body)
                if result.messages is not None:
                    body["messages"] = result.messages
                    shaped.size = measure_chat(result.messages)
                else:
                    body["prompt"] = result.prompt
                    shaped.size = measure_prompt(result.prompt or "")
                shaped.body = body
                shaped.compressed = (result.tokens_before, result.tokens_after)
                m.compress_compressed.inc()
                m.compress_tokens_removed.inc(result.tokens_removed)
            if placement.borderline:
                self.traffic.compression(True)
            return
        if placement.borderline:
            self.traffic.compression(False)
        if not placement.fallback:
            raise ContextLengthExceeded(
                f"{placement.reason}: cannot fit {result.tokens_before} prompt tokens into {target} "
                f"({result.detail or 'nothing left to drop'}), and no larger pool can take it.",
                param=param,
            )
        m.compress_fallback.inc()
        shaped.pools = placement.fallback
        shaped.info.prompt_tokens = result.tokens_before


def _timed_fit(
    target: int,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    may_compress: bool,
    likely_fits: bool,
) -> tuple[Compression, float]:
    """fit_request and the CPU seconds it took (measured where it runs)."""
    t0 = time.perf_counter()
    result = fit_request(
        target, prompt=prompt, messages=messages, may_compress=may_compress, likely_fits=likely_fits
    )
    return result, time.perf_counter() - t0
