"""The FastAPI app: every route but the hot path, and the OpenAPI document of all of them.

GET /v1/models, GET /health (vLLM's: 200 with an empty body while a worker can take
traffic, else 503), GET /healthz (the process is up), GET /readyz, GET /metrics, and the
admin routes behind `auth.admin_key`. POST /v1/chat/completions and /v1/completions are
declared here only for /docs and /openapi.json: gateway/edge.py serves them before
FastAPI sees the request. Every other request reaches FastAPI through gateway/guard.py,
which has checked its key and read its body within the limits already.

Every refusal, FastAPI's own included (unknown path, wrong method, a query parameter that
does not validate), is OpenAI-shaped: never a 422 or `{"detail": ...}`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse as StarletteJSONResponse
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from gateway import admin, api_entitlements
from gateway.config import ConfigError, Worker
from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    error_body,
)
from gateway.guard import admin_refusal, api_key_refusal, bearer
from gateway.metrics import CONTENT_TYPE
from gateway.schemas import (
    AddWorker,
    ChatCompletionRequest,
    CompletionRequest,
    DrainResult,
    LivePlan,
    ModelCard,
    ModelList,
    PlanHistogram,
    ReloadResult,
    Status,
    WorkerInfo,
    WorkerList,
    proxy_responses,
)
from gateway.workers import FleetError, worker_dicts

if TYPE_CHECKING:
    from gateway.runtime import Gateway

log = logging.getLogger("fleetgate.gateway")

_GET = ["GET", "HEAD"]


class JSONResponse(StarletteJSONResponse):
    """orjson's JSON (a JSONResponse subclass, so that /openapi.json documents a route's
    response model as its body, not as a string)."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _error_response(exc: GatewayError) -> Response:
    return Response(
        exc.body(),
        status_code=exc.status,
        media_type="application/json",
        headers={k.decode(): v.decode() for k, v in exc.headers()},
    )


def _bearer(request: Request) -> str:
    return bearer(request.headers.get("authorization", ""))


