"""The emulator's P/D role (`--role prefill|decode`, emulator/pd.py): its settings and its
command-line flags, kept apart from the main CLI so that a flag added here touches one
hook there (`add_arguments`, `from_args`).

Times are engine seconds (the wall waits them × `--time-scale`), as every engine time.
"""

from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass, field

ROLES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class PdConfig:
    role: str  # "prefill" | "decode"
    # KV transfer time per block of `block_size` tokens, engine seconds: a 16-token block
    # of a 70B FP8 model is ~2.6 MB (80 layers × K,V × 8 KV heads × 128 × 1 byte × 16), so
    # 50 GB/s of RDMA move one in ~50 µs; 0.2 ms leaves room for the handshake's share
    transfer_s_per_block: float = 0.0002
    # vLLM: how long a prefill keeps a request's KV for its decode
    # (VLLM_NIXL_ABORT_REQUEST_TIMEOUT); SGLang: how long a prefill's room waits for its
    # decode (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)
    kv_lease_s: float = 480.0
    # SGLang: how long a decode waits for its room's KV (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)
    waiting_timeout_s: float = 300.0
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))  # vLLM's engine_id

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"--role must be one of {', '.join(ROLES)}")
        if self.transfer_s_per_block < 0:
            raise ValueError("--pd-transfer-s-per-block must be >= 0")
        if self.kv_lease_s <= 0 or self.waiting_timeout_s <= 0:
            raise ValueError("--pd-kv-lease-s and --pd-waiting-timeout-s must be > 0")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("disaggregated prefill/decode (docs/WIRE_SPEC.md §9)")
    g.add_argument("--role", "--disaggregation-mode", dest="pd_role", choices=ROLES,
                   default=None, help="serve one side of a P/D pair (default: neither)")  # fmt: skip
    d = PdConfig("prefill")
    g.add_argument("--pd-transfer-s-per-block", type=float, default=d.transfer_s_per_block,
                   help="KV transfer time per block, engine seconds")  # fmt: skip
    g.add_argument("--pd-kv-lease-s", type=float, default=d.kv_lease_s,
                   help="how long a prefill keeps KV for its decode, engine seconds")  # fmt: skip
    g.add_argument("--pd-waiting-timeout-s", type=float, default=d.waiting_timeout_s,
                   help="SGLang decode: how long it waits for its room's KV")  # fmt: skip


def from_args(args: argparse.Namespace) -> PdConfig | None:
    if args.pd_role is None:
        return None
    return PdConfig(
        args.pd_role,
        transfer_s_per_block=args.pd_transfer_s_per_block,
        kv_lease_s=args.pd_kv_lease_s,
        waiting_timeout_s=args.pd_waiting_timeout_s,
    )
