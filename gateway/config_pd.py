"""A `kind: pd` pool's own settings (docs/PD.md): which engine protocol drives its pairs
and which pair selector picks them. The workers carry their role (`role: prefill |
decode`) in the pool's `workers` list (gateway/config.py `Worker`).

    pools:
      main:
        kind: pd
        max_model_len: 8192
        models: [llama-8b]
        pd: {protocol: vllm, pair: {policy: kv_cost_decode_load}}
        workers:
          - {url: http://p0:8000, role: prefill}
          - {url: http://d0:8000, role: decode}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.pd import DEFAULT_SELECTOR, make_pair_selector


class PairChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field(
        DEFAULT_SELECTOR,
        description="The pair selector (policies/pd/): kv_cost_decode_load (prefill by"
        " Dynamo's KV cost, decode by its active decode load), kv_cost_decode (decode by"
        " Dynamo's KV cost at (τ, ω)), regime_adaptive (kv_cost_decode with the paper's"
        " Table 2 by the pool's saturation regime), round_robin, random.",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="The selector's own.")

    @model_validator(mode="after")
    def _known(self) -> PairChoice:
        make_pair_selector(self.policy, self.params)  # unknown names / params fail at start
        return self


class PdSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: Literal["vllm", "sglang"] = Field(
        description="How the pair's engines are driven (docs/WIRE_SPEC.md §9): vllm (a"
        " prefill call, then the decode call with its kv_transfer_params), sglang (both"
        " calls at once with a bootstrap room)."
    )
    pair: PairChoice = Field(default_factory=PairChoice)