def build_api(gateway: Gateway) -> FastAPI:
    config = gateway.config

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    api = FastAPI(
        title="fleetgate",
        version=gateway.version,
        summary="OpenAI-compatible gateway for vLLM and SGLang fleets",
        description=(
            "Estimates each request's token budget, compresses borderline prompts onto the "
            "short-context pool (Compress-and-Route), routes to the best worker and relays "
            "the answer. Every refusal is an OpenAI-shaped error."
        ),
        lifespan=lifespan,
        default_response_class=JSONResponse,
    )

    # --- refusals, all OpenAI-shaped -----------------------------------------------------
    @api.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> Response:
        return _error_response(exc)

    @api.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("query", "body", "path")]
        where = ".".join(loc) or None
        msg = first.get("msg", "invalid request")
        return _error_response(InvalidRequest(f"{where}: {msg}" if where else msg, param=where))

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            err: GatewayError = NotFound(f"no route for {request.method} {request.url.path}")
        elif exc.status_code == 405:
            err = MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}")
        else:
            err = GatewayError(str(exc.detail), code="http_error")
            err.status = exc.status_code
            err.type = "invalid_request_error" if exc.status_code < 500 else "internal_error"
        response = _error_response(err)
        if exc.headers:
            response.headers.update(exc.headers)
        if exc.status_code == 405:
            # Starlette names the first route of the path only; several routes may share
            # its template (GET and POST /admin/entitlements): Allow lists every method
            # they take. Only that template's: a worker id may hold "/", so DELETE
            # /admin/workers/{id} also matches .../{id}/drain, another resource
            matching = [
                route
                for route in request.app.router.routes
                if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE
            ]
            allowed = {
                m
                for route in matching
                if route.path_format == matching[0].path_format
                for m in route.methods or ()
            }
            if allowed:
                response.headers["allow"] = ", ".join(sorted(allowed))
        return response

    @api.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error serving %s %s", request.method, request.url.path)
        return Response(
            error_body("internal gateway error", "internal_error", "internal_error"),
            status_code=500,
            media_type="application/json",
        )

    # --- dependencies (gateway/guard.py checks the same before a body is read; again here
    # for an app served without that front) ----------------------------------------------
    def api_key(request: Request) -> None:
        err = api_key_refusal(gateway, _bearer(request))
        if err is not None:
            raise err

    def admin_key(request: Request) -> None:
        err = admin_refusal(config.auth.admin_key, _bearer(request))
        if err is not None:
            raise err

    # --- the proxy routes, documented (served by gateway/edge.py) ------------------------
    @api.post(
        "/v1/chat/completions",
        tags=["OpenAI"],
        summary="Chat completion (relayed to the placed pool's chosen worker)",
        responses=proxy_responses("chat.completion.chunk events, then `data: [DONE]`"),
        response_model=None,
    )
    async def chat_completions(body: ChatCompletionRequest) -> Response:  # pragma: no cover
        raise GatewayError("served by the fast path")

    @api.post(
        "/v1/completions",
        tags=["OpenAI"],
        summary="Text completion (relayed to the placed pool's chosen worker)",
        responses=proxy_responses("text_completion events, then `data: [DONE]`"),
        response_model=None,
    )
    async def completions(body: CompletionRequest) -> Response:  # pragma: no cover
        raise GatewayError("served by the fast path")

    # --- models and health ---------------------------------------------------------------
    @api.api_route(
        "/v1/models",
        methods=_GET,
        tags=["OpenAI"],
        response_model=ModelList,
        dependencies=[Depends(api_key)],
        responses={401: {"description": "missing or unknown API key"}},
    )
    async def models() -> Any:
        data = [
            ModelCard(id=m, created=gateway.started_at, max_model_len=length)
            for m, length in sorted(gateway.fleet.models.items())
        ]
        return ModelList(data=data).model_dump()

    @api.api_route(
        "/health",
        methods=_GET,
        tags=["health"],
        summary="vLLM's health route: 200 (empty) while a worker can take traffic, else 503",
        response_class=Response,
        responses={200: {"content": {}}, 503: {"content": {}}},
    )
    async def health() -> Response:
        return Response(status_code=200 if gateway.ready() else 503)

    @api.api_route(
        "/healthz",
        methods=_GET,
        tags=["health"],
        summary="the process is up",
        response_model=Status,
    )
    async def healthz() -> Any:
        return {"status": "ok"}

    @api.api_route(
        "/readyz",
        methods=_GET,
        tags=["health"],
        summary="200 when at least one worker can take traffic, else 503",
        response_model=Status,
        responses={503: {"model": Status}},
    )
    async def readyz() -> Any:
        if gateway.ready():
            return {"status": "ready"}
        return JSONResponse({"status": "no routable worker"}, status_code=503)

    @api.api_route(
        "/metrics",
        methods=_GET,
        tags=["health"],
        summary="Prometheus metrics (fleetgate_*)",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def metrics() -> Response:
        return Response(gateway.metrics.render(), media_type=CONTENT_TYPE)

    # --- admin ---------------------------------------------------------------------------
    admin_errors: dict[int | str, dict[str, Any]] = {
        400: {"description": "bad parameter, or nothing observed to plan on"},
        403: {"description": "admin routes disabled, or a wrong admin key"},
    }

    @api.get(
        "/admin/plan/histogram",
        tags=["admin"],
        summary="The observed L_total histogram (fleetgate.plan_histogram/v1)",
        dependencies=[Depends(admin_key)],
        responses={200: {"model": PlanHistogram}, **admin_errors},
    )
    async def plan_histogram() -> Any:
        # returned as built, documented by the model (no re-serialisation through it)
        return JSONResponse(gateway.traffic.document(_current()))

    def _current() -> dict[str, Any]:
        return admin.current(gateway.config, gateway.fleet.active_counts())

    @api.get(
        "/admin/plan",
        tags=["admin"],
        summary="FleetOpt's plan for the observed traffic beside the deployed fleet",
        dependencies=[Depends(admin_key)],
        responses={200: {"model": LivePlan}, **admin_errors},
    )
    async def plan(
        slo_ms: Annotated[
            float, Query(gt=0, allow_inf_nan=False, description="P99 TTFT target, ms")
        ] = 500.0,
        pc: Annotated[float, Query(ge=0, le=1, description="compressible fraction")] = 1.0,
        explain: Annotated[bool, Query(description="include the candidate grid")] = False,
        source: Annotated[
            Literal["observed", "promised", "demand"],
            Query(
                description="the arrival rate: observed traffic, or the token-pool "
                "entitlements' tokens/s (promised baselines, or those plus the observed "
                "demand above them) over the observed mean tokens per request"
            ),
        ] = "observed",
    ) -> Any:
        doc = gateway.traffic.document(_current())
        if doc["requests"] == 0:
            raise InvalidRequest("no traffic observed yet: nothing to plan on", code="no_traffic")
        basis = None
        if source != "observed":
            tenancy = gateway.tenancy
            if tenancy is None or tenancy.admitter is None:
                raise InvalidRequest(
                    "planning from entitlements needs admission.policy: token_pools",
                    param="source",
                )
            tenancy.snapshot()  # the in-memory ledger's demand as of now
            rate = admin.entitled_rate(
                tenancy.admitter.definitions.values(), tenancy.demands.values(), source
            )
            doc, basis = admin.entitled(doc, rate, source)
        result = await asyncio.to_thread(admin.run_planner, doc, slo_ms / 1000.0, pc, explain)
        if basis is not None:
            result["entitlements"] = basis
        return JSONResponse(result)

    # --- admin: the fleet, changed live (gateway/workers.py) --------------------------------
    def fleet_error(exc: FleetError) -> GatewayError:
        if exc.status == 404:
            return NotFound(str(exc), param=exc.param, code="worker_not_found")
        if exc.status == 409:
            return Conflict(str(exc), param=exc.param)
        return InvalidRequest(str(exc), param=exc.param)

    def now() -> float:
        return asyncio.get_running_loop().time()

    @api.get(
        "/admin/workers",
        tags=["admin"],
        summary="The fleet's workers: pool, id, URL, state (active or draining), health",
        dependencies=[Depends(admin_key)],
        response_model=WorkerList,
        responses={403: admin_errors[403]},
    )
    async def list_workers() -> Any:
        return {"object": "list", "data": worker_dicts(gateway.fleet.workers, now())}

    @api.post(
        "/admin/workers",
        tags=["admin"],
        summary="Add a worker to a pool; it takes traffic at once",
        dependencies=[Depends(admin_key)],
        status_code=201,
        response_model=WorkerInfo,
        responses={
            400: {"description": "bad worker configuration or an unknown pool"},
            403: admin_errors[403],
            409: {"description": "a worker of that id is in the fleet"},
        },
    )
    async def add_worker(body: AddWorker) -> Any:
        worker = Worker.model_validate(body.model_dump(exclude={"pool"}))
        try:
            state = gateway.fleet.add_worker(body.pool, worker)
        except FleetError as exc:
            raise fleet_error(exc) from None
        return worker_dicts({state.id: state}, now())[0]

    def drain(worker_id: str) -> Response:
        try:
            state = gateway.fleet.drain_worker(worker_id)
        except FleetError as exc:
            raise fleet_error(exc) from None
        gone = gateway.fleet.workers.get(state.id) is not state
        result = DrainResult(
            id=state.id,
            pool=state.pool,
            state="removed" if gone else "draining",
            in_flight=state.in_flight,
        )
        return JSONResponse(result.model_dump(), status_code=202)

    drain_doc: dict[int | str, dict[str, Any]] = {
        202: {"model": DrainResult},
        403: admin_errors[403],
        404: {"description": "no worker of that id"},
    }

    @api.post(
        "/admin/workers/{worker_id:path}/drain",
        tags=["admin"],
        summary="Stop routing to a worker; it leaves the fleet when its last request ends",
        dependencies=[Depends(admin_key)],
        status_code=202,
        response_model=DrainResult,
        responses=drain_doc,
    )
    async def drain_worker(worker_id: str) -> Response:
        return drain(worker_id)

    @api.delete(
        "/admin/workers/{worker_id:path}",
        tags=["admin"],
        summary="Remove a worker: drained first, so no request in flight is cut",
        dependencies=[Depends(admin_key)],
        status_code=202,
        response_model=DrainResult,
        responses=drain_doc,
    )
    async def remove_worker(worker_id: str) -> Response:
        return drain(worker_id)

    @api.post(
        "/admin/reload",
        tags=["admin"],
        summary="Re-read the configuration file and apply its fleet (pools, workers, models)",
        dependencies=[Depends(admin_key)],
        response_model=ReloadResult,
        responses={
            400: {
                "description": "the file is invalid (the message names the key path), or"
                " there is no file"
            },
            403: admin_errors[403],
            409: {"description": "a worker changed its URL, engine, key or pool under one id"},
        },
    )
    async def reload() -> Any:
        try:
            result = await gateway.reload("POST /admin/reload")
        except ConfigError as exc:
            raise InvalidRequest(str(exc), code="invalid_config") from None
        except FleetError as exc:
            raise fleet_error(exc) from None
        d = result.diff
        return ReloadResult(
            added=list(d.added),
            draining=list(d.draining),
            kept=list(d.kept),
            pools_added=list(d.pools_added),
            pools_removed=list(d.pools_removed),
            not_applied=result.not_applied,
        ).model_dump()

    api_entitlements.add_routes(api, gateway)
    _document_models(api, sorted(gateway.fleet.models))
    return api


def _document_models(api: FastAPI, models: list[str]) -> None:
    """/openapi.json names the models this gateway serves, so /docs' "Try it out" and
    schema-driven clients send requests that can succeed; and says what every operation
    answers (`_describe_answers`)."""
    build = api.openapi

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is not None:
            return api.openapi_schema
        with warnings.catch_warnings():
            # FastAPI warns that a GET+HEAD route's two operations share one id: they get
            # their own below
            warnings.filterwarnings("ignore", "Duplicate Operation ID", UserWarning)
            doc = build()
        schemas = doc["components"]["schemas"]
        for name in ("ChatCompletionRequest", "CompletionRequest"):
            model = schemas[name]["properties"]["model"]
            model["examples"] = models
            for example in schemas[name].get("examples", []):
                example["model"] = models[0]
        _describe_answers(doc)
        api.openapi_schema = doc
        return doc

    api.openapi = openapi  # type: ignore[method-assign]


_ERROR_REF = {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}


def _describe_answers(doc: dict[str, Any]) -> None:
    """Per operation: an operationId of its own, the same at every start (`get_v1_models`,
    `head_v1_models`; FastAPI's names a GET+HEAD route after whichever method its set
    yields first, so it changed between starts and the twins shared it); HEAD answers
    without a body; every refusal's body the OpenAI-shaped error; and a body's limits
    (408, 413: gateway/guard.py) wherever a body is taken."""
    for path, ops in doc["paths"].items():
        slug = re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_")
        for method, op in ops.items():
            op["operationId"] = f"{method}_{slug}"
            answers = op.setdefault("responses", {})
            if method == "head":
                for answer in answers.values():
                    answer.pop("content", None)
                continue
            if "requestBody" in op:
                answers.setdefault("408", {"description": "request body not received in time"})
                answers.setdefault("413", {"description": "request body too large"})
            for status, answer in answers.items():
                if status[0] in "45" and "content" not in answer:
                    answer["content"] = {"application/json": dict(_ERROR_REF)}
