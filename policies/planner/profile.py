"""Hardware/model profiles as data: what one "GPU" of a pool can hold and how fast it steps.

FleetOpt §2.2, §3.1 and §7.1. A profile carries the constants of the iteration model

    t_iter = W + H_eff · n_active                                   (Eq. 3)

and the slot rule that turns a pool's context window into its concurrency n_max:

    n_max(C) = min(⌊max_slots · C_calib / C⌋, ⌊kv_blocks / ⌈C / block⌉⌋)

(the compute cap and the KV-memory cap; both are equal at C = C_calib by construction of
the constants). For the built-in A100-80GB / Llama-3-70B profile this gives the paper's
n_max = 16 @ 64K, 128 @ 8K, 256 @ 4K, 682 @ 1.5K.

The slot counts behave like one 8×A100 tensor-parallel replica while cost is charged per
"GPU" (simulator/data/README.md, "Caveats"): the constants are used as given, because that
is what reproduces the paper's tables. The planner therefore counts *replicas*, prices each
at `cost_per_hr` (the paper's per-GPU price) and says so; `gpus_per_replica` (8 for the
built-in profiles) is what a deployment needs per replica, for display only.

Profiles are plain frozen dataclasses; `profile_from_dict` builds one from the plain data
of a `fleetgate.gpu_profile/v1` JSON file (the CLI reads the file, this module never does).
Failure posture: invalid constants raise ValueError at construction, never at plan time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HOURS_PER_YEAR = 8760.0  # the paper annualises at 8,760 h (Table 3 caption)


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One GPU type serving one model. Units: seconds, tokens, bytes, USD."""

    name: str
    w_s: float = 0.008  # W: base iteration latency, 8 ms for Llama-3-70B on A100 (§3.1)
    h_s: float = 0.00065  # H: per-slot cost, 0.65 ms/slot at calib_ctx tokens (§3.1)
    calib_ctx: int = 8192  # context at which H and max_slots were measured (reference sim)
    chunk: int = 512  # chunked-prefill tokens per iteration (§3.1, C_chunk)
    block_tokens: int = 16  # PagedAttention block size (reference sim)
    kv_blocks: int = 65536  # KV blocks per "GPU" (reference sim; gives 16 slots @ 64K)
    max_slots: int = 128  # concurrency at calib_ctx (§7.1: n_max = 128 at 8K)
    cost_per_hr: float = 2.21  # on-demand $/GPU-hr (§7.1)
    kv_bytes_per_token: int = 327_680  # 320 KiB: 2 × 80 layers × 8 KV heads × 128 × 2 B (§2.2)
    # GPUs one replica of these constants occupies (an 8-GPU tensor-parallel replica: its KV
    # budget, 320 GiB, is no single 80 GB GPU's); the plan's counts are replicas
    gpus_per_replica: int = 8

    def __post_init__(self) -> None:
        if self.w_s < 0 or self.h_s < 0:
            raise ValueError(f"profile {self.name}: W and H must be ≥ 0")
        for field_name in (
            "calib_ctx",
            "chunk",
            "block_tokens",
            "kv_blocks",
            "max_slots",
            "gpus_per_replica",
        ):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"profile {self.name}: {field_name} must be > 0")
        if self.cost_per_hr <= 0:
            raise ValueError(f"profile {self.name}: cost_per_hr must be > 0")

    def n_slots(self, max_ctx: int) -> int:
        """n_max for a pool whose context window is `max_ctx` tokens (0 if none fit)."""
        if max_ctx <= 0:
            raise ValueError(f"max_ctx must be > 0, got {max_ctx}")
        compute_cap = self.max_slots * self.calib_ctx // max_ctx
        kv_cap = self.kv_blocks // math.ceil(max_ctx / self.block_tokens)
        return min(compute_cap, kv_cap)

    def kv_bytes_per_slot(self, max_ctx: int) -> int:
        """KV memory one slot reserves: the cost cliff's numerator (Table 1)."""
        return max_ctx * self.kv_bytes_per_token

    def annual_cost(self, n_gpus: int) -> float:
        """USD per year for `n_gpus` units of this type, at `cost_per_hr` each (the paper's
        "GPUs": replicas of these constants, priced per GPU)."""
        return n_gpus * self.cost_per_hr * HOURS_PER_YEAR


# The paper's profile (§7.1, Table 1), the default of every planner entry point.
A100_LLAMA3_70B = HardwareProfile(name="a100_80gb_llama3_70b")

# Same source as the A100 profile (the reference simulator's catalogue); not used by the paper.
H100_LLAMA3_70B = HardwareProfile(
    name="h100_80gb_llama3_70b",
    w_s=0.004,
    h_s=0.00032,
    chunk=1024,
    max_slots=256,
    cost_per_hr=4.02,
)
A10G_LLAMA3_70B = HardwareProfile(
    name="a10g_llama3_70b",
    w_s=0.012,
    h_s=0.0009,
    chunk=256,
    kv_blocks=32768,
    max_slots=64,
    cost_per_hr=1.01,
)

BUILTIN_PROFILES: dict[str, HardwareProfile] = {
    p.name: p for p in (A100_LLAMA3_70B, H100_LLAMA3_70B, A10G_LLAMA3_70B)
}


def profile_from_dict(data: Mapping[str, Any], name: str | None = None) -> HardwareProfile:
    """A profile from plain data: either a flat mapping of the dataclass's field names, or
    a `fleetgate.gpu_profile/v1` document (its `simulator_profile` block is read).
    Unknown flat keys are rejected so that a typo cannot silently keep a default."""
    if "simulator_profile" in data:
        sim = data["simulator_profile"]
        paper = data.get("paper_constants", {})
        return HardwareProfile(
            name=str(name or data.get("name", "profile")),
            w_s=float(sim["W_s"]),
            h_s=float(sim["H_s_per_seq_at_calibration_ctx"]),
            calib_ctx=int(sim["calibration_ctx_tokens"]),
            chunk=int(sim["chunk_tokens"]),
            block_tokens=int(sim["kv_block_size_tokens"]),
            kv_blocks=int(sim["total_kv_blocks"]),
            max_slots=int(sim["max_slots_at_calibration_ctx"]),
            cost_per_hr=float(sim["cost_usd_per_gpu_hr"]),
            kv_bytes_per_token=int(paper.get("kv_bytes_per_token", 327_680)),
        )
    known = set(HardwareProfile.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown profile keys: {sorted(unknown)}")
    fields = dict(data)
    fields.setdefault("name", name or "profile")
    return HardwareProfile(**fields)
