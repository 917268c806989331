"""A `dp_group` pool's own settings — the gateway's `pools.<name>.dp_group` and the
simulator's `fleet.pools[].dp_group`, one model for both: G data-parallel ranks of one
engine, B slots each, and the assignment policy that chooses each request's rank
(policies/dp_group.py, policies/assign/; docs/BFIO.md).

The pool's workers address the ranks: one worker per rank (vLLM's external load
balancing: one URL per rank, in rank order), or one worker for the whole group (vLLM's
internal load balancing, sent `X-data-parallel-rank`; SGLang, sent the same header and
the body field `routed_dp_rank`). docs/WIRE_SPEC.md §10 has the engines' names and
versions.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.dp_group import DpGroupSpec


class Assigner(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = Field(
        "fcfs_maxfree",
        description="A registered assignment policy: fcfs_maxfree, jsq_count,"
        " least_token_load, bfio (policies/assign/).",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="The policy's own parameters (bfio: lookahead_steps, solver,"
        " predictor, candidate_window, max_pool_wait_s, …).",
    )

    @model_validator(mode="after")
    def _builds(self) -> Assigner:
        from policies.assign import ASSIGNERS
        from policies.registry import ParamError

        if self.policy not in ASSIGNERS.names():
            known = ", ".join(ASSIGNERS.names())
            raise ValueError(f"policy: unknown {self.policy!r}; known: {known}")
        try:
            ASSIGNERS.make(self.policy, self.params)
        except ParamError as exc:
            raise ValueError(f"params.{exc.path}: {exc.detail}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"params: {exc}") from None
        return self


class DpGroup(BaseModel):
    """The ranks, their slots and the assignment policy of a `kind: dp_group` pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: int = Field(ge=1, le=1024, description="G: the group's data-parallel ranks.")
    slots: int = Field(
        ge=1, description="B: requests one rank runs at once (the engine's max_num_seqs)."
    )
    assigner: Assigner = Field(default_factory=lambda: Assigner())
    timeout_s: float = Field(
        30.0, gt=0, description="Longest a request waits in the holding pool (then 503)."
    )
    max_pooled: int = Field(
        4096, ge=1, description="Requests the holding pool keeps; beyond it a 429."
    )

    def spec(self) -> DpGroupSpec:
        return DpGroupSpec(
            self.ranks,
            self.slots,
            self.assigner.policy,
            dict(self.assigner.params),
            self.timeout_s,
            self.max_pooled,
        )
