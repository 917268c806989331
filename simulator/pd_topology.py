"""A `kind: pd` pool in the simulator (docs/PD.md): prefill workers and decode workers,
each an `emulator.engine.Engine` on the kernel's clock (simulator/cluster.py), and the KV
transfer between them — the same topology the emulator's `--role` servers make live.

    fleet:
      pools:
        - name: short
          workers: 3                       # = prefill + decode
          kind: pd
          pd: {protocol: vllm, prefill: 1, decode: 2, transfer_s_per_block: 0.0002,
               prefill_engine: {prefill_token_s: 0.00017}, decode_engine: {h: 0.00005}}

A request on a pair (simulator/driver.py carries the core's actions out):
- its prefill is an engine request of one output token on the prefill worker (its prompt
  computed there, cached by prefix as any prompt; `prefill_engine` overrides the pool's
  engine settings for prefill workers: e.g. compute-bound prefill);
- when it ends, the core hears `HANDED_OFF` (the prefill slot goes back) and the decode
  request is submitted to the decode worker `transfer_s_per_block × ⌈P / block size⌉`
  later, its prompt counted as computed (`EngineRequest.remote_tokens`: the emulator's
  decode role does the same);
- both protocols run the same timeline here: SGLang's decode is sent with the prefill but
  cannot compute before its KV arrives, which is when vLLM's decode call would start.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from emulator.engine import EngineConfig
from policies.pd import DEFAULT_SELECTOR, make_pair_selector
from simulator.cluster import Cluster, EngineFactory, Listener, Worker, default_engine
from simulator.kernel import Kernel


class PairModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str = DEFAULT_SELECTOR
    params: dict[str, Any] = Field(default_factory=dict)


class PdPoolModel(BaseModel):
    """A `kind: pd` pool's topology."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: Literal["vllm", "sglang"] = "vllm"
    prefill: int = Field(ge=1)  # prefill workers
    decode: int = Field(ge=1)  # decode workers
    # KV transfer per block, seconds (the emulator's --pd-transfer-s-per-block)
    transfer_s_per_block: float = Field(default=0.0002, ge=0)
    prefill_engine: dict[str, Any] = Field(default_factory=dict)  # overrides, prefill workers
    decode_engine: dict[str, Any] = Field(default_factory=dict)  # overrides, decode workers
    pair: PairModel = Field(default_factory=PairModel)

    def model_post_init(self, _: Any) -> None:
        make_pair_selector(self.pair.policy, self.pair.params)  # unknown names fail here
        for where, overrides in (("prefill_engine", self.prefill_engine),
                                 ("decode_engine", self.decode_engine)):  # fmt: skip
            unknown = set(overrides) - set(EngineConfig.__dataclass_fields__)
            if unknown:
                raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")


def add_pd_pool(
    cluster: Cluster,
    name: str,
    pd: PdPoolModel,
    engine: dict[str, Any],
    kernel: Kernel,
    listener: Listener,
    factory: EngineFactory = default_engine,
) -> list[Worker]:
    """The pool's prefill workers (`<name>-p<i>`) and decode workers (`<name>-d<i>`), each
    with its role in its routing view."""
    if name in cluster.pools:
        raise ValueError(f"pool {name!r} defined twice")
    workers = []
    for role, count, overrides in (
        ("prefill", pd.prefill, pd.prefill_engine),
        ("decode", pd.decode, pd.decode_engine),
    ):
        config = EngineConfig(**{**engine, **overrides})
        for i in range(count):
            w = Worker(f"{name}-{role[0]}{i}", name, config, kernel, listener, factory)
            w.view.role = role
            workers.append(w)
    cluster.pools[name] = workers
    for w in workers:
        cluster.workers[w.id] = w
    return workers
