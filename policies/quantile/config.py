"""QUARTZ's predictor settings (`quartz:` in the gateway's configuration, `policy.quartz`
in a simulator scenario), and the predictor they build.

    model: null              # a trained model file (gateway: loaded by trees.py); null:
                             # the analytic model from the engine's parameters
    alpha: 0.95              # the quantile routed and ordered by (Table 3)
    delta: 0.05              # δ: fall back when under-coverage exceeds it (Table 3)
    calibration: true        # online residual correction (false: the ablation)
    window: 256              # residuals kept per regime
    min_samples: 32
    locality: true           # the prefix-locality feature (false: the ablation)
    block_tokens: 16         # the prefix index (prefix_index.py)
    index_ttl_s: 300
    index_max_entries: 200000
    high_fraction: 0.5
    index_stride: 8          # index every 8th block (locality known to 128 tokens)
    mean_output_tokens: 256  # the analytic model (analytic.py)
    spread90: 1.3
    spread95: 1.5

The engine's W, H, chunk and max_num_seqs come from the fleet's engine configuration.
Unknown keys are refused, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.quantile.analytic import AnalyticModel
from policies.quantile.calibration import Calibration
from policies.quantile.features import PrefillModel
from policies.quantile.predictor import Predictor
from policies.quantile.prefix_index import PrefixIndex


@dataclass(frozen=True, slots=True)
class QuartzSettings:
    model: str | None = None
    alpha: float = 0.95
    delta: float = 0.05
    calibration: bool = True
    window: int = 256
    min_samples: int = 32
    locality: bool = True
    block_tokens: int = 16
    index_ttl_s: float = 300.0
    index_max_entries: int = 200_000
    high_fraction: float = 0.5
    index_stride: int = 8
    mean_output_tokens: float = 256.0
    spread90: float = 1.3
    spread95: float = 1.5

    def __post_init__(self) -> None:
        if self.alpha not in (0.9, 0.95):
            raise ValueError("alpha: must be 0.9 or 0.95")
        # the parts validate the rest as they are built
        build_predictor(self, None)


@dataclass(frozen=True, slots=True)
class EngineShape:
    """The engine parameters the analytic model reads (emulator EngineConfig's)."""

    w: float = 0.008
    h: float = 0.00065
    prefill_chunk: int = 512
    max_num_seqs: int = 256


def analytic_model(s: QuartzSettings, engine: EngineShape) -> AnalyticModel:
    return AnalyticModel(
        engine.w,
        engine.h,
        engine.prefill_chunk,
        engine.max_num_seqs,
        s.mean_output_tokens,
        s.spread90,
        s.spread95,
    )


def build_predictor(
    s: QuartzSettings, model: PrefillModel | None, engine: EngineShape | None = None
) -> Predictor:
    """The predictor: `model`, or the analytic one from `engine` when None."""
    return Predictor(
        model if model is not None else analytic_model(s, engine or EngineShape()),
        Calibration(
            alpha=s.alpha,
            delta=s.delta,
            window=s.window,
            min_samples=s.min_samples,
            enabled=s.calibration,
        ),
        PrefixIndex(
            s.block_tokens, s.index_ttl_s, s.index_max_entries, s.high_fraction, s.index_stride
        ),
        alpha=s.alpha,
        use_locality=s.locality,
    )
