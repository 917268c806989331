"""Every refusal the gateway makes, as one small tree mapped to OpenAI-shaped answers.

    GatewayError                        status  type / code
    ├── InvalidRequest                  400     invalid_request_error / invalid_request
    ├── AuthenticationFailed            401     authentication_error / invalid_api_key
    ├── PermissionDenied                403     permission_error / entitlement_inactive
    ├── NotFound                        404     not_found_error / not_found
    ├── ModelNotFound                   404     not_found_error / model_not_found
    ├── MethodNotAllowed                405     invalid_request_error / method_not_allowed
    ├── RequestTimeout                  408     invalid_request_error / request_timeout
    ├── ContextLengthExceeded           400     invalid_request_error / context_length_exceeded
    ├── PayloadTooLarge                 413     invalid_request_error / body_too_large
    ├── UnsupportedMediaType            415     invalid_request_error / unsupported_content_encoding
    ├── RateLimited                     429     rate_limit_error / <the refusing check>
    ├── BadGateway                      502     upstream_error / bad_gateway
    ├── ServiceUnavailable              503     service_unavailable / no_healthy_worker | queue_timeout
    └── UpstreamTimeout                 504     timeout / upstream_timeout

The body is what the official openai SDK parses:
{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}. An engine's own 4xx
is never turned into one of these: it is passed through byte for byte.
"""

from __future__ import annotations

import math

import orjson


class GatewayError(Exception):
    status = 500
    type = "internal_error"
    code = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = retry_after

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after is None:
            return []
        return [(b"retry-after", b"%d" % max(1, math.ceil(self.retry_after)))]


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "entitlement_inactive"


class ModelNotFound(GatewayError):
    status = 404
    type = "not_found_error"
    code = "model_not_found"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "body_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class ContextLengthExceeded(GatewayError):
    """Too long for every pool serving the model: 400, as OpenAI, vLLM and SGLang answer
    (the SDK raises BadRequestError; LiteLLM's context-window fallbacks key on the code).
    413 stays for a body over limits.max_body_bytes."""

    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limited"


class BadGateway(GatewayError):
    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "no_healthy_worker"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "timeout"
    code = "upstream_timeout"


def error_body(message: str, type_: str, code: str | int | None, param: str | None = None) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def sse_error_frame(error: GatewayError) -> bytes:
    """The frame that ends a stream the gateway cannot finish, followed by [DONE]."""
    return b"data: " + error.body() + b"\n\ndata: [DONE]\n\n"
