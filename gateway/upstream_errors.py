"""Every way an engine can fail the gateway, as one small typed tree.

    UpstreamError                  kind                 timeout  the worker's fault
    ├── ConnectFailed              connect                         yes
    ├── ConnectTimeout             connect_timeout      yes        yes
    ├── PoolTimeout                pool_timeout         yes        no: busy, not sick
    ├── ConnectionReset            reset                           yes
    ├── FirstByteTimeout           first_byte_timeout   yes        yes
    ├── IdleTimeout                idle_timeout         yes        yes
    ├── ProtocolViolation          protocol                        yes
    └── ResponseTooLarge           body_too_large                  no: one answer's size

`kind` is the label of `fleetgate_upstream_errors_total` and the request log's `error`.
`before_response`: nothing of the answer arrived, so the request may go to another worker
(`retryable` says when the gateway does). The pipeline maps timeouts to 504 and the rest to
502; only errors that are the worker's fault count against its circuit breaker.
"""

from __future__ import annotations

from typing import ClassVar


class UpstreamError(Exception):
    kind: ClassVar[str] = "upstream"
    is_timeout: ClassVar[bool] = False
    blames_worker: ClassVar[bool] = True

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response

    @property
    def retryable(self) -> bool:
        """The engine never saw the request: another worker may take it."""
        return False


class ConnectFailed(UpstreamError):
    kind = "connect"

    @property
    def retryable(self) -> bool:
        return True


class ConnectTimeout(UpstreamError):
    kind = "connect_timeout"
    is_timeout = True

    @property
    def retryable(self) -> bool:
        return True


class PoolTimeout(UpstreamError):
    kind = "pool_timeout"
    is_timeout = True
    blames_worker = False


class ConnectionReset(UpstreamError):
    kind = "reset"

    @property
    def retryable(self) -> bool:
        return self.before_response


class FirstByteTimeout(UpstreamError):
    kind = "first_byte_timeout"
    is_timeout = True


class IdleTimeout(UpstreamError):
    kind = "idle_timeout"
    is_timeout = True


class ProtocolViolation(UpstreamError):
    kind = "protocol"


class ResponseTooLarge(UpstreamError):
    kind = "body_too_large"
    blames_worker = False
