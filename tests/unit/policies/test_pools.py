"""Pool placement (policies/pools.py): plain short/long routing and Compress-and-Route."""

from __future__ import annotations

import dataclasses

import pytest

from policies.pools import (
    PLACEMENTS,
    PLACERS,
    CompressAndRoute,
    Placement,
    ShortLongPlacement,
    Verdict,
    make_placement,
    make_placer,
)
from policies.types import Category, PoolSpec, RequestInfo

SHORT = PoolSpec("short", 8192)
LONG = PoolSpec("long", 65536)
POOLS = [SHORT, LONG]


def req(
    prompt: int, max_tokens: int = 256, category: Category = Category.PROSE, model: str = "m"
) -> RequestInfo:
    return RequestInfo(
        id="r",
        model=model,
        arrival=0.0,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        category=category,
    )


def test_short_long_baseline_unchanged() -> None:
    p = ShortLongPlacement()
    assert p.place(req(1000), POOLS).pools == ("short", "long")
    assert p.place(req(9000), POOLS).pools == ("long",)
    too = p.place(req(70000), POOLS)
    assert too.verdict is Verdict.TOO_LONG and too.limit == 65536 and "65536" in too.reason
    assert (
        p.place(req(10, model="x"), [PoolSpec("short", 8192, frozenset({"m"}))]).verdict
        is Verdict.NO_MODEL
    )


def test_short_requests_go_short_with_spill() -> None:
    p = CompressAndRoute(verify_margin=0.0).place(req(1000), POOLS)
    assert p == Placement(
        Verdict.PLACED, ("short", "long"), 65536, category=Category.PROSE, reason="short"
    )
    assert p.compress_to is None and not p.borderline


def test_borderline_compressible_is_compressed_to_t_c_with_long_fallback() -> None:
    r = req(9000, max_tokens=500)
    p = CompressAndRoute().place(r, POOLS)
    assert p.verdict is Verdict.PLACED and p.pools == ("short",)
    assert p.compress_to == 8192 - 500  # T_c = B_short − L_out (Eq. 15)
    assert p.may_compress and p.borderline
    assert p.fallback == ("long",)


@pytest.mark.parametrize("category", [Category.PROSE, Category.RAG, Category.CHAT])
def test_every_compressible_category_uses_the_band(category: Category) -> None:
    assert CompressAndRoute().place(req(10000, category=category), POOLS).borderline


def test_code_and_over_band_requests_go_long() -> None:
    cr = CompressAndRoute()
    code = cr.place(req(9000, category=Category.CODE), POOLS)
    assert code.pools == ("long",) and code.compress_to is None
    over = cr.place(req(12500), POOLS)  # 12756 > 1.5 × 8192
    assert over.pools == ("long",) and over.compress_to is None


def test_in_band_marks_every_band_request_whatever_its_category() -> None:
    """The planner's observed p_c divides by every request in (B, γB]: code (never
    compressed) and too-little-room requests included, not only the ones C&R tries."""
    cr = CompressAndRoute(gamma=1.5, verify_margin=0.0)
    prose = cr.place(req(9000), POOLS)
    code = cr.place(req(9000, category=Category.CODE), POOLS)
    roomless = cr.place(req(1000, max_tokens=8100), POOLS)  # T_c = 92 < min_target
    down = cr.place(req(9000), POOLS, healthy={"long"})
    assert prose.in_band and prose.borderline
    assert code.in_band and not code.borderline and code.pools == ("long",)
    assert roomless.in_band and not roomless.borderline
    assert down.in_band and not down.borderline and down.pools == ("long",)
    for outside in (req(1000), req(12500), req(9000, category=Category.CODE, max_tokens=5000)):
        assert not cr.place(outside, POOLS).in_band
    assert not ShortLongPlacement().place(req(9000), POOLS).in_band


def test_band_edges() -> None:
    cr = CompressAndRoute(gamma=1.5, verify_margin=0.0)
    assert cr.place(req(8192 - 256), POOLS).pools == ("short", "long")
    assert cr.place(req(8192 - 255), POOLS).borderline
    assert cr.place(req(12288 - 256), POOLS).borderline
    assert not cr.place(req(12288 - 255), POOLS).borderline


def test_estimates_just_below_b_short_are_verified_exactly() -> None:
    p = CompressAndRoute(verify_margin=0.05).place(req(7800), POOLS)
    assert p.pools == ("short", "long") and p.compress_to == 8192 - 256
    assert p.may_compress and not p.borderline and p.fallback == ("long",)
    code = CompressAndRoute(verify_margin=0.05).place(req(7800, category=Category.CODE), POOLS)
    assert code.compress_to == 8192 - 256 and not code.may_compress


def test_single_pool_compresses_only_when_asked() -> None:
    refused = CompressAndRoute().place(req(9000), [SHORT])
    assert refused.verdict is Verdict.TOO_LONG and "compress_single_pool" in refused.reason
    # a long pool configured but down: compression is the only way in, whatever the flag
    down = CompressAndRoute().place(req(9000), POOLS, healthy={"short"})
    assert down.borderline and down.fallback == ()


def test_no_long_pool_borderline_still_served_by_compression_else_413() -> None:
    cr = CompressAndRoute(compress_single_pool=True)
    p = cr.place(req(9000), [SHORT])
    assert p.borderline and p.fallback == () and "only way" in p.reason
    code = cr.place(req(9000, category=Category.CODE), [SHORT])
    assert code.verdict is Verdict.TOO_LONG and "code content is not compressed" in code.reason
    big = cr.place(req(20000), [SHORT])
    assert big.verdict is Verdict.TOO_LONG and big.limit == 8192


