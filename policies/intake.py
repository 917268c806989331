"""Steps 3–4 of the request pipeline, and the learning half of step 9, for both drivers.

    estimate (policies/budget: ⌈bytes / ĉ_k⌉ + template + max_tokens)
      → place (a placement policy: short, compress-then-short, long; or a refusal)
      → [the driver counts exactly / compresses when `fit_target` is set — the gateway on a
         thread with the real compressor, the simulator with a compression model]
      → `fitted`: the pools to try, or a refusal
    … after the answer: `learn` feeds the engine's prompt_tokens back into ĉ_k.

The pipeline core (policies/core.py) owns the `Intake`; its two drivers, the gateway
(gateway/placing.py and fitting.py, on parsed HTTP requests) and the simulator (simulator/driver.py,
on workload specs), reach it through the core with the same objects,
so what the simulator shows about budgets and placement holds for the gateway. Refusals
are values (`Refusal`); each driver turns them into its own outcome (404/413, a
rejected record).

Hot-path posture: a request whose L_total, bounded with the most pessimistic plausible
bytes per token (`floor_bytes_per_token`), is clearly below the short pool's boundary
is placed without running the content classifier — its category cannot change where it
goes — and is not fed to ĉ_k either (`classified` is False); the ones near or above the
boundary are. A request whose category is already known (the simulator's workload)
skips the classifier too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from compressor.compress import Compression
from compressor.script import Script
from policies.budget import (
    BudgetEstimator,
    ChatSize,
    measure_chat,
    measure_prompt,
    template_tokens,
)
from policies.protocols.placement import Placement, Placer, Verdict
from policies.types import Category, PoolSpec, RequestInfo
from policies.uncertainty import ASCII_FLOOR, ByteBounds, beyond_band, place_uncertain

CHAT = "chat"
COMPLETIONS = "completions"

Classifier = Callable[["Prompt"], Category]
Scripter = Callable[["Prompt"], Script]


@dataclass(slots=True)
class Prompt:
    """What steps 3–4 need to know about a request."""

    endpoint: str  # CHAT or COMPLETIONS
    model: str
    size: ChatSize  # content bytes and message count
    max_tokens: int | None = None  # None: the configured default
    stream: bool = False
    token_ids: int = 0  # a completions prompt given as token ids: their exact count
    messages: list[dict[str, Any]] | None = None  # the text, where there is text
    prompt: str | list[str] | None = None
    category: Category | None = None  # known already (a workload), else classified
    ascii: bool = True  # all of the text is ASCII (else the fast path has no useful bound)
    # the prompt's exact token count, when known (the simulator's workload with
    # `budget: exact`): used instead of the byte estimate, and ĉ_k learns nothing from it
    exact_tokens: int | None = None
    prompts: int = 1  # a batched completion's prompts (each at most `size`'s)
    choices: int = 1  # sequences per prompt: n, or best_of when larger


@dataclass(slots=True)
class Placed:
    """A request placed: where it goes, and what the driver must count or compress first."""

    info: RequestInfo
    placement: Placement
    pools: tuple[str, ...]
    size: ChatSize  # of what is sent (the compressed text, once compressed)
    estimated_prompt_tokens: int
    classified: bool = False  # the category came from the classifier: feeds ĉ_k
    fit_target: int | None = None  # T_c: count exactly (and compress) to this first
    compression: Compression | None = None  # set by `fitted` when the text changed
    script: Script | None = None  # with `Intake.bounds`: the interval's key beside category

    @property
    def compressed(self) -> tuple[int, int] | None:
        """(prompt tokens before, after) when compression shortened the prompt."""
        c = self.compression
        return None if c is None else (c.tokens_before, c.tokens_after)


@dataclass(frozen=True, slots=True)
class Refusal:
    """No pool can serve the request: `kind` is "no_model" (404) or "too_long" (413)."""

    kind: str
    reason: str
    info: RequestInfo | None = None
    limit: int = 0
    param: str = "messages"


@dataclass(slots=True)
class Intake:
    placer: Placer
    estimator: BudgetEstimator  # L_in from bytes (ĉ_k), learning from the engines
    classify: Classifier | None = None  # None: unknown categories count as chat/prose
    # ASCII text seen in the wild packs no fewer than ~3 bytes into a cl100k token, so
    # bytes / 3 bounds its tokens for the fast path. Non-ASCII text packs far fewer
    # (Chinese ~2.5, emoji ~1.5 bytes per token): there only bytes / 1 is a bound.
    floor_bytes_per_token: float = 3.0
    # issue 24: count exactly where the estimate cannot place (policies/uncertainty.py);
    # None (the simulator): place on the estimate alone. `scripter` gives the script
    # (compressor/script.py; None: TEXT for ASCII, CJK otherwise).
    bounds: ByteBounds | None = None
    scripter: Scripter | None = None
    _fast_limit: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if self.bounds is not None:  # logs and JSON pack fewer bytes a token than prose
            self.floor_bytes_per_token = min(self.floor_bytes_per_token, ASCII_FLOOR)
        # requests this small are placed alike whatever their category: not classified
        self._fast_limit = self.placer.category_blind_below

    def take(
        self,
        prompt: Prompt,
        request_id: str,
        now: float,
        pools: Sequence[PoolSpec],
        healthy: Collection[str] | None = None,
    ) -> Placed | Refusal:
        """Estimate and place one request."""
        size = prompt.size
        max_tokens = prompt.max_tokens or self.estimator.config.default_max_tokens
        classified = False
        script: Script | None = None
        if prompt.token_ids:
            category, prompt_tokens = Category.CODE, prompt.token_ids  # exact; never compressed
        elif prompt.exact_tokens is not None:
            category = prompt.category or Category.CHAT
            prompt_tokens = prompt.exact_tokens
        else:
            category = prompt.category  # type: ignore[assignment]
            if category is None:
                floor = self.floor_bytes_per_token if prompt.ascii else 1.0
                upper = math.ceil(size.content_bytes / floor) + max_tokens + 16
                if (
                    upper > self._fast_limit
                    and prompt.ascii
                    and self.bounds is not None
                    and self.classify is not None
                ):
                    # the floor above is a log's or JSON's; prose packs ~1.5× more bytes a
                    # token: its script (a few µs on a sample) gives its own floor, so ASCII
                    # text far from both boundaries is still placed without the classifier
                    script = self._script(prompt)
                    upper = math.ceil(size.content_bytes / self.bounds.floor(script))
                    upper += max_tokens + 16
                if upper <= self._fast_limit or self.classify is None:
                    category = Category.CHAT if prompt.endpoint == CHAT else Category.PROSE
                    script = None  # placed alike whatever it holds: no interval to look at
                else:
                    category = self.classify(prompt)
                    classified = True
            else:
                classified = True
            if classified and self.bounds is not None and script is None:
                script = self._script(prompt)
            prompt_tokens = self.estimator.estimate(size, category, max_tokens).prompt_tokens
        info = RequestInfo(
            id=request_id,
            model=prompt.model,
            arrival=now,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            category=category,
            stream=prompt.stream,
            prompts=prompt.prompts,
            choices=prompt.choices,
        )
        placement = self.placer.place(info, pools, healthy)
        if script is not None and self.bounds is not None:
            placement = place_uncertain(
                self.bounds, self.placer, info, placement, size.content_bytes,
                self._template(size), script, pools, healthy,
            )  # fmt: skip
        param = "messages" if prompt.endpoint == CHAT else "prompt"
        if placement.verdict is Verdict.NO_MODEL:
            return Refusal("no_model", placement.reason, info, param="model")
        if placement.verdict is Verdict.TOO_LONG:
            return Refusal("too_long", placement.reason, info, placement.limit, param)
        return Placed(
            info,
            placement,
            placement.pools,
            size,
            prompt_tokens,
            classified=classified,
            fit_target=placement.compress_to,
            script=script,
        )

    def _script(self, prompt: Prompt) -> Script:
        if self.scripter is not None:
            return self.scripter(prompt)
        return Script.TEXT if prompt.ascii else Script.CJK

    def fitted(
        self, placed: Placed, result: Compression, param: str = "messages"
    ) -> Refusal | None:
        """Apply the exact count (and compression) the driver ran for `fit_target`."""
        placement = placed.placement
        if self.bounds is not None and placed.script is not None:  # an exact local count
            self.bounds.widen(
                placed.info.category, placed.script, placed.size.content_bytes,
                result.tokens_before - self._template(placed.size),
            )  # fmt: skip
        if result.fits and result.changed and beyond_band(placement, result.tokens_before):
            result = Compression(result.target, result.tokens_before, result.tokens_before,
                                 detail="counted above the band: not compressed")  # fmt: skip
        if result.fits:
            placed.info.prompt_tokens = result.tokens_after  # exact from here on
            if result.changed:
                placed.compression = result
                if result.messages is not None:
                    placed.size = measure_chat(result.messages)
                elif result.prompt is not None:
                    placed.size = measure_prompt(result.prompt)
                else:  # a modelled compression (the simulator): the text shrank in proportion
                    share = result.tokens_after / max(result.tokens_before, 1)
                    placed.size = ChatSize(
                        max(1, round(placed.size.content_bytes * share)), placed.size.n_messages
                    )
            return None
        if not placement.fallback:
            reason = (
                f"{placement.reason}: cannot fit {result.tokens_before} prompt tokens into "
                f"{result.target} ({result.detail or 'nothing left to drop'}), and no larger "
                "pool can take it."
            )
            return Refusal("too_long", reason, placed.info, placement.limit, param)
        placed.pools = placement.fallback
        placed.info.prompt_tokens = result.tokens_before
        return None

    def replace(self, placed: Placed, pools: Sequence[PoolSpec], refused_len: int) -> Placed | None:
        """Place again a request an engine refused as too long for its context
        (`refused_len`): the original prompt (uncompressed: its count before compression),
        by the placement policy, on the pools with a longer context. None when none is
        left, or placement refuses. Its size and the engine's count no longer match:
        ĉ_k learns nothing from it (`classified` False)."""
        longer = [p for p in pools if p.max_model_len > refused_len]
        if not longer:
            return None
        info = placed.info
        c = placed.compression
        if c is not None:
            info.prompt_tokens = c.tokens_before
        placement = self.placer.place(info, longer)
        if placement.verdict is not Verdict.PLACED:
            return None
        return dataclasses.replace(
            placed, placement=placement, pools=placement.pools, classified=False, fit_target=None
        )

    def learn(self, placed: Placed, engine_prompt_tokens: int) -> None:
        """ĉ_k learns from what was actually sent (the compressed text, if compressed)."""
        if placed.classified and engine_prompt_tokens:
            self.estimator.observe(placed.size, placed.info.category, engine_prompt_tokens)
            if self.bounds is not None and placed.script is not None:
                self.bounds.widen(
                    placed.info.category, placed.script, placed.size.content_bytes,
                    engine_prompt_tokens - self._template(placed.size),
                )  # fmt: skip

    def _template(self, size: ChatSize) -> int:
        return template_tokens(size.n_messages, self.estimator.config)
