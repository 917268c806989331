"""/admin/entitlements: token-pool entitlements listed and changed at run time.

    GET    /admin/entitlements                 every entitlement (configured and created)
    GET    /admin/entitlements/{name}          one, with its live usage
    POST   /admin/entitlements                 create (201); 409 if it exists
    PATCH  /admin/entitlements/{name}          change some fields (state, baselines, SLO,
                                               keys); the pool cannot change
    POST   /admin/entitlements/{name}/expire   state → expired: its requests get 403

Behind their own key, `auth.entitlements_admin_key` (403 without it: closed by default).
A change applies at once on this replica and, with the Redis store, on every replica
(gateway/tenancy.py); API keys given here are kept only as HMACs and never shown again.
A key already naming another entitlement (configured or made here) is refused with 409
naming both entitlements, never the key: giving it would move that tenant's traffic.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from gateway.apikeys import stored_form
from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
)
from gateway.guard import bearer, entitlements_admin_refusal
from gateway.tenancy import EntitlementError

if TYPE_CHECKING:
    from gateway.runtime import Gateway

Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
ClassName = Literal["dedicated", "guaranteed", "elastic", "spot", "preemptible"]
StateName = Literal["pending", "bound", "degraded", "expired"]
ApiKey = Annotated[str, Field(min_length=8, max_length=256)]
PathName = Annotated[str, Path(max_length=64)]


class _Strict(BaseModel):
    # strict: JSON `true` is no number, "5" no integer (the schema says so)
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


class EntitlementCreate(_Strict):
    """A new entitlement: a tenant's share of a token pool (docs/TENANCY.md)."""

    name: Name
    pool: str = Field(min_length=1, description="a pool of admission.params.pools")
    service_class: ClassName = Field(
        "elastic", alias="class", description="who is protected under contention (Table 1)"
    )
    tokens_per_s: float = Field(0.0, ge=0, le=1e12, description="λ_e: baseline tokens/s")
    kv_bytes: int = Field(0, ge=0, le=2**52, description="χ_e: baseline KV-cache bytes")
    concurrency: int = Field(0, ge=0, le=2**31, description="r_e: baseline slots")
    slo_target_ms: float | None = Field(None, gt=0, le=1e9, description="ℓ*_e")
    tenant: str = Field("", max_length=256)
    state: Literal["pending", "bound", "degraded"] = "bound"
    window_s: float = Field(60.0, gt=0, le=1e7, description="budget depth: λ_e·window_s")
    keys: list[ApiKey] = Field(
        default_factory=list, max_length=64, description="API keys naming it (kept as HMACs)"
    )


class EntitlementUpdate(_Strict):
    """Fields to change; those left out keep their value. `keys` replaces the keys created
    through this API (configured keys stay)."""

    service_class: ClassName | None = Field(None, alias="class")
    tokens_per_s: float | None = Field(None, ge=0, le=1e12)
    kv_bytes: int | None = Field(None, ge=0, le=2**52)
    concurrency: int | None = Field(None, ge=0, le=2**31)
    slo_target_ms: float | None = Field(None, gt=0, le=1e9)
    tenant: str | None = Field(None, max_length=256)
    state: StateName | None = None
    window_s: float | None = Field(None, gt=0, le=1e7)
    keys: list[ApiKey] | None = Field(None, max_length=64)


class EntitlementUsage(BaseModel):
    in_flight: int
    kv_bytes: int
    debt: float = Field(description="d_e (Eq. 2)")
    burst: float = Field(description="b_e (Eq. 3)")
    priority: float = Field(description="w_e (Eq. 1)")
    admitted: int = Field(description="requests admitted, every replica")
    refused: dict[str, int] = Field(description="refusals by check, every replica")