def test_long_pool_down_and_short_pool_down() -> None:
    cr = CompressAndRoute()
    long_down = cr.place(req(9000), POOLS, healthy={"short"})
    assert long_down.borderline and long_down.fallback == ()
    short_down = cr.place(req(9000), POOLS, healthy={"long"})
    assert short_down.pools == ("long",) and short_down.compress_to is None


def test_huge_max_tokens_leaves_no_room_to_compress() -> None:
    cr = CompressAndRoute()
    p = cr.place(req(400, max_tokens=8000), POOLS)  # 8400 tokens, but T_c = 192 < min_target
    assert p.pools == ("long",) and not p.borderline


def test_too_long_for_every_pool_is_413() -> None:
    p = CompressAndRoute().place(req(70000), POOLS)
    assert p.verdict is Verdict.TOO_LONG and p.limit == 65536 and "70256" in p.reason


def test_short_pool_context_caps_b_short_and_config_is_checked() -> None:
    p = CompressAndRoute(b_short=16384).place(req(9000), [PoolSpec("short", 8192), LONG])
    assert p.borderline and p.compress_to == 8192 - 256
    with pytest.raises(ValueError):
        CompressAndRoute(gamma=0.9)


# --- one conformance suite every placement policy passes ---------------------------------

_POOLS = [PoolSpec("short", 8192, frozenset({"m"})), PoolSpec("long", 65536, frozenset({"m"}))]


def _req(prompt: int, max_tokens: int = 256, model: str = "m", category=Category.PROSE):
    return RequestInfo("r", model, 0.0, prompt, max_tokens, category=category)


@pytest.mark.parametrize("name", PLACEMENTS)
def test_placement_conformance(name: str) -> None:
    placer = make_placement(name, "short", 8192, 1.5, 0.05)

    def place(r: RequestInfo):
        return placer.place(r, _POOLS)

    assert place(_req(100, model="other")).verdict is Verdict.NO_MODEL
    too = place(_req(70_000))
    assert too.verdict is Verdict.TOO_LONG and too.limit == 65536 and too.reason
    short = place(_req(1000))
    assert short.verdict is Verdict.PLACED and short.pools[0] == "short"
    long = place(_req(20_000))
    assert long.pools == ("long",)
    for prompt in range(100, 66_000, 997):  # every placement is coherent
        got = place(_req(prompt, category=Category.CODE))
        if got.verdict is not Verdict.PLACED:
            continue
        assert len(set(got.pools)) == len(got.pools)
        sizes = {p.name: p.max_model_len for p in _POOLS}
        for pool in got.pools:  # code is never compressed: every pool holds it as it is
            assert prompt + 256 <= sizes[pool]
        if got.compress_to is not None:
            assert got.compress_to <= 8192 - 256


def test_unknown_placement_fails_at_start() -> None:
    with pytest.raises(ValueError, match="unknown placement policy 'nope'"):
        make_placement("nope", "short", 8192)


# --- placement is an open extension point: registered by name, built with params ----------


@pytest.mark.parametrize("name", PLACERS.names())
def test_every_registered_placer_keeps_the_protocol(name: str) -> None:
    """Every registered placer, built from the section's shared keys alone: it answers with
    a `Placement` with or without `healthy`, and below `category_blind_below` the content
    category changes nothing but the category it reports."""
    placer = make_placer(name, {"short_pool": "short", "b_short": 8192, "gamma": 1.5})
    blind = placer.category_blind_below
    assert 0.0 <= blind <= 8192
    for prompt in range(50, 70_000, 1499):
        for healthy in (None, {"short", "long"}, {"long"}, set()):
            got = placer.place(_req(prompt), _POOLS, healthy)
            assert isinstance(got, Placement) and got.verdict in set(Verdict)
            assert got.verdict is not Verdict.PLACED or got.pools
        edges = placer.edges  # stated edges are where its decision changes
        if edges is not None:
            short = next(p for p in _POOLS if p.name == edges.short_pool)
            first, last = edges.boundaries(short)[0], edges.boundaries(short)[-1]
            got = placer.place(_req(prompt, category=Category.CODE), _POOLS)
            if got.verdict is Verdict.PLACED and prompt + 256 <= 0.9 * first:
                assert got.pools[0] == edges.short_pool, (prompt, got)
            if got.verdict is Verdict.PLACED and prompt + 256 > last:
                assert got.pools[0] != edges.short_pool, (prompt, got)
        if prompt + 256 <= blind:
            answers = {
                dataclasses.replace(placer.place(_req(prompt, category=c), _POOLS), category=None)
                for c in Category
            }
            assert len(answers) == 1, answers


@pytest.mark.parametrize("name", PLACERS.names())
def test_a_placers_own_params_are_checked_and_shared_keys_it_does_not_use_are_not(name):
    shared = {"short_pool": "short", "b_short": 8192, "gamma": 2.0, "verify_margin": 0.1}
    make_placer(name, shared)  # every policy is offered every shared key
    with pytest.raises(ValueError, match="unknown parameter"):
        make_placer(name, {**shared, "no_such_key": 1})


def test_compress_and_route_takes_its_own_params() -> None:
    placer = make_placement(
        "compress_and_route", "short", 8192, params={"min_target": 1024, "compressible": ["rag"]}
    )
    assert placer.min_target == 1024 and placer.compressible == frozenset({Category.RAG})
    assert not placer.place(req(9000, category=Category.PROSE), POOLS).borderline
