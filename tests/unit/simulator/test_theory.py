"""The simulator against queueing theory (FleetOpt §3.1 Eq. 3–4; simulator/theory.py)."""

import random
from collections.abc import Sequence

import pytest

from policies.routing import eligible
from policies.types import RequestInfo, WorkerView
from simulator import report, theory
from simulator.run import build_workload, run

from .conftest import small


class UniformRandom:
    """Poisson splitting: each worker then sees Poisson arrivals, as the theory assumes."""

    name = "uniform_random"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choose(self, request: RequestInfo, candidates: Sequence[WorkerView]) -> WorkerView | None:
        pool = eligible(candidates)
        return self.rng.choice(pool) if pool else None


def _timing(sc) -> theory.EngineTiming:  # type: ignore[no-untyped-def]
    cfg = sc.engine_config(sc.fleet.pools[0])
    return theory.EngineTiming(cfg.w, cfg.h, cfg.prefill_chunk, cfg.max_num_seqs)


@pytest.mark.parametrize(
    ("component", "seed", "rate_per_worker"),
    [
        ({"family": "chat"}, 1, 0.5),
        ({"family": "chat"}, 2, 1.0),
        ({"family": "cdf", "cdf": "azure_2023"}, 3, 1.0),
    ],
)
def test_light_load_utilisation_matches_lambda_es_over_slots(
    component, seed, rate_per_worker
) -> None:  # type: ignore[no-untyped-def]
    workers = 4
    sc = small(
        rate=rate_per_worker * workers,
        requests=1500,
        workers=workers,
        components=[component],
        seed=seed,
        engine={"max_num_seqs": 16, "num_kv_blocks": 100000},
        pools=[{"name": "short", "workers": workers, "max_model_len": 16384}],
    )
    specs = build_workload(sc)
    t = _timing(sc)
    k = theory.mean_slot_steps(((s.prompt_tokens, s.output_tokens) for s in specs), t.chunk)
    rep = report.build(
        run(sc, specs=specs, routers={"short": UniformRandom(seed)}), include_series=False
    )
    measured = rep["pools"]["short"]["utilisation"]
    lam = len(specs) / rep["virtual_seconds"]
    predicted = theory.predict(lam, workers, k, t).utilisation
    assert 0.05 < measured < 0.35  # light load: well below the slots
    assert measured == pytest.approx(predicted, rel=0.03)


def test_balancing_routers_run_slightly_below_the_poisson_prediction() -> None:
    # Least-loaded evens out per-worker occupancy, so requests see smaller batches.
    sc = small(rate=4.0, requests=1500, workers=4, engine={"max_num_seqs": 16}, seed=1)
    specs = build_workload(sc)
    t = _timing(sc)
    k = theory.mean_slot_steps(((s.prompt_tokens, s.output_tokens) for s in specs), t.chunk)
    rep = report.build(run(sc, specs=specs), include_series=False)
    predicted = theory.predict(len(specs) / rep["virtual_seconds"], 4, k, t).utilisation
    measured = rep["pools"]["short"]["utilisation"]
    assert 0.90 * predicted < measured < predicted


def test_latency_explodes_as_offered_load_approaches_capacity() -> None:
    base = small(requests=1200, workers=4, engine={"max_num_seqs": 16}, seed=2)
    specs = build_workload(base)
    t = _timing(base)
    k = theory.mean_slot_steps(((s.prompt_tokens, s.output_tokens) for s in specs), t.chunk)
    cap = theory.capacity(4, k, t)
    waits = {}
    for load in (0.5, 0.8, 0.95, 1.1):
        sc = small(rate=load * cap, requests=1200, workers=4, engine={"max_num_seqs": 16}, seed=2)
        res = run(sc)
        rep = report.build(res, include_series=False)
        waits[load] = rep["queue_wait"]["mean"]
        if load == 1.1:
            # Beyond capacity the backlog grows: late arrivals wait far longer than early ones.
            w = [r.scheduled - r.arrival for r in sorted(res.records, key=lambda r: r.arrival)]
            tenth = len(w) // 10
            assert sum(w[-tenth:]) > 10 * sum(w[:tenth])
    assert waits[0.5] < waits[0.8] < waits[0.95] < waits[1.1]
    assert waits[0.95] > 10 * waits[0.5]
    assert waits[1.1] > 100 * waits[0.5]


def test_predict_refuses_loads_past_its_range() -> None:
    t = theory.EngineTiming(0.008, 0.00065, 512, 16)
    with pytest.raises(ValueError):
        theory.predict(rate=100.0, workers=1, k=1000.0, timing=t)
    assert theory.capacity(2, 100.0, t) == pytest.approx(2 * 16 / (100 * (0.008 + 0.00065 * 16)))