class EntitlementInfo(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    pool: str
    service_class: ClassName = Field(alias="class")
    tokens_per_s: float
    kv_bytes: int
    concurrency: int
    slo_target_ms: float | None
    tenant: str
    state: StateName
    window_s: float
    keys: int = Field(description="how many API keys name it (never shown)")
    source: Literal["config", "admin"]
    usage: EntitlementUsage | None = Field(
        None, description="as of the last control step (memory store: now)"
    )


class EntitlementList(BaseModel):
    object: str = "list"
    data: list[EntitlementInfo]


def _mapped(exc: EntitlementError) -> GatewayError:
    msg = str(exc)
    if exc.status == 404:
        return NotFound(msg, param=exc.param, code="entitlement_not_found")
    if exc.status == 409:
        return Conflict(msg, param=exc.param)
    if exc.status == 503:
        return ServiceUnavailable(msg, code="store_unavailable", retry_after=1)
    return InvalidRequest(msg, param=exc.param)


def add_routes(api: FastAPI, gateway: Gateway) -> None:
    def admin_key(request: Request) -> None:
        # gateway/guard.py checks it before the body is read; again here for an app
        # served without that front
        given = bearer(request.headers.get("authorization", ""))
        err = entitlements_admin_refusal(gateway.config.auth.entitlements_admin_key, given)
        if err is not None:
            raise err

    def tenancy() -> Any:
        t = gateway.tenancy
        if t is None or not t.active:
            raise InvalidRequest(
                "entitlements need admission.policy: token_pools", code="no_token_pools"
            )
        return t

    # one change at a time on this replica: the check that a key is free and the change
    # that takes it are one step (a change awaits the store in between)
    changing = asyncio.Lock()

    def keys_free(name: str, keys: list[str] | None) -> None:
        secret = gateway.config.auth.key_secret
        if not keys or not secret:
            return  # no keys; or none can be kept (the tenancy refuses them with 400)
        try:
            hashes = [stored_form(secret, k) for k in keys]
        except ValueError as exc:  # a malformed `hmac-sha256:` form
            raise InvalidRequest(f"keys: {exc}", param="keys") from None
        owner = tenancy().keys.owner_elsewhere(name, hashes)
        if owner is not None:
            raise Conflict(
                f"a key given for entitlement {name!r} already names entitlement {owner!r}:"
                f" a key names one entitlement (take it from {owner!r} first)",
                param="keys",
            )

    deps = [Depends(admin_key)]
    errors: dict[int | str, dict[str, Any]] = {
        400: {"description": "invalid definition, an unknown pool, or no token pools"},
        403: {"description": "entitlement admin routes disabled, or a wrong key"},
    }
    not_found: dict[int | str, dict[str, Any]] = {404: {"description": "no such entitlement"}}
    # the body's schema in /openapi.json (the gateway's own JSONResponse is not FastAPI's,
    # which would document the answer as a string)
    ok: dict[str, Any] = {"model": EntitlementInfo}
    unavailable: dict[int | str, dict[str, Any]] = {
        503: {"description": "the entitlement store (Redis) is unreachable; nothing changed"}
    }

    def info(d: dict[str, Any]) -> Any:
        return EntitlementInfo.model_validate(d).model_dump(by_alias=True)

    @api.get(
        "/admin/entitlements",
        tags=["entitlements"],
        summary="Every token-pool entitlement, configured or created at run time",
        dependencies=deps,
        response_model=EntitlementList,
        response_model_by_alias=True,
        responses={200: {"model": EntitlementList}, **errors},
    )
    async def list_entitlements() -> Any:
        return {"object": "list", "data": [info(d) for d in tenancy().entitlements()]}

    @api.get(
        "/admin/entitlements/{name}",
        tags=["entitlements"],
        summary="One entitlement, with its live usage",
        dependencies=deps,
        response_model=EntitlementInfo,
        response_model_by_alias=True,
        responses={200: ok, **errors, **not_found},
    )
    async def get_entitlement(name: PathName) -> Any:
        try:
            return info(tenancy().describe(name))
        except EntitlementError as exc:
            raise _mapped(exc) from None

    @api.post(
        "/admin/entitlements",
        tags=["entitlements"],
        summary="Create an entitlement; it admits at once on every replica",
        dependencies=deps,
        status_code=201,
        response_model=EntitlementInfo,
        response_model_by_alias=True,
        responses={
            201: ok,
            **errors,
            409: {"description": "it exists, or a key given names another entitlement"},
            **unavailable,
        },
    )
    async def create_entitlement(body: EntitlementCreate) -> Any:
        spec = body.model_dump(by_alias=True, exclude={"keys"})
        async with changing:
            try:
                # a bad definition is a 400 before any key clash (the tenancy's own check)
                tenancy()._build(spec)
                keys_free(body.name, body.keys)
                return info(await tenancy().create(spec, list(body.keys)))
            except EntitlementError as exc:
                raise _mapped(exc) from None

    @api.patch(
        "/admin/entitlements/{name}",
        tags=["entitlements"],
        summary="Change an entitlement (state, class, baselines, SLO, keys)",
        dependencies=deps,
        response_model=EntitlementInfo,
        response_model_by_alias=True,
        responses={
            200: ok,
            **errors,
            **not_found,
            409: {"description": "a key given names another entitlement"},
            **unavailable,
        },
    )
    async def update_entitlement(name: PathName, body: EntitlementUpdate) -> Any:
        given = body.model_dump(by_alias=True, exclude_unset=True, exclude={"keys"})
        # null means "unchanged", except for the SLO target, where it means "none"
        changes = {k: v for k, v in given.items() if v is not None or k == "slo_target_ms"}
        keys = None if body.keys is None else list(body.keys)
        async with changing:
            try:
                tenancy().describe(name)  # 404 before any key clash
                keys_free(name, keys)
                return info(await tenancy().update(name, changes, keys))
            except EntitlementError as exc:
                raise _mapped(exc) from None

    @api.post(
        "/admin/entitlements/{name}/expire",
        tags=["entitlements"],
        summary="End an entitlement: its requests are refused with 403 entitlement_inactive",
        dependencies=deps,
        response_model=EntitlementInfo,
        response_model_by_alias=True,
        responses={200: ok, **errors, **not_found, **unavailable},
    )
    async def expire_entitlement(name: PathName) -> Any:
        async with changing:
            try:
                return info(await tenancy().expire(name))
            except EntitlementError as exc:
                raise _mapped(exc) from None
