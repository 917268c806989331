"""Steps 3–4 as one object for both drivers (policies/intake.py)."""

from __future__ import annotations

from compressor.compress import Compression
from policies.budget import BudgetConfig, BudgetEstimator, ChatSize
from policies.intake import CHAT, COMPLETIONS, Intake, Placed, Prompt, Refusal
from policies.pools import CompressAndRoute, ShortLongPlacement
from policies.types import Category, PoolSpec

POOLS = [PoolSpec("short", 8192, frozenset({"m"})), PoolSpec("long", 65536, frozenset({"m"}))]


def intake(placer=None, classify=None) -> Intake:
    return Intake(
        placer or CompressAndRoute("short", 8192, 1.5),
        BudgetEstimator(BudgetConfig(bytes_per_token=4.0)),
        classify,
    )


def chat(tokens: int, max_tokens: int = 256, **kw) -> Prompt:
    return Prompt(CHAT, "m", ChatSize(tokens * 4, 1), max_tokens, **kw)


def test_short_request_takes_the_fast_path_without_classifying():
    seen = []
    placed = intake(classify=lambda p: seen.append(p) or Category.PROSE).take(
        chat(500), "r1", 0.0, POOLS
    )
    assert isinstance(placed, Placed)
    assert placed.pools == ("short", "long") and placed.fit_target is None
    assert not seen and not placed.classified  # clearly short: the category cannot matter


def test_borderline_request_asks_for_a_fit_and_applies_it():
    placed = intake().take(chat(9000, category=Category.PROSE), "r2", 0.0, POOLS)
    assert isinstance(placed, Placed) and placed.placement.borderline
    assert placed.pools == ("short",) and placed.fit_target == 8192 - 256
    result = Compression(placed.fit_target, 9010, 7900, units=10, units_dropped=3)
    assert intake().fitted(placed, result) is None
    assert placed.info.prompt_tokens == 7900 and placed.compressed == (9010, 7900)
    assert placed.size.content_bytes < 9000 * 4  # a modelled compression shrinks the bytes


def test_a_failed_fit_falls_back_to_the_long_pool_or_is_refused():
    i = intake()
    placed = i.take(chat(9000, category=Category.PROSE), "r3", 0.0, POOLS)
    assert isinstance(placed, Placed)
    assert i.fitted(placed, Compression(placed.fit_target, 9010, 9010)) is None
    assert placed.pools == ("long",) and placed.compressed is None
    alone = [POOLS[0]]
    single = intake(CompressAndRoute("short", 8192, 1.5, compress_single_pool=True))
    placed = single.take(chat(9000, category=Category.PROSE), "r4", 0.0, alone)
    refused = single.fitted(placed, Compression(placed.fit_target, 9010, 9010))
    assert isinstance(refused, Refusal) and refused.kind == "too_long"
    # without compress_single_pool one pool does not compress: refused at placement
    refused = i.take(chat(9000, category=Category.PROSE), "r5", 0.0, alone)
    assert isinstance(refused, Refusal) and "compress_single_pool" in refused.reason


def test_refusals_are_values():
    i = intake(ShortLongPlacement("short", 8192))
    assert i.take(Prompt(CHAT, "other", ChatSize(10, 1)), "r", 0.0, POOLS).kind == "no_model"
    too = i.take(chat(70_000), "r", 0.0, POOLS)
    assert isinstance(too, Refusal) and too.kind == "too_long" and too.limit == 65536


def test_exact_and_token_id_counts_skip_the_estimate():
    i = intake()
    placed = i.take(chat(0, exact_tokens=1234, category=Category.RAG), "r", 0.0, POOLS)
    assert placed.info.prompt_tokens == 1234 and placed.info.category is Category.RAG
    ids = i.take(Prompt(COMPLETIONS, "m", ChatSize(0, 0), 16, token_ids=777), "r", 0.0, POOLS)
    assert ids.info.prompt_tokens == 777 and ids.info.category is Category.CODE


def test_learning_only_from_requests_whose_category_is_known():
    i = intake()
    fast = i.take(chat(100), "a", 0.0, POOLS)
    i.learn(fast, 100)
    known = i.take(chat(3000, category=Category.PROSE), "b", 0.0, POOLS)
    before = i.estimator.estimate(ChatSize(12000, 1), Category.PROSE, 0).prompt_tokens
    for _ in range(50):
        i.learn(known, 6000)  # the engine counted twice the tokens the prior said
    after = i.estimator.estimate(ChatSize(12000, 1), Category.PROSE, 0).prompt_tokens
    assert after > 1.5 * before


def test_non_ascii_text_never_takes_the_fast_path_on_an_ascii_bound():
    """Was: bytes / 3 was taken as a bound on tokens for every text, so a 20 KB Chinese
    chat (≈ 8K cl100k tokens at ~2.5 bytes per token) skipped the classifier and went to
    the short pool on an estimate."""
    seen = []
    i = intake(classify=lambda p: seen.append(p) or Category.PROSE)
    chinese = Prompt(CHAT, "m", ChatSize(20_000, 1), 256, ascii=False)
    i.take(chinese, "zh", 0.0, POOLS)
    assert seen, "20 KB of non-ASCII text must be classified and estimated, not fast-pathed"
    seen.clear()
    i.take(Prompt(CHAT, "m", ChatSize(20_000, 1), 256), "en", 0.0, POOLS)
    assert not seen  # the same bytes of ASCII: provably short, fast path
