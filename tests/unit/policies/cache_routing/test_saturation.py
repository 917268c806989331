"""The saturation detector (policies/saturation.py) and the regime_adaptive router
(policies/routing/regime_adaptive.py): the EWMA, the thresholds, the hysteresis, Table 2."""

import random

import pytest

from policies.routing import make_router
from policies.saturation import DetectorConfig, Regime, SaturationDetector, p_quantile
from policies.types import Outcome, RequestInfo, Status, WorkerView

B, T, S = Regime.BELOW, Regime.TRANSITION, Regime.SATURATED


def absolute(**kw) -> SaturationDetector:
    return SaturationDetector(DetectorConfig(theta1_s=0.3, theta2_s=2.0, **kw))


def test_ewma_recursion_values():
    d = absolute(alpha=0.3)
    seen = []
    for p99 in (1.0, 2.0, 4.0, None, 0.0):
        d.step(p99)
        seen.append(d.smoothed)
    # L̄ starts at the first sample; an interval without traffic leaves it as it was
    assert seen == pytest.approx([1.0, 1.3, 2.11, 2.11, 1.477])


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_fires_after_exactly_k_samples(k):
    d = absolute(alpha=1.0, k=k)  # α = 1: L̄ is the sample itself
    for _ in range(k - 1):
        assert d.step(0.5) is B
    assert d.step(0.5) is T and d.changes == 1
    # and back only after k samples below θ1 − ε (0.27), not at 0.28
    for _ in range(3 * k):
        assert d.step(0.28) is T
    for _ in range(k - 1):
        assert d.step(0.2) is T
    assert d.step(0.2) is B


def test_fires_after_exactly_k_samples_of_the_smoothed_value():
    d = absolute(alpha=0.3, k=2)
    # L̄: 0.1, 0.22, 0.304 (> θ1: 1st), 0.3628 (2nd) — hand-computed
    got = [d.step(x) for x in (0.1, 0.5, 0.5, 0.5)]
    assert got == [B, B, B, T]
    assert d.smoothed == pytest.approx(0.3628)


def test_a_streak_interrupted_starts_again():
    d = absolute(alpha=1.0, k=3)
    assert [d.step(x) for x in (0.5, 0.5, 0.29, 0.5, 0.5, 0.5)] == [B, B, B, B, B, T]


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_never_flaps_on_a_signal_within_epsilon_of_theta1(alpha):
    rng = random.Random(7)
    for start in (B, T):
        d = SaturationDetector(
            DetectorConfig(theta1_s=1.0, theta2_s=5.0, alpha=alpha, k=2, epsilon=0.1)
        )
        d.regime = start
        regimes = [d.step(rng.uniform(0.901, 1.099)) for _ in range(5000)]
        assert d.changes <= 1
        if start is T:
            assert set(regimes) == {T}  # never below θ1 − ε: it stays
        # any change is the one rise, and it is final
        assert regimes == sorted(regimes)


def test_saturated_and_back_through_the_margins():
    d = absolute(alpha=1.0, k=2)
    assert [d.step(x) for x in (2.5, 2.5)] == [B, S]  # straight to Saturated
    assert [d.step(x) for x in (1.85, 1.85)] == [S, S]  # ≥ θ2 − ε2 = 1.8: stays
    assert [d.step(x) for x in (1.0, 1.0)] == [S, T]
    # a streak rising to mixed levels moves to the level all its samples reach
    d = absolute(alpha=1.0, k=2)
    assert [d.step(x) for x in (3.0, 0.5)] == [B, T]


