"""Count exactly where the byte estimate cannot decide (policies/uncertainty.py, issue 24).

The oracle of the last tests is not the estimate: it is the exact count of real
tokenizers (cl100k, Llama-3.1's and Qwen3's tokenizer.json, tests/served_models.py) on the
shapes corpus built from real text (bench/shapes.py, with Chinese and Japanese pages)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressor import content
from compressor.compress import Compression
from compressor.content import is_log
from compressor.script import Script, script_of, script_of_prompt
from policies.budget import BudgetConfig, BudgetEstimator, measure_chat
from policies.intake import CHAT, Intake, Placed, Prompt
from policies.pools import CompressAndRoute
from policies.types import Category, PoolSpec
from policies.uncertainty import SCRIPT_PRIORS, ByteBounds, Interval, straddles, total_range

POOLS = [PoolSpec("short", 8192, frozenset({"m"})), PoolSpec("long", 65536, frozenset({"m"}))]
PLACER = CompressAndRoute("short", 8192, 1.5)


def intake(classify=None, bounds: ByteBounds | None = None) -> Intake:
    return Intake(
        PLACER,
        BudgetEstimator(BudgetConfig(bytes_per_token=4.0)),
        classify or (lambda p: Category.PROSE),
        bounds=bounds if bounds is not None else ByteBounds(),
        scripter=script_of_prompt,
    )


def user(text: str, max_tokens: int = 256) -> Prompt:
    messages = [{"role": "user", "content": text}]
    return Prompt(
        CHAT, "m", measure_chat(messages), max_tokens, messages=messages, ascii=text.isascii()
    )


def json_lines(n_bytes: int) -> str:
    line = '{"id": 12345, "ts": "2024-05-01T10:00:00Z", "lvl": "warn", "code": 503},\n'
    return "[\n" + line * (n_bytes // len(line)) + "]"


def test_the_range_holds_a_boundary_only_when_the_interval_is_wide_enough():
    lo, hi = total_range(30_000, 10, 256, Interval(3.0, 5.0))
    assert (lo, hi) == (6000 + 266, 10000 + 266)
    assert straddles(lo, hi, (8192, 12288)) and not straddles(lo, hi, (12288,))


def test_counting_follows_the_placers_stated_edges_not_its_type():
    """The intake asks a placer for its `edges` (the placement protocol's capability);
    one that states none is placed on its estimate, whatever it is."""
    from dataclasses import dataclass

    from policies.pools import ShortLongPlacement
    from policies.protocols.placement import Edges

    assert PLACER.edges == Edges("short", 8192, 1.5, 256, PLACER.compressible, False)
    assert PLACER.edges.boundaries(POOLS[0]) == (8192, 12288)
    assert ShortLongPlacement("short", 8192).edges.boundaries(POOLS[0]) == (8192,)

    @dataclass(frozen=True)
    class Blind:  # C&R's decisions, but no boundaries stated
        inner: CompressAndRoute = PLACER
        edges: Edges | None = None

        @property
        def category_blind_below(self) -> float:
            return 0.0

        def place(self, request, pools, healthy=None):  # type: ignore[no-untyped-def]
            return self.inner.place(request, pools, healthy)

    text = json_lines(28_000)  # the estimate cannot place it (the next test)
    bounds = ByteBounds()
    blind = Intake(
        Blind(),
        BudgetEstimator(BudgetConfig(bytes_per_token=4.0)),
        lambda p: Category.PROSE,
        bounds=bounds,
        scripter=script_of_prompt,
    ).take(user(text), "r", 0.0, POOLS)
    assert isinstance(blind, Placed) and not blind.placement.uncertain and bounds.counts == 0
    counted = intake().take(user(text), "r", 0.0, POOLS)
    assert isinstance(counted, Placed) and counted.placement.uncertain


def test_dense_json_that_looks_short_is_counted_not_sent_uncounted():
    # ~28 KB of log-like JSON: ĉ = 4.0 says ~7,000 tokens (short, outside the verify margin);
    # at 2–3 bytes a token it may be 9,000–14,000: the estimate cannot place it
    text = json_lines(28_000)
    assert script_of([text]) is Script.RECORDS
    placed = intake().take(user(text), "r", 0.0, POOLS)
    assert isinstance(placed, Placed)
    assert placed.fit_target == 8192 - 256 and placed.placement.compress_within == 12288 - 256
    assert placed.pools[0] == "short" and placed.placement.fallback == ("long",)


def test_far_from_both_boundaries_there_is_no_count_and_no_classifier_below():
    seen: list[Prompt] = []
    bounds = ByteBounds()

    def classify(p: Prompt) -> Category:
        seen.append(p)
        return Category.PROSE

    i = intake(classify, bounds)
    small = i.take(user("A short question about licences? " * 40), "a", 0.0, POOLS)
    assert isinstance(small, Placed) and small.fit_target is None and not seen
    huge = i.take(user("Plain English prose sentence here. " * 6000), "b", 0.0, POOLS)
    assert isinstance(huge, Placed) and huge.fit_target is None and huge.pools == ("long",)
    assert bounds.counts == 0


def test_prose_far_below_b_short_skips_the_classifier_a_log_of_its_size_is_counted():
    # ~20 KB: under the logs' floor (2 bytes a token) it could be 10,000 tokens, so the
    # ASCII fast path cannot wave it through; its script is prose, whose floor (2.9) bounds
    # it under 7,000: placed short with no classifier and no count, as before issue 24
    seen: list[Prompt] = []

    def classify(p: Prompt) -> Category:
        seen.append(p)
        return Category.PROSE

    i = intake(classify)
    prose = i.take(user("Plain English prose sentence here. " * 570), "a", 0.0, POOLS)
    assert isinstance(prose, Placed) and prose.pools[0] == "short"
    assert prose.fit_target is None and prose.script is None and not seen
    log = i.take(user(json_lines(20_000)), "b", 0.0, POOLS)
    assert isinstance(log, Placed) and log.script is Script.RECORDS and len(seen) == 1
    assert log.fit_target == 8192 - 256 and log.placement.uncertain


def test_the_floor_is_the_lowest_of_a_scripts_intervals_learnt_ones_included():
    bounds = ByteBounds()
    assert bounds.floor(Script.TEXT) == SCRIPT_PRIORS[Script.TEXT].lo
    assert bounds.floor(Script.RECORDS) == SCRIPT_PRIORS[Script.RECORDS].lo
    assert bounds.widen(Category.CHAT, Script.TEXT, 2_500, 1_000)  # 2.5 bytes a token
    assert bounds.floor(Script.TEXT) == 2.5
    assert bounds.floor(Script.RECORDS) == SCRIPT_PRIORS[Script.RECORDS].lo


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "2024-05-01T10:00:00Z GET /x 200",
                "Mar  3 10:11:12 host sshd[1]: ok",
                "[10:11:12] worker started",
                "  12:00:01 indented",
                "plain words: a colon",
                "no colon at all here",
                "",
                "12:3 almost",
            ]
        ),
        max_size=40,
    )
)
def test_is_logs_colon_precheck_never_changes_its_answer(lines):
    text = "\n".join(lines)
    s = content._sample(text)
    plain = len(content._LOG_LINE.findall(s)) >= content.LOG_SHARE * (s.count("\n") + 1)
    assert is_log(text) == plain


def test_a_count_above_the_band_is_not_compressed_but_sent_long():
    i = intake()
    placed = i.take(user(json_lines(28_000)), "r", 0.0, POOLS)
    assert isinstance(placed, Placed) and placed.fit_target is not None
    compressed = Compression(placed.fit_target, 13_000, 7_900, units=9, units_dropped=4)
    assert i.fitted(placed, compressed) is None
    assert placed.pools == ("long",) and placed.compressed is None
    assert placed.info.prompt_tokens == 13_000


def test_engine_counts_widen_the_interval():
    bounds = ByteBounds()
    before = bounds.interval(Category.PROSE, Script.TEXT)
    assert bounds.widen(Category.PROSE, Script.TEXT, 9_000, 1_000)  # 9 bytes a token
    after = bounds.interval(Category.PROSE, Script.TEXT)
    assert after.lo == before.lo and after.hi == 9.0
    assert not bounds.widen(Category.PROSE, Script.TEXT, 100, 10)  # too few tokens


# --- against real tokenizers on real text -------------------------------------------------


def _oracle(total: int, category: Category) -> str:
    """Where the exact count places a request (C&R, B_short 8192, γ 1.5)."""
    if total <= 8192:
        return "short"
    if total <= 12288 and category in PLACER.compressible:
        return "compress"
    return "long"


def _decision(placed: Placed) -> str:
    if placed.fit_target is not None:
        return "count"  # the driver counts exactly and places on the count
    return "short" if placed.pools[0] == "short" else "long"


@pytest.fixture(scope="module")
def served():
    from compressor.hf_template import HFTemplate
    from compressor.template import default_template
    from tests.served_models import llama31_dir, qwen3_dir

    where = Path(tempfile.mkdtemp())
    return {
        "cl100k": default_template(),
        "llama3.1": HFTemplate(llama31_dir(where)),
        "qwen3": HFTemplate(qwen3_dir()),
    }


@pytest.fixture(scope="module")
def corpus():
    from tests.shapes import CJK_SHAPES, SHAPES, shape_set

    return shape_set(per_shape=2, seed=24, shapes=SHAPES + CJK_SHAPES)


def test_a_cold_gateway_places_every_shape_as_the_exact_count_would(served, corpus):
    """Cold (no observation yet): each request is either counted exactly, or placed where
    the served model's own count places it — under three different tokenizers."""
    from compressor.content import classify

    def category_of(p: Prompt) -> Category:
        return classify(messages=p.messages) if p.messages else classify(prompt=p.prompt)

    wrong = []
    for name, template in served.items():
        i = intake(category_of)
        for s in corpus:
            if s.messages is None:
                continue
            messages = s.messages
            # the same request at ¼, 1 and 2× its size: far below, in and far above the band
            for scale in (0.25, 1.0, 2.0):
                msgs = _scaled(messages, scale)
                texts = "".join(str(m.get("content") or "") for m in msgs)
                prompt = Prompt(
                    CHAT, "m", measure_chat(msgs), s.max_tokens, messages=msgs,
                    ascii=texts.isascii(),
                )  # fmt: skip
                placed = i.take(prompt, "r", 0.0, POOLS)
                assert isinstance(placed, Placed)
                got = _decision(placed)
                if got == "count":
                    continue
                exact = template.chat_tokens(msgs) + s.max_tokens
                want = _oracle(exact, placed.info.category)
                if got != want:
                    wrong.append((name, s.meta["shape"], scale, exact, got))
    assert not wrong


def _scaled(messages: list[dict], scale: float) -> list[dict]:
    if scale == 1.0:
        return messages
    out = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, str) and len(c) > 2000:
            c = c[: int(len(c) * scale)] if scale < 1 else c * int(scale)
        out.append({**m, "content": c})
    return out
