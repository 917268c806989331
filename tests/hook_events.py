"""A hook (policies/hooks.py) that records what it hears, for tests of either driver."""

from __future__ import annotations

from policies.types import Outcome, RequestInfo


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []  # (request id, event)

    def on_arrival(self, request: RequestInfo, now: float) -> None:
        self.seen.append((request.id, "arrival"))

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        self.seen.append((request.id, "dispatch"))

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        self.seen.append((request.id, "first_token"))

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self.seen.append((request.id, f"complete:{outcome.status.value}"))

    def of(self, rid: str) -> list[str]:
        return [e for r, e in self.seen if r == rid]
