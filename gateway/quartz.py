"""QUARTZ in the gateway: the predictor built at start, what a request adds to it, and the
model file it may load (policies/quantile/; issue 15, the QUARTZ paper).

Built when the configuration has a `quartz:` section or names a routing or dispatch
policy that uses the predictor (`quartz`, `point_pred`, `locality`); otherwise nothing
here runs and the default path (least_loaded + fifo) does no predictor work at all.

- The model: `quartz.model: <path>` loads a trained tree model (a
  `fleetgate.quantile_trees/v1` JSON file, policies/quantile/trees.py — validated, never a
  pickle); without it the analytic model of the engine (W + H·n, chunked prefill) from
  `quartz.engine_w / engine_h / prefill_chunk` and the pool's max_num_seqs.
- Prefix locality: the gateway does not see the engine's token blocks, so it hashes the
  prompt itself — gateway/cache_routing.py's chained BLAKE2b hashes of
  `PREFIX_BLOCK_BYTES`-byte blocks of the serialised messages (or the completion prompt),
  one per ~128 tokens, the same in every replica — and its prefix index works on those
  blocks (stride 1, `block_tokens` = the block's bytes / 4 bytes per token). Costs
  ~0.5 µs per block, only when QUARTZ is configured.
- Per request: temperature / top_p and the prefix hashes go into the core's `Request`
  before it starts (every hook sees them); the request log gets the feature vector at dispatch, the predicted quantiles
  and the observed prefill time (dispatch → first token).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.cache_routing import PREFIX_BLOCK_BYTES as PREFIX_BLOCK_BYTES
from gateway.cache_routing import prompt_hashes as prompt_hashes
from gateway.config import GatewayConfig
from gateway.openai_request import ParsedRequest
from policies.events import Request
from policies.quantile.config import EngineShape, QuartzSettings, build_predictor
from policies.quantile.features import PrefillModel
from policies.quantile.predictor import Predictor
from policies.quantile.trees import loads as load_trees
from policies.routing import make_router
from policies.types import RequestInfo

_USES = ("quartz", "point_pred", "locality")


def wanted(config: GatewayConfig) -> bool:
    """Whether the configuration needs a predictor at all."""
    if config.quartz is not None:
        return True
    if config.dispatch.policy in ("quartz",):
        return True
    routings = [config.routing, *(p.routing for p in config.pools.values() if p.routing)]
    return any(
        hasattr(make_router(r.policy, r.params), "bind_predictor") for r in routings
    )  # a pool's own routing may use it


def load_model(path: str) -> PrefillModel:
    """A trained model file (policies/quantile/trees.py's `loads`, the format's validating
    loader). ValueError names the file and what is wrong with it."""
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"quartz.model: cannot read {path}: {exc.strerror}") from None
    try:
        model: PrefillModel = load_trees(text)
    except ValueError as exc:
        raise ValueError(f"quartz.model: {path}: {exc}") from None
    return model


def predictor_for(config: GatewayConfig) -> Predictor | None:
    if not wanted(config):
        return None
    q = config.quartz
    s = q.settings() if q is not None else QuartzSettings()
    # the gateway's blocks are PREFIX_BLOCK_BYTES of prompt, ~4 bytes a token; indexed all
    s = QuartzSettings(
        **{**_fields(s), "block_tokens": PREFIX_BLOCK_BYTES // 4, "index_stride": 1, "model": None}
    )
    seqs = [p.max_num_seqs for p in config.pools.values() if p.max_num_seqs is not None]
    shape = EngineShape(
        q.engine_w if q is not None else 0.008,
        q.engine_h if q is not None else 0.00065,
        q.prefill_chunk if q is not None else 512,
        min(seqs) if seqs else 256,
        q.prefill_token_s if q is not None else 0.0,
        q.max_num_batched_tokens if q is not None else None,
    )
    model = load_model(q.model) if q is not None and q.model else None
    return build_predictor(s, model, shape)


def _fields(s: QuartzSettings) -> dict[str, Any]:
    return {name: getattr(s, name) for name in s.__dataclass_fields__}


def describe(request: Request | RequestInfo, parsed: ParsedRequest) -> None:
    """What QUARTZ reads of the request beyond the budget: decoding parameters, prefix
    (set before the core starts the request, so every hook sees them)."""
    body = parsed.body
    t = body.get("temperature")
    if isinstance(t, int | float) and not isinstance(t, bool):
        request.temperature = float(t)
    p = body.get("top_p")
    if isinstance(p, int | float) and not isinstance(p, bool):
        request.top_p = float(p)
    if not request.prefix_hashes:  # the cache routers may have hashed it already
        request.prefix_hashes = prompt_hashes(parsed)


def rounded(values: Sequence[float] | None, digits: int = 6) -> list[float] | None:
    return None if values is None else [round(v, digits) for v in values]
