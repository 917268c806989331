"""Leases: what a request holds, given back exactly once on every exit path.

A lease takes its hold in its constructor and gives it back in `release()`, which is
idempotent, so the driver never counts by hand: an answer, an engine error, a client
that left (a cancelled task), a retry on another worker, a timeout — each path ends in
one `release()`, and a second one changes nothing. Leases are context managers; `Leases`
holds several for one request (later: a worker slot and a token reservation, or two
workers for a prefill/decode pair) and releases them in reverse order.

The model is SGLang's gateway `WorkerLoadGuard` (load taken in a constructor, given back
when the response is dropped) and llm-d's reserve → settle / release bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Protocol, Self, TypeVar


class Lease(Protocol):
    def release(self) -> None:
        """Give the hold back; calling it again does nothing."""
        ...


class Load(Protocol):
    """What a worker slot counts on: the gateway's own view of one worker's load."""

    pool: str
    in_flight: int
    outstanding_tokens: int


class Releasing:
    """`with lease:` releases it when the block ends, however it ends."""

    __slots__ = ()

    def release(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class WorkerSlot(Releasing):
    """One request on one worker: a slot in its in-flight count and its tokens (L_total)
    in its outstanding work, from dispatch until the answer ends. `on_release(load)` runs
    once the slot is given back (the driver wakes a request waiting for room)."""

    __slots__ = ("load", "on_release", "released", "tokens")

    def __init__(
        self, load: Load, tokens: int, on_release: Callable[[Load], object] | None = None
    ) -> None:
        self.load = load
        self.tokens = tokens
        self.on_release = on_release
        self.released = False
        load.in_flight += 1
        load.outstanding_tokens += tokens

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.load.in_flight -= 1
            self.load.outstanding_tokens -= self.tokens
            if self.on_release is not None:
                self.on_release(self.load)


class PrefillLoad(Protocol):
    """What prefill work counts on: the prompt tokens a worker was sent that have not
    had their first token yet (its prefill backlog)."""

    pool: str
    prefill_tokens: int


class PrefillWork(Releasing):
    """One request's prompt in its worker's prefill backlog, from dispatch until its
    first token (or until the attempt ends without one). `on_release(load)` runs once
    it is given back: with a prefill room configured, a request waiting for room may go."""

    __slots__ = ("load", "on_release", "released", "tokens")

    def __init__(
        self, load: PrefillLoad, tokens: int, on_release: Callable[[PrefillLoad], object] | None
    ) -> None:
        self.load = load
        self.tokens = tokens
        self.on_release = on_release
        self.released = False
        load.prefill_tokens += tokens

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.load.prefill_tokens -= self.tokens
            if self.on_release is not None:
                self.on_release(self.load)


L = TypeVar("L", bound=Lease)


class Leases(Releasing):
    """All of one request's leases, released together (last taken, first released)."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[Lease] = []

    def take(self, lease: L) -> L:
        self._held.append(lease)
        return lease

    def release(self) -> None:
        held, self._held = self._held, []
        for lease in reversed(held):
            lease.release()

    def __len__(self) -> int:
        return len(self._held)
