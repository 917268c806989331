"""The analytic prefill model and the regime calibration (policies/quantile/)."""

from __future__ import annotations

import random

import pytest

from emulator.engine import EngineConfig
from policies.quantile.analytic import AnalyticModel
from policies.quantile.calibration import REGIMES, Calibration, regime_name
from policies.quantile.config import QuartzSettings
from policies.quantile.features import FEATURES, Quantiles, vector
from policies.registry import config_from
from policies.types import Category, RequestInfo


def x(prompt=1000, loc=0, running=0, waiting=0, backlog=0, kv=0.0, bucket=0):
    r = RequestInfo("r", "m", 0.0, prompt, 64, category=Category.RAG)
    return vector(r, loc, bucket, running, waiting, backlog, kv)


def test_vector_follows_the_contract_order():
    v = x(prompt=700, loc=16, running=3, waiting=1, backlog=900, kv=0.5, bucket=1)
    named = dict(zip(FEATURES, v, strict=True))
    assert named["prompt_tokens"] == 700 and named["locality_tokens"] == 16
    assert named["locality_bucket"] == 1 and named["running"] == 3 and named["waiting"] == 1
    assert named["prefill_backlog_tokens"] == 900 and named["kv_usage"] == 0.5
    assert named["category"] == 3.0 and named["temperature"] == 1.0 and named["stream"] == 0.0


def test_analytic_model_is_the_engine_models_prefill():
    e = EngineConfig()
    m = AnalyticModel(e.w, e.h, e.prefill_chunk, e.max_num_seqs)
    # idle worker, 1,000 tokens: ⌈1000/512⌉ chunks + the step emitting token one, batch of 1
    assert m.mean(x(1000)) == pytest.approx(3 * (e.w + e.h))
    assert m.mean(x(1000, loc=512)) < m.mean(x(1000))  # cached prefix skips prefill
    assert m.mean(x(1000, running=100)) > m.mean(x(1000))  # wider batch, slower steps
    # a full engine: it waits for a slot
    assert m.mean(x(1000, running=256, waiting=10)) > 2 * m.mean(x(1000, running=255))
    q = m.predict(x(4000))
    assert q.mean < q.q90 < q.q95


def test_calibration_brings_coverage_to_alpha_per_regime():
    """A model that under-predicts by 2× in one regime: corrected, coverage ≈ α there."""
    cal = Calibration(alpha=0.95, window=256, min_samples=32)
    rng = random.Random(1)
    raw = Quantiles(0.1, 0.12, 0.13)
    regime = cal.regime(x(5000))
    hits = 0
    n = 2000
    for i in range(n):
        q = cal.correct(raw, regime)
        y = rng.uniform(0.1, 0.3)  # truly: q95 = 0.29
        if i >= 500:
            hits += y <= q.q95
        cal.observe(regime, raw, q.q95, y)
    assert 0.9 <= hits / (n - 500) <= 0.99
    q = cal.correct(raw, regime)
    assert q.mean == pytest.approx(0.2, abs=0.02) and q.q95 == pytest.approx(0.29, abs=0.02)
    assert q.mean <= q.q90 <= q.q95
    assert set(cal.coverage_by_regime()) == {regime_name(regime)}


def test_a_bucket_without_samples_borrows_the_pooled_correction():
    cal = Calibration(min_samples=8)
    raw = Quantiles(1.0, 1.0, 1.0)
    for _ in range(20):
        cal.observe(0, raw, 1.0, 2.0)
    assert cal.correct(raw, 5).q95 == pytest.approx(2.0)
    assert Calibration(enabled=False).correct(raw, 0) is raw


def test_fallback_on_under_coverage_and_back_with_hysteresis():
    cal = Calibration(alpha=0.95, delta=0.05, window=100, min_samples=20, enabled=False)
    raw = Quantiles(1.0, 1.0, 1.0)
    for _ in range(30):
        cal.observe(0, raw, 1.0, 0.5)  # covered
    assert not cal.degraded
    for _ in range(8):
        cal.observe(0, raw, 1.0, 5.0)  # misses: coverage 30/38 ≈ 0.79 < 0.90
    assert cal.degraded and cal.changes == 1
    # back only when under-coverage < δ/2: coverage > 0.925 over the window
    while cal.coverage() < 0.925:
        assert cal.degraded
        cal.observe(0, raw, 1.0, 0.5)
    cal.observe(0, raw, 1.0, 0.5)
    assert not cal.degraded and cal.changes == 2


def test_regimes_and_names():
    cal = Calibration()
    seen = {
        cal.regime(x(p, running=r, bucket=b))
        for p in (10, 2000, 9000)
        for r in (0, 20, 99)
        for b in (0, 1, 2)
    }
    assert seen == set(range(REGIMES))
    assert regime_name(26) == "long/high/high"


def test_settings_refuse_unknown_keys_and_bad_values():
    with pytest.raises(ValueError, match="unknown parameter"):
        config_from(QuartzSettings, {"alpah": 0.9})
    with pytest.raises(ValueError, match="alpha"):
        QuartzSettings(alpha=0.5)
    with pytest.raises(ValueError, match="delta"):
        QuartzSettings(delta=2.0)
