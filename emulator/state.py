"""One emulated server's live state: settings, wire shapes, engine driver, metrics, faults."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from aiohttp import web

from emulator.config import EmulatorConfig
from emulator.driver import Driver
from emulator.metrics_sglang import SglangMetrics
from emulator.metrics_vllm import VllmMetrics
from emulator.requests import ModelInfo
from emulator.sampling import OutputModel
from emulator.wire import Wire
from emulator.wire_sglang import SglangWire
from emulator.wire_vllm import VllmWire


def wire_for(personality: str, fingerprint: str = "") -> Wire:
    """The response shapes of `personality` (emulator/wire_vllm.py, emulator/wire_sglang.py)."""
    if personality == "vllm":
        return VllmWire(fingerprint)
    if personality == "sglang":
        return SglangWire()
    raise ValueError(f"unknown personality {personality!r} (vllm, sglang)")


def fingerprint(cfg: EmulatorConfig) -> str:
    """vLLM 0.33's `vllm-<version>-<hash8>` (fingerprint mode "hash") of this configuration."""
    key = f"{cfg.model_path}|{cfg.engine.max_model_len}|{cfg.engine.num_kv_blocks}|{cfg.engine.max_num_seqs}"
    return f"vllm-{cfg.version}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


@dataclass(eq=False)
class Emulator:
    cfg: EmulatorConfig
    info: ModelInfo
    wire: Wire
    metrics: VllmMetrics | SglangMetrics
    driver: Driver
    fail_health: bool = False
    requests_seen: int = 0
    rng: random.Random = field(default_factory=random.Random)

    @property
    def vllm(self) -> bool:
        return self.cfg.personality == "vllm"


def build_state(cfg: EmulatorConfig) -> Emulator:
    """Must run inside the event loop that will serve (the driver owns asyncio objects)."""
    name = cfg.served_names[0]
    metrics: VllmMetrics | SglangMetrics
    if cfg.personality == "vllm":
        metrics = VllmMetrics(name, cfg.engine)
    else:
        metrics = SglangMetrics(name, cfg.engine)
    info = ModelInfo(
        personality=cfg.personality,
        served_names=cfg.served_names,
        root=cfg.model_path,
        max_model_len=cfg.engine.max_model_len,
        block_size=cfg.engine.block_size,
        output=OutputModel(cfg.mean_output_tokens, cfg.seed),
    )
    return Emulator(
        cfg=cfg,
        info=info,
        wire=wire_for(cfg.personality, fingerprint(cfg)),
        metrics=metrics,
        driver=Driver(cfg.engine, cfg.time_scale, metrics, cfg.max_lag, cfg.dp),
        fail_health=cfg.faults.fail_health,
        rng=random.Random(cfg.seed),
    )


EMU: web.AppKey[Emulator] = web.AppKey("emulator", Emulator)
# the rank an app answers as (--data-parallel-rank-ports: a per-rank API server); absent on
# the group's own port
PINNED_RANK: web.AppKey[int] = web.AppKey("pinned_rank", int)
