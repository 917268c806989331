"""The cache-aware routers driven by the real pipeline core in the simulator (issue 27):
the composition root (policies/build.py) attaches their `hooks()`, the engine model's
prefix cache decides the hits. Virtual time, one seed: directions with wide margins only."""

import pytest

from policies.routing import make_router
from simulator.run import run
from simulator.scenario import parse


def many_prefixes(requests: int = 600, rate: float = 8.0, routing: dict | None = None):
    """120 shared templates of 1–3k tokens (Zipf 0.6) over 4 workers whose caches hold
    ~16 templates each: where a request goes decides whether its prefix is cached."""
    return parse(
        {
            "name": "many-prefixes",
            "seed": 1,
            "fleet": {
                "engine": {
                    "max_num_seqs": 64,
                    "num_kv_blocks": 2048,
                    "enable_prefix_caching": True,
                },
                "pools": [
                    {
                        "name": "short",
                        "workers": 4,
                        "max_model_len": 8192,
                        **({"routing": routing} if routing else {}),
                    }
                ],
            },
            "workload": {
                "requests": requests,
                "arrivals": {"kind": "poisson", "rate": rate},
                "components": [
                    {
                        "family": "structured",
                        "params": {
                            "templates": 120,
                            "zipf_s": 0.6,
                            "prefix_min": 1024,
                            "prefix_max": 3072,
                        },
                    }
                ],
            },
        }
    )


def hit_rate(name: str, params: dict | None = None) -> tuple[float, object]:
    router = make_router(name, params or {})
    result = run(many_prefixes(), routers={"short": router})  # build_core attaches its hooks
    assert all(r.status == "ok" for r in result.records)
    return result.engine_stats["short"]["prefix_hit_rate"], router


@pytest.fixture(scope="module")
def baseline() -> float:
    return hit_rate("least_loaded")[0]


@pytest.mark.parametrize(
    ("name", "params", "margin"),
    [("prefix_overlap", {}, 0.2), ("kv_cost", {"overlap_weight": 4.0}, 0.15)],
)
def test_cache_routers_raise_the_hit_rate_fed_by_the_core(baseline, name, params, margin):
    rate, router = hit_rate(name, params)
    assert rate >= baseline + margin, (rate, baseline)
    state = router.state
    # the core's dispatch and completion events fed the state, and left nothing behind
    assert state.fed and not state._requests
    workers = sorted(state._known)
    assert len(workers) == 4 and all(state.index.blocks_of(w) > 0 for w in workers)
    assert all(state.active_blocks(w) == 0 for w in workers)
    assert 0 < len(state.index) <= state.index.max_blocks


def test_kv_cost_hit_rate_rises_with_omega():
    rates = [hit_rate("kv_cost", {"overlap_weight": w})[0] for w in (1.0, 4.0)]
    assert rates[1] > rates[0] + 0.05, rates


def test_a_pools_configured_cache_router_is_fed_by_the_core_events():
    """Configured by the scenario (not handed in): build_core builds the pool's router at
    its first decision and attaches its hooks once; the events then keep its state."""
    kv_cost = {"policy": "kv_cost", "params": {"overlap_weight": 4.0}}
    result = run(many_prefixes(200, routing=kv_cost))
    router = result.core.routers["short"]
    assert router.name == "kv_cost"
    state = router.state
    hooks = result.core.hooks
    assert sum(h is state for h in hooks) == 1
    assert state.fed and not state._requests
    assert all(state.active_blocks(w) == 0 for w in state._known)
    assert result.engine_stats["short"]["prefix_hit_rate"] > 0.3


def test_regime_adaptives_detector_hears_the_simulated_ttfts():
    """Its TTFT sampler is among the hooks: the detector closes intervals with samples."""
    routing = {"policy": "regime_adaptive", "params": {"detector": {"baseline_s": 0.05}}}
    result = run(many_prefixes(300, rate=20.0, routing=routing))
    detector = result.core.routers["short"].detector
    assert detector.smoothed is not None and detector.last_p99 is not None
    assert detector.theta1 == 4 * 0.05


def test_kv_cost_hit_rate_falls_as_temperature_rises():
    """τ spreads decisions over costlier workers: fewer requests land on their prefix."""
    rates = [hit_rate("kv_cost", {"overlap_weight": 4.0, "temperature": t})[0] for t in (0.0, 1.0)]
    assert rates[0] > rates[1] + 0.05, rates
