"""The admission extension point (step 5, policies/admission.py): may this request start
now, on its tenant's entitlement?

An `Admitter` answers with a `Reservation` (a lease: what the request holds against its
entitlement until it ends), None (admitted, holding nothing), or an `AdmissionRefused`
carrying how long to wait before a retry would likely be admitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from policies.registry import Registry
from policies.types import Outcome, RequestInfo


class Reservation(Protocol):
    def settle(self, outcome: Outcome, now: float) -> None:
        """The request ended with `outcome`: charge what it really used."""
        ...

    def release(self) -> None:
        """Give back what is still held; calling it again does nothing."""
        ...


@dataclass(frozen=True, slots=True)
class AdmissionRefused:
    """Not admitted now: `retry_after` seconds is when a retry would likely be."""

    reason: str
    retry_after: float
    code: str = "entitlement_exhausted"


class Admitter(Protocol):
    name: str

    # where its state is shared across replicas (the token-pool ledger in Redis), once
    # attached; None: this process's own, and `admit` answers synchronously
    @property
    def store(self) -> object | None: ...

    def admit(self, request: RequestInfo, now: float) -> Reservation | AdmissionRefused | None:
        """A reservation to hold, None (admitted, nothing held), or a refusal."""
        ...


ADMITTERS: Registry[Admitter] = Registry("admission policy")
