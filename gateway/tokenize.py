"""`tokenizer: engine`: the short pool's workers count borderline prompts themselves.

For a pool whose model the gateway has no tokenizer files for, the exact count comes
from a worker's `/tokenize` (docs/WIRE_SPEC.md §3), asked only for requests placement
wants counted exactly or compressed (`fit_target`), never on the hot path of the rest:

    vLLM     POST /tokenize {"model", "messages", "tools"?, "add_generation_prompt": true}
             or {"model", "prompt", "add_special_tokens": true} → {"count", "max_model_len", …}
    SGLang   POST /tokenize {"prompt", "add_special_tokens": true} → {"count", …}; it has no
             chat form, so a chat on SGLang is counted locally ("unsupported")

Each call has its own deadline (`pools.<name>.tokenize_timeout_s`, default 0.5 s) and goes
to the least busy routable worker of the pool over the gateway's upstream client. Every
call is counted in `fleetgate_tokenize_requests_total{pool,result}`; on a timeout, an
error or an unsupported form the request is counted locally (cl100k in the Llama-3.0
layout, the default template) as with `tokenizer: cl100k`, and the context-length
safety net (the core's, policies/core.py) is what remains if that count was wrong.

Calibration (the compressor stays pure: it only ever counts cl100k): the engine's count
E of the original request and the local count L of it give the request's ratio r = E / L.
A request with E ≤ T_c fits as it is (and is not counted locally). Otherwise the compressor
shortens it to ⌊T_c / r⌋ local tokens, and the result is counted by the engine once more:
at most T_c, it is sent with that count (exact: Eq. 15 holds in the engine's tokens);
over, the local target is lowered by the excess, converted to local tokens at the rate the
tokens dropped so far were worth in the engine's count, and the engine checks
once more, up to `ENGINE_ROUNDS` (4) compressions; still over, the request is not
compressed (the long pool). If a re-check gets no answer, the estimate r × L' is trusted
only when it is at least `RECHECK_MARGIN` of T_c below it. A counted placement's request
(policies/uncertainty.py) that the engine counts above the band is not compressed at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from compressor.compress import Compression
from gateway.metrics import GatewayMetrics
from gateway.upstream import UpstreamClient
from gateway.upstream_errors import UpstreamError
from gateway.workers import Fleet, WorkerState

log = logging.getLogger("fleetgate.tokenize")

# compressions checked by the engine before the request goes long uncompressed: the ratio
# of what is kept can differ from the whole's (a CJK page with ASCII option tables: the
# compressor drops more of one than the other), so two were often not enough (issue 24)
ENGINE_ROUNDS = 4
RECHECK_MARGIN = 0.02  # share of T_c an unchecked estimate must stay below it
CACHE_ENTRIES = 4096  # engine counts kept (a 16-byte digest and an int each)
MAX_RESPONSE_BYTES = 4 << 20  # /tokenize lists the ids: ~6 bytes a token
_HEADERS = b"content-type: application/json\r\n"

# (target in local tokens) → the compressor's answer for it, run where compression runs
Compress = Callable[[int], Awaitable[Compression]]


class EngineTokenizer:
    """Asks a worker of `pool` for the prompt tokens of a request (see the module doc)."""

    def __init__(
        self,
        client: UpstreamClient,
        fleet: Fleet,
        pool: str,
        timeout_s: float,
        metrics: GatewayMetrics,
        now: Callable[[], float],
    ) -> None:
        self.client = client
        self.fleet = fleet
        self.pool = pool
        self.timeout_s = timeout_s
        self.now = now
        self._results = {
            r: metrics.tokenize_requests.labels(pool, r)
            for r in ("ok", "timeout", "error", "unsupported", "cached")
        }
        # what the start-up probe found (gateway/tokenizer_probe.py); None: not probed,
        # the chat form is then asked of vLLM only, as the engines documented it
        self.chat_form: bool | None = None
        self.prompt_form: bool | None = None
        # the engine's counts of whole requests, by a digest of the body asked: the count
        # of an original is asked again after compression fails or by a retried request,
        # and a chat resent with the same history is the same body
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        self.unreachable = False  # no routable worker at the last call

    def _worker(self) -> WorkerState | None:
        now = self.now()
        ready = [w for w in self.fleet.pools.get(self.pool, ()) if w.routable(now)]
        return min(ready, key=lambda w: w.in_flight) if ready else None

    async def count(
        self,
        model: str,
        *,
        messages: list[Any] | None = None,
        prompt: str | None = None,
        tools: list[Any] | None = None,
        probing: bool = False,
    ) -> int | None:
        """The engine's prompt tokens for a chat (`messages`) or a completion `prompt`;
        None when it cannot say in time (counted by result in the metric). `probing`:
        ask whatever the forms found so far (gateway/tokenizer_probe.py)."""
        worker = self._worker()
        self.unreachable = worker is None
        if worker is None:  # the pool is down: placement sends the request elsewhere anyway
            self._results["error"].inc()
            return None
        chat_ok = self.chat_form if self.chat_form is not None else worker.engine == "vllm"
        if not probing and (
            (messages is not None and not chat_ok)
            or (messages is None and self.prompt_form is False)
        ):
            self._results["unsupported"].inc()
            return None
        body: dict[str, Any] = {"model": model}
        if messages is not None:
            body.update(messages=messages, add_generation_prompt=True)
            if tools:
                body["tools"] = tools
        else:
            body.update(prompt=prompt or "", add_special_tokens=True)
        data = json.dumps(body, ensure_ascii=False).encode()
        key = hashlib.blake2b(data, digest_size=16).digest()
        held = self._counts.get(key)
        if held is not None:
            self._counts.move_to_end(key)
            self._results["cached"].inc()
            return held
        headers = _HEADERS + worker.extra_headers
        try:
            async with asyncio.timeout(self.timeout_s):
                up = await self.client.request(
                    worker.endpoint, b"POST", b"/tokenize", headers, data
                )
                try:
                    raw = await up.read(MAX_RESPONSE_BYTES)
                finally:
                    up.release()
        except TimeoutError:
            self._results["timeout"].inc()
            log.warning(
                "%s: /tokenize took over %.2f s; counting locally", worker.id, self.timeout_s
            )
            return None
        except UpstreamError as exc:
            self._results["error"].inc()
            log.warning("%s: /tokenize failed (%s); counting locally", worker.id, exc)
            return None
        n = _count_of(raw) if up.status == 200 else None
        if n is None:
            self._results["error"].inc()
            log.warning("%s: /tokenize answered %d without a count", worker.id, up.status)
            return None
        self._results["ok"].inc()
        self._counts[key] = n
        if len(self._counts) > CACHE_ENTRIES:
            self._counts.popitem(last=False)
        return n


def _count_of(raw: bytes) -> int | None:
    try:
        answer = json.loads(raw)
    except ValueError:
        return None
    n = answer.get("count") if isinstance(answer, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


async def fit_with_engine(
    engine: EngineTokenizer,
    model: str,
    target: int,
    may_compress: bool,
    compress: Compress,
    local_count: Callable[[], Awaitable[int]],
    *,
    messages: list[Any] | None = None,
    prompt: str | None = None,
    tools: list[Any] | None = None,
    compress_within: int | None = None,
) -> Compression | None:
    """The fit of a request in the engine's tokens (see the module docstring), or None
    when the engine did not count the original (the caller counts locally). A request
    the engine counts above `compress_within` (a counted placement's band) is not
    compressed."""

    def ask(m: list[Any] | None, p: str | None) -> Awaitable[int | None]:
        return engine.count(model, messages=m, prompt=p, tools=tools)

    sent_messages = list(messages) if messages is not None else None
    if not may_compress:
        first = await ask(messages, prompt)
        if first is None:
            return None
        detail = "" if first <= target else "may not be compressed"
        return Compression(target, first, first, prompt, sent_messages, detail=detail)
    first = await ask(messages, prompt)
    if first is None:
        return None
    if first <= target:
        return Compression(target, first, first, prompt, sent_messages)
    if compress_within is not None and first > compress_within:
        return Compression(target, first, first, prompt, sent_messages, detail="above the band")
    # the local count only when a compression follows: most counted requests fit as they
    # are (a counted placement's interval is wide), and those pay no local count (~1 ms CPU)
    local = await local_count()
    ratio = first / max(local, 1)
    aim = math.floor(target / ratio)
    unchanged = Compression(target, first, first, prompt, sent_messages)
    for _ in range(ENGINE_ROUNDS):
        result = await compress(aim)
        if not result.fits or not result.changed:
            return Compression(target, first, first, prompt, sent_messages, detail=result.detail)
        after = await ask(result.messages, result.prompt)
        if after is None:
            estimate = math.ceil(result.tokens_after * ratio)
            if estimate <= target * (1 - RECHECK_MARGIN):
                return _in_engine_tokens(result, target, first, estimate)
            return _not_fitted(unchanged, "the engine did not re-check the compressed prompt")
        if after <= target:
            return _in_engine_tokens(result, target, first, after)
        # the engine tokens a local token removed were worth: what was dropped so far may
        # pack differently from the whole (CJK prose around ASCII tables), so correct by
        # that marginal ratio, not the whole's (a secant step; the whole's when unknown)
        dropped_local = local - result.tokens_after
        marginal = (first - after) / dropped_local if dropped_local > 0 else 0.0
        if not 0.05 < marginal < 20:
            marginal = after / max(result.tokens_after, 1)
        aim = min(aim, result.tokens_after) - math.ceil((after - target) / marginal) - 1
    return _not_fitted(unchanged, "still above the target after the engine's re-check")


def _in_engine_tokens(result: Compression, target: int, before: int, after: int) -> Compression:
    return Compression(
        target, before, after, result.prompt, result.messages, result.units, result.units_dropped
    )


def _not_fitted(unchanged: Compression, detail: str) -> Compression:
    """The request as given, which the engine counted above the target."""
    return replace(unchanged, detail=detail)
