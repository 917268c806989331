"""The emulator's settings: which server it impersonates, its engine and its faults.

Defaults impersonate `vllm serve meta-llama/Llama-3.1-8B-Instruct` with vLLM's own
defaults (8192-token context, 256 sequences, 16-token blocks) on the FleetOpt engine
timing (W = 8 ms, H = 0.65 ms per sequence, 512-token prefill chunks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from emulator.dp_engine import DpConfig
from emulator.engine import EngineConfig
from emulator.kv_events import KvEventsConfig
from emulator.pd_config import PdConfig

VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
DEFAULT_MODEL_PATH = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass(frozen=True, slots=True)
class Faults:
    """Failure injection for tests of the gateway's failure handling."""

    error_rate: float = 0.0  # fraction of generation requests answered 500 before any work
    added_latency_ms: float = 0.0  # wall delay before a generation request reaches the engine
    die_mid_stream_after: int = 0  # cut every stream after this many SSE events (0: never)
    die_exits: bool = False  # … and make the process exit there, as a dying worker
    crash_after_requests: int = 0  # exit abruptly when generation request N+1 arrives (0: never)
    fail_health: bool = False  # /health answers 503 (SIGUSR1 toggles it at run time)


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    host: str = "127.0.0.1"  # loopback unless told otherwise
    port: int = 8000  # vLLM's default (SGLang's is 30000)
    personality: str = "vllm"  # "vllm" (0.33.0) or "sglang" (0.5.23)
    served_names: tuple[str, ...] = (DEFAULT_MODEL_PATH,)  # first one is the canonical name
    model_path: str = DEFAULT_MODEL_PATH  # `root` in /v1/models, model_path in SGLang info
    engine: EngineConfig = field(default_factory=EngineConfig)
    time_scale: float = 1.0  # wall seconds per engine second
    # wall seconds the driver may fall behind (a CPU-starved process) before the stall
    # becomes engine time; tests that compare engine times on a loaded machine raise it
    max_lag: float = 0.05
    seed: int = 0
    mean_output_tokens: float = 128.0
    api_key: str | None = None
    enable_request_id_headers: bool = False  # vLLM: echo X-Request-Id on responses
    prompt_tokens_details: bool = (
        False  # vLLM --enable-prompt-tokens-details / SGLang --enable-cache-report
    )
    enable_metrics: bool = True  # SGLang serves /metrics only with --enable-metrics
    faults: Faults = field(default_factory=Faults)
    dp: DpConfig = field(default_factory=DpConfig)  # --data-parallel-size and its step model
    # --data-parallel-rank-ports BASE: rank g also answers on BASE + g as that rank only
    # (vLLM's external load-balancing mode: one API server per rank, one lockstep group)
    dp_rank_ports: int | None = None
    pd: PdConfig | None = None  # one side of a P/D pair (--role; emulator/pd.py)
    kv_events: KvEventsConfig | None = None  # --kv-events-config (emulator/kv_events.py)

    @property
    def version(self) -> str:
        return VLLM_VERSION if self.personality == "vllm" else SGLANG_VERSION
