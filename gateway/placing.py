"""Step 3 for the gateway: the core's `start` on a parsed HTTP request.

The decisions — estimate the budget, place — are the pure core's (policies/core.py over
policies/intake.py), the same the simulator drives. This module adds what only the gateway
has: the core's `Request` from a parsed HTTP request, the HTTP refusals of placement (404,
and 400 `context_length_exceeded` in the OpenAI shape the SDK reads) and the
observed-traffic histogram. Counting exactly and compressing (the `Fit` action) is
gateway/fitting.py's.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from compressor.content import classify
from gateway.errors import ContextLengthExceeded, ModelNotFound
from gateway.openai_request import CHAT, ParsedRequest
from gateway.traffic import TrafficHistogram
from policies.actions import Action, Refuse
from policies.budget import ChatSize
from policies.core import Core
from policies.events import Request
from policies.intake import Prompt
from policies.types import Category, PoolSpec


class FleetView(Protocol):
    """What placement reads of the fleet (gateway/workers.py's `Fleet`)."""

    specs: list[PoolSpec]

    def live_pools(self, now: float) -> frozenset[str]: ...


def classify_prompt(prompt: Prompt) -> Category:
    """The content category of a request's text (the Intake's classifier)."""
    if prompt.endpoint == CHAT:
        return classify(messages=prompt.messages)
    text = prompt.prompt
    return classify(prompt=text if isinstance(text, str) else "\n".join(text or ()))


def core_request(parsed: ParsedRequest, rid: str, fleet: FleetView, now: float) -> Request:
    """The core's `Request` for a parsed HTTP request (the driver adds what it knows
    of the caller: entitlement, service class, prefix hashes)."""
    chat = parsed.endpoint == CHAT
    prompt = Prompt(
        parsed.endpoint,
        parsed.model,
        ChatSize(parsed.prompt_bytes, parsed.n_messages),
        parsed.max_tokens,
        parsed.stream,
        parsed.prompt_token_ids,
        parsed.body["messages"] if chat else None,
        None if chat else parsed.body["prompt"],
        ascii=parsed.prompt_ascii,
        prompts=parsed.prompts,
        choices=parsed.choices,
    )
    return Request(prompt, rid, fleet.specs, fleet.live_pools(now))


def start_request(
    core: Core,
    traffic: TrafficHistogram,
    parsed: ParsedRequest,
    request: Request,
    now: float,
    known_models: Collection[str],
) -> Action:
    """The core starts the request: placed, or refused with 404/413 here."""
    action = core.start(request, now)
    if action.ticket is None:  # type: ignore[union-attr]
        assert isinstance(action, Refuse)
        if action.status == 404:
            raise ModelNotFound(
                f"The model `{parsed.model}` does not exist. Available models: {', '.join(sorted(known_models))}.",
                param="model",
            )
        info = action.info
        assert info is not None
        traffic.observe(info.total_tokens, info.prompt_tokens)
        why = action.reason.partition("; ")[2]  # e.g. compression needs a larger pool
        raise ContextLengthExceeded(
            f"This request needs about {info.total_tokens} tokens ({info.prompt_tokens} in the prompt, "
            f"estimated, + {info.max_tokens} for the completion), more than the largest context serving "
            f"`{parsed.model}` ({action.limit} tokens). Shorten the prompt or lower max_tokens."
            + (f" ({why})" if why else ""),
            param=action.param,
        )
    placed = action.ticket.placed  # type: ignore[union-attr]
    traffic.observe(placed.info.total_tokens, placed.info.prompt_tokens)
    if placed.placement.in_band:
        traffic.band()
    return action
