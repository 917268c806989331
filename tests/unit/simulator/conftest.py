"""Helpers for the simulator's tests: small scenarios built in code."""

from __future__ import annotations

from typing import Any

from simulator.scenario import Scenario, parse


def small(
    rate: float = 4.0,
    requests: int = 200,
    workers: int = 2,
    components: list[dict[str, Any]] | None = None,
    seed: int = 1,
    engine: dict[str, Any] | None = None,
    pools: list[dict[str, Any]] | None = None,
    routing: str = "least_loaded",
    **extra: Any,
) -> Scenario:
    doc: dict[str, Any] = {
        "name": "test",
        "seed": seed,
        "fleet": {
            "engine": {"max_num_seqs": 16, "num_kv_blocks": 20000, **(engine or {})},
            "pools": pools or [{"name": "short", "workers": workers, "max_model_len": 8192}],
        },
        "policy": {"routing": {"policy": routing}},
        "workload": {
            "requests": requests,
            "arrivals": {"kind": "poisson", "rate": rate},
            "components": components or [{"family": "chat"}],
        },
        **extra,
    }
    return parse(doc)
