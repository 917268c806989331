"""Per-cell pool moments as arrays: what Algorithm 1's vectorised sweep reads.

One `MomentGrid` holds, for every (B, γ) cell (or every B), one pool's n_max, E[S], E[S²],
TTFT floor, E[k] and E[kσ] (service.py). Two request populations sharing a pool — the
short pool plus compressed requests at L = B (Eq. 15), the long tail plus the band the
compressor could not shrink — combine by mixing raw moments with their traffic weights,
so re-weighting for a new p_c is array arithmetic, not a recalibration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from policies.planner.service import PoolMoments

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class MomentGrid:
    """Per-cell pool moments as arrays (any shape): what the sweep's arithmetic reads."""

    present: BoolArray  # the pool has requests in this cell
    slots: IntArray  # n_max
    m1: FloatArray  # E[S]
    m2: FloatArray  # E[S²]
    floor: FloatArray  # TTFT floor
    k: FloatArray  # E[k]
    ks: FloatArray  # E[kσ]

    @staticmethod
    def of(ms: list[PoolMoments | None], fill: PoolMoments, shape: tuple[int, ...]) -> MomentGrid:
        full = [m or fill for m in ms]

        def arr(values: list[float]) -> FloatArray:
            return np.array(values, dtype=np.float64).reshape(shape)

        return MomentGrid(
            present=np.array([m is not None for m in ms]).reshape(shape),
            slots=np.array([m.n_slots for m in full], dtype=np.int64).reshape(shape),
            m1=arr([m.mean_s for m in full]),
            m2=arr([m.mean_s2 for m in full]),
            floor=arr([m.ttft_floor_s for m in full]),
            k=arr([m.mean_k for m in full]),
            ks=arr([m.mean_k_sigma for m in full]),
        )

    def mix(self, other: MomentGrid, w_self: FloatArray, w_other: FloatArray) -> MomentGrid:
        """The mixture of two request populations (raw moments mix linearly); the floor
        stays self's where self is present (its P99 dominates), else other's."""
        tot = w_self + w_other
        safe = np.where(tot > 0, tot, 1.0)

        def m(a: FloatArray, b: FloatArray) -> FloatArray:
            out: FloatArray = np.where(tot > 0, (w_self * a + w_other * b) / safe, a)
            return out

        return MomentGrid(
            present=self.present | other.present,
            slots=self.slots,
            m1=m(self.m1, other.m1),
            m2=m(self.m2, other.m2),
            floor=np.where(self.present, self.floor, other.floor),
            k=m(self.k, other.k),
            ks=m(self.ks, other.ks),
        )

    def where(self, cond: BoolArray, other: MomentGrid) -> MomentGrid:
        """Self where cond, else other."""
        return MomentGrid(
            present=np.where(cond, self.present, other.present),
            slots=np.where(cond, self.slots, other.slots),
            m1=np.where(cond, self.m1, other.m1),
            m2=np.where(cond, self.m2, other.m2),
            floor=np.where(cond, self.floor, other.floor),
            k=np.where(cond, self.k, other.k),
            ks=np.where(cond, self.ks, other.ks),
        )

    def broadcast(self, shape: tuple[int, ...]) -> MomentGrid:
        def b(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return np.broadcast_to(a[:, None], shape) if a.ndim == 1 else a

        return MomentGrid(
            b(self.present), b(self.slots), b(self.m1), b(self.m2), b(self.floor), b(self.k),
            b(self.ks),
        )  # fmt: skip
