"""Token budget estimation (policies/budget.py): the formula, the per-category EMA, its
warm-up and its rejections, against counts from the real template and tokenizer."""

from __future__ import annotations

import pytest

from compressor.tokenizer import count
from policies.budget import (
    Budget,
    BudgetConfig,
    BudgetEstimator,
    BytesPerToken,
    estimate_chat,
    estimate_tokens,
    measure_chat,
    measure_prompt,
    template_tokens,
    text_bytes,
)
from policies.types import Category
from tests.tokens import engine_tokens


def test_baseline_functions_keep_their_meaning() -> None:
    config = BudgetConfig()
    assert estimate_tokens(4000, config) == 1000
    assert estimate_tokens(4001, config) == 1001
    assert estimate_tokens(3000, config, ratio=3.0) == 1000
    assert (
        estimate_chat(400, 2, config) == 100 + 2 * config.message_overhead + config.reply_overhead
    )
    assert Budget(100, 20).total == 120


def test_template_overhead_matches_the_engine() -> None:
    config = BudgetConfig()
    for n in (1, 2, 5, 20):
        messages = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": "Hello there."}
            for i in range(n)
        ]
        real = engine_tokens(messages=messages) - n * count("Hello there.")
        assert abs(template_tokens(n, config) - real) <= 1 + n // 10
    assert template_tokens(0, config) == engine_tokens(prompt="Hello there.") - count(
        "Hello there."
    )


def test_bytes_are_utf8_bytes() -> None:
    assert text_bytes("abc") == 3
    assert text_bytes("héllo") == 6
    assert text_bytes("中文") == 6
    size = measure_chat(
        [
            {"role": "user", "content": "héllo"},
            {"role": "assistant", "content": [{"type": "text", "text": "ab"}]},
        ]
    )
    assert (size.content_bytes, size.n_messages) == (8, 2)
    assert measure_prompt("abc").n_messages == 0


def test_ema_learns_a_category_and_leaves_others_at_the_prior() -> None:
    state = BytesPerToken(BudgetConfig(bytes_per_token=4.0, ema_alpha=0.1))
    assert state.ratio(Category.CODE) == 4.0
    for _ in range(50):
        assert state.observe(Category.CODE, content_bytes=2500, n_messages=0, prompt_tokens=1001)
    assert state.ratio(Category.CODE) == pytest.approx(2.5)
    assert state.ratio(Category.PROSE) == 4.0
    assert state.observations(Category.CODE) == 50


def test_warm_up_leaves_the_prior_at_the_first_observation() -> None:
    state = BytesPerToken(BudgetConfig(ema_alpha=0.01))
    state.observe(Category.PROSE, 5000, 0, 1001)
    assert state.ratio(Category.PROSE) == pytest.approx(5.0)
    state.observe(Category.PROSE, 3000, 0, 1001)
    assert state.ratio(Category.PROSE) == pytest.approx(4.0)  # the running mean while n < 1/α


def test_observations_are_size_weighted_and_template_corrected() -> None:
    config = BudgetConfig(ema_alpha=1.0)
    state = BytesPerToken(config)
    n = 3
    state.observe(Category.CHAT, 4000, n, 1000 + template_tokens(n, config))
    assert state.ratio(Category.CHAT) == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("content_bytes", "tokens"), [(100, 5), (0, 100), (50_000, 1000), (500, 1000)]
)
def test_implausible_observations_are_rejected(content_bytes: int, tokens: int) -> None:
    state = BytesPerToken()
    assert not state.observe(Category.PROSE, content_bytes, 0, tokens)
    assert state.rejected == 1
    assert state.ratio(Category.PROSE) == BudgetConfig().bytes_per_token


def test_token_budget_estimates_and_learns() -> None:
    budget = BudgetEstimator(BudgetConfig(default_max_tokens=300))
    messages = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 100}]
    size = measure_chat(messages)
    first = budget.estimate(size, Category.PROSE, None)
    assert first.max_tokens == 300
    engine = engine_tokens(messages=messages)
    budget.observe(size, Category.PROSE, engine)
    second = budget.estimate(size, Category.PROSE, 10)
    assert second.max_tokens == 10
    assert abs(second.prompt_tokens - engine) <= abs(first.prompt_tokens - engine)
    assert abs(second.prompt_tokens - engine) <= 2


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        BudgetConfig(ema_alpha=0)
    with pytest.raises(ValueError):
        BudgetConfig(category_priors={Category.CODE: 0.0})
    assert BudgetConfig(category_priors={Category.CODE: 3.0}).prior(Category.CODE) == 3.0
