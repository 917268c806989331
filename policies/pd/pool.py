"""A `pd` pool: prefill workers and decode workers, one request on a pair of them
("The Price of Anarchy in Disaggregated Inference"; docs/PD.md).

A request in a `pd` pool holds two leases (policies/leases.py `WorkerSlot`s), taken
together when the core picks its pair (policies/core.py `SendPair`):
- the prefill slot — its prompt (and the one token the prefill samples) on the prefill
  worker — given back at the hand-off (`HANDED_OFF`: the KV left the prefill worker), or
  when the attempt fails or the request ends before it;
- the decode slot — its prompt's KV and every token it may generate on the decode worker —
  given back when the answer ends (`Finished`), or when the attempt fails.

`protocol` is how the two engines are driven (docs/WIRE_SPEC.md §9): `vllm` sends the
prefill call first and the decode call after the hand-off, with the prefill's
`kv_transfer_params` (the core answers `HANDED_OFF` with `SendDecode`); `sglang` sends both
calls at once with the same bootstrap room (the hand-off only gives the prefill slot back).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from policies.hooks import PairHook
from policies.leases import PrefillWork, WorkerSlot
from policies.protocols.pairs import PairSelector
from policies.types import WorkerView

PROTOCOLS = ("vllm", "sglang")
ROLES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class PdPool:
    """A `pd` pool: its protocol and pair selector. Its workers' roles are the driver's
    (`WorkerView.role`), so workers may join and leave as in any pool."""

    name: str
    protocol: str  # "vllm": prefill, then decode; "sglang": both at once
    selector: PairSelector
    # hear this pool's pairs and hand-offs (policies/hooks.py; policies/build.py fills it)
    hooks: tuple[PairHook, ...] = ()

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: must be one of {', '.join(PROTOCOLS)}")

    @property
    def concurrent(self) -> bool:
        """Both calls go out at once (SGLang); else the decode call waits for the hand-off."""
        return self.protocol == "sglang"

    def split(self, views: Sequence[WorkerView]) -> tuple[list[WorkerView], list[WorkerView]]:
        """The pool's workers by role (a worker of no role is not routed to)."""
        prefill = [v for v in views if v.role == "prefill"]
        decode = [v for v in views if v.role == "decode"]
        return prefill, decode

    def routable(self, views: Sequence[WorkerView], tried: Collection[str]) -> bool:
        """A healthy worker of each role not tried yet: a pair may still be found."""
        ok = {v.role for v in views if v.healthy and v.id not in tried}
        return "prefill" in ok and "decode" in ok


@dataclass(slots=True, eq=False)
class PdLeg:
    """One attempt's pair: the two workers and the two leases (owned by the ticket's
    `Leases`, which releases them on every exit path; the hand-off gives the prefill's
    back earlier)."""

    prefill: str
    decode: str
    prefill_slot: WorkerSlot
    decode_slot: WorkerSlot
    prefill_work: PrefillWork | None  # its prompt in the prefill's backlog (when tracked)
    concurrent: bool
    handed_off: bool = False

    def hand_off(self) -> None:
        """The KV left the prefill worker: its slot (and backlog share) go back now."""
        self.handed_off = True
        self.release_prefill()

    def release_prefill(self) -> None:
        work = self.prefill_work
        if work is not None:
            self.prefill_work = None
            work.release()
        self.prefill_slot.release()

    def release(self) -> None:
        """The attempt is over (a retry moves the request): both workers go back."""
        self.release_prefill()
        self.decode_slot.release()