def test_window_p99_per_control_interval():
    d = absolute(interval_s=5.0, window_s=30.0, alpha=1.0, k=1)
    d.observe(0.01, 0.0)  # opens the first interval, ending at 5
    for i in range(1, 100):
        d.observe(0.01 * (i + 1), 0.04 * i)  # 0.02 … 1.00 within the first 4 s
    assert d.last_p99 is None
    d.advance(5.0)
    assert d.last_p99 == pytest.approx(0.99)  # nearest rank of 100 values
    assert d.regime is T
    d.advance(40.0)  # the samples left the 30 s window: no traffic, nothing changes
    assert d.last_p99 == pytest.approx(0.99) and d.regime is T
    assert p_quantile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_relative_thresholds_from_the_warm_up_baseline():
    d = SaturationDetector(DetectorConfig(warmup_intervals=3, alpha=1.0, k=1))
    assert d.theta1 is None
    for x in (0.070, 0.075, 0.090):
        assert d.step(x) is B
    assert d.baseline == pytest.approx(0.075)
    assert (d.theta1, d.theta2) == (pytest.approx(0.3), pytest.approx(2.01))
    assert d.step(0.31) is T
    given = SaturationDetector(DetectorConfig(baseline_s=0.25))
    assert (given.theta1, given.theta2) == (pytest.approx(1.0), pytest.approx(6.7))


def test_bad_configuration_fails():
    for kw in (
        {"theta1_s": 1.0},
        {"theta1_s": 2.0, "theta2_s": 1.0},
        {"alpha": 0.0},
        {"k": 0},
        {"epsilon": 1.0},
        {"interval_s": 0.0},
    ):
        with pytest.raises(ValueError):
            DetectorConfig(**kw)


# --- regime_adaptive -----------------------------------------------------------------------


def view(i: int, **kw) -> WorkerView:
    return WorkerView(id=f"w{i}", pool="p", max_model_len=32768, **kw)


def test_regime_adaptive_switches_tau_and_omega_by_table_2():
    r = make_router(
        "regime_adaptive", {"detector": {"theta1_s": 0.3, "theta2_s": 2.0, "k": 2, "alpha": 1.0}}
    )
    sampler = next(h for h in r.hooks() if h is r.sampler)
    workers = [view(0), view(1)]
    now = 0.0
    n = 0

    def serve(ttft: float, intervals: int) -> None:
        nonlocal now, n
        for _ in range(intervals):
            for _ in range(10):  # ten requests per 5 s interval, each routed and served
                n += 1
                q = RequestInfo(f"r{n}", "m", now, 100, 10)
                sampler.on_arrival(q, now)
                w = r.choose(q, workers)
                for h in r.hooks():
                    h.on_dispatch(q, w.id, now)
                sampler.on_first_token(q, now + ttft)
                for h in r.hooks():
                    h.on_complete(q, Outcome(Status.OK), now + ttft)
                now += 0.5
        r.choose(RequestInfo("probe", "m", now, 1, 1), workers)

    assert (r.regime, r.temperature, r.overlap_weight) == (B, 0.0, 1.0)
    serve(0.05, 4)
    assert (r.regime, r.temperature, r.overlap_weight) == (B, 0.0, 1.0)
    serve(0.8, 3)
    assert (r.regime, r.temperature, r.overlap_weight) == (T, 0.7, 1.0)
    serve(5.0, 3)
    assert (r.regime, r.temperature, r.overlap_weight) == (S, 0.8, 0.1)
    serve(0.05, 10)  # the P99 window (30 s) must empty of slow ones first, then k = 2
    assert (r.regime, r.temperature, r.overlap_weight) == (B, 0.0, 1.0)
    assert r.decisions > 0 and r.detector.changes == 3


def test_regime_adaptive_counts_only_its_own_pool():
    r = make_router("regime_adaptive", {"detector": {"theta1_s": 0.3, "theta2_s": 2.0}})
    r.choose(RequestInfo("x", "m", 0.0, 10, 10), [view(0)])
    for i in range(50):
        q = RequestInfo(f"o{i}", "m", i * 1.0, 10, 10)
        r.sampler.on_arrival(q, i * 1.0)
        r.sampler.on_dispatch(q, "elsewhere", i * 1.0)
        r.sampler.on_first_token(q, i * 1.0 + 9.0)
    assert r.detector.last_p99 is None and r.detector.regime is B


def test_regime_adaptive_table_is_configurable_and_checked():
    r = make_router("regime_adaptive", {"transition": [0.3, 0.7]})
    assert r._table[T] == (0.3, 0.7)
    with pytest.raises(ValueError, match="saturated"):
        make_router("regime_adaptive", {"saturated": [0.8]})
    with pytest.raises(ValueError, match="detector"):
        make_router("regime_adaptive", {"detector": {"kk": 2}})
