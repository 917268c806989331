"""The request and response shapes /openapi.json documents.

The proxy routes' request models describe exactly what the fast path validates
(gateway/openai_request.py), nothing more: every other field is allowed and passed to the
engine untouched, which validates it and answers 400 itself. schemathesis checks the two
agree (tests/e2e/test_openapi_fuzz.py): whatever the schema calls valid is never refused
by the gateway's own validation, whatever it calls invalid is refused with a 4xx.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.config import Worker
from gateway.openai_request import MAX_INT

TokenCount = Annotated[int, Field(ge=1, le=MAX_INT)]
TokenId = Annotated[int, Field(ge=0, le=MAX_INT)]


class _Open(BaseModel):
    """Unknown fields pass through to the engine."""

    model_config = ConfigDict(extra="allow")


# stream_options (an object) only with stream: true, as vLLM requires
_STREAM_OPTIONS_NEED_STREAM: dict[str, Any] = {
    "if": {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]},
    "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
}


class ChatMessage(_Open):
    role: str = Field(min_length=1, examples=["user"])
    content: str | list[dict[str, Any]] | None = Field(
        None, description="text, a list of content parts (their `text` is counted), or null"
    )


class ChatCompletionRequest(_Open):
    model: str = Field(min_length=1, description="a model a pool serves (GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = Field(None, description="wins over max_tokens")
    stream: bool | None = False
    stream_options: dict[str, Any] | None = Field(
        None, description="with stream: true only; `include_usage: true` adds a usage chunk"
    )

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            **_STREAM_OPTIONS_NEED_STREAM,
            "examples": [
                {
                    "model": "llama-3.1-8b",
                    "messages": [{"role": "user", "content": "Hello!"}],
                    "max_tokens": 16,
                }
            ],
        },
    )


class CompletionRequest(_Open):
    model: str = Field(min_length=1, description="a model a pool serves (GET /v1/models)")
    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    )
    max_tokens: TokenCount | None = None
    stream: bool | None = False
    stream_options: dict[str, Any] | None = None

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            **_STREAM_OPTIONS_NEED_STREAM,
            "examples": [
                {"model": "llama-3.1-8b", "prompt": "The capital of France is", "max_tokens": 8}
            ],
        },
    )


class ErrorDetail(_Open):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(_Open):
    """Every refusal the gateway makes (and vLLM's own errors) have this shape."""

    error: ErrorDetail


class EngineErrorResponse(_Open):
    """An engine's own 4xx is passed through unchanged; SGLang's is flat."""

    object: str | None = None
    message: str | None = None


class Completion(_Open):
    """The engine's answer, relayed unchanged (chat.completion or text_completion)."""

    id: str
    object: str
    model: str
    choices: list[dict[str, Any]]
    usage: dict[str, Any] | None = None


class ModelCard(_Open):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "fleetgate"
    max_model_len: int = Field(description="the largest context a pool serving it offers")


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


class Status(BaseModel):
    status: str


class PlanHistogram(_Open):
    """`fleetgate.plan_histogram/v1`: the observed L_total histogram the planner reads."""

    schema_: str = Field(alias="schema")
    window_s: float
    requests: int
    arrival_rate: float
    buckets: list[list[int]] = Field(description="[upper bound in tokens, requests]")
    overflow: int
    compression: dict[str, int]


class LivePlan(_Open):
    """`fleetgate.live_plan/v1`: FleetOpt's recommendation beside the deployed fleet."""

    schema_: str = Field(alias="schema")
    observed: dict[str, Any]
    recommended: dict[str, Any]
    current: dict[str, Any] | None = None
    histogram: dict[str, Any]
    # with ?source=promised|demand: the entitled tokens/s and the arrival rate planned on
    entitlements: dict[str, Any] | None = None


def proxy_responses(stream_doc: str) -> dict[int | str, dict[str, Any]]:
    """The documented answers of a proxy route."""
    error = {"model": ErrorResponse}
    return {
        200: {
            "model": Completion,
            "description": "the engine's answer",
            "content": {
                "text/event-stream": {
                    # one SSE event: its data is a JSON chunk, or [DONE] at the end
                    "schema": {
                        "type": "object",
                        "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                        "required": ["data"],
                    },
                    "description": stream_doc,
                }
            },
        },
        400: {
            "model": ErrorResponse | EngineErrorResponse,
            "description": "invalid request, or too long for every pool (context_length_exceeded); the gateway's or the engine's own 400",
        },
        401: {**error, "description": "missing or unknown API key"},
        403: {**error, "description": "inactive entitlement"},
        404: {**error, "description": "no pool serves the model"},
        408: {**error, "description": "request body not received in time"},
        413: {**error, "description": "request body over limits.max_body_bytes"},
        415: {**error, "description": "compressed request bodies are not accepted"},
        422: {
            "model": ErrorResponse | EngineErrorResponse,
            "description": "the engine's own 422, passed through",
        },
        429: {**error, "description": "refused by admission (Retry-After)"},
        502: {**error, "description": "the worker failed or broke HTTP"},
        503: {**error, "description": "no healthy worker (Retry-After)"},
        504: {**error, "description": "the worker did not answer in time"},
    }


# --- the fleet's admin routes ----------------------------------------------------------------
class WorkerInfo(BaseModel):
    """One worker as the gateway sees it (GET /admin/workers)."""

    pool: str
    id: str
    url: str
    engine: str
    state: Literal["active", "draining"] = Field(
        description="draining: no new requests; it leaves when its last one ends"
    )
    healthy: bool = Field(description="passes health checks and its circuit is closed")
    in_flight: int = Field(description="requests this gateway has in flight on it")


class WorkerList(BaseModel):
    object: str = "list"
    data: list[WorkerInfo]


class AddWorker(Worker):
    """A worker to add (POST /admin/workers): its pool and its configuration, the keys of a
    `pools.<pool>.workers` item."""

    pool: str = Field(description="a configured pool")


class DrainResult(BaseModel):
    """A worker taken out of routing (state draining), or already gone (state removed)."""

    id: str
    pool: str
    state: Literal["draining", "removed"]
    in_flight: int


class ReloadResult(BaseModel):
    """What POST /admin/reload changed (worker ids)."""

    added: list[str]
    draining: list[str]
    kept: list[str]
    pools_added: list[str]
    pools_removed: list[str]
    not_applied: list[str] = Field(
        description="keys outside the fleet that changed in the file: they need a restart"
    )
