"""The emulated model's endings and logprobs over random requests (emulator/sampling.py)."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from emulator.sampling import (
    OutputModel,
    plan_outcome,
    text_chars,
    text_slice,
    token_id,
    token_logprobs,
    visible_chars,
)

PASSAGE_START = text_slice(0, 400)
stop_strings = st.lists(
    st.one_of(
        st.builds(lambda a, n: PASSAGE_START[a : a + n], st.integers(0, 300), st.integers(1, 20)),
        st.text(min_size=1, max_size=6),
    ),
    max_size=4,
)


@given(st.lists(st.integers(0, 100_000), min_size=1, max_size=8), st.integers(0, 50),
       st.floats(0.5, 300))  # fmt: skip
def test_eos_is_never_the_first_token(prompt: list[int], index: int, mean: float) -> None:
    assert OutputModel(mean, seed=3).natural_length(prompt, index) >= 2


@settings(max_examples=300)
@given(
    natural=st.integers(2, 300),
    max_tokens=st.integers(1, 200),
    ignore_eos=st.booleans(),
    min_tokens=st.integers(0, 10),
    stop=stop_strings,
    stop_ids=st.lists(st.integers(0, 30).map(token_id), max_size=3),
    vllm=st.booleans(),
)
# two stop strings completed by the same token: SGLang takes the first listed ("ac", cut
# at " acceler") and keeps the other in the answer; vLLM takes the one that ends first
@example(natural=2, max_tokens=6, ignore_eos=False, min_tokens=5,
         stop=["ac", " batching keeps the "], stop_ids=[], vllm=False)  # fmt: skip
@example(natural=2, max_tokens=2, ignore_eos=False, min_tokens=0,
         stop=["C", " "], stop_ids=[], vllm=False)  # fmt: skip
@example(natural=2, max_tokens=2, ignore_eos=False, min_tokens=0,
         stop=["C", " "], stop_ids=[], vllm=True)  # fmt: skip
@example(natural=22, max_tokens=22, ignore_eos=False, min_tokens=0,
         stop=["pro", "ch once, prefilling "], stop_ids=[], vllm=False)  # fmt: skip
@example(natural=22, max_tokens=22, ignore_eos=False, min_tokens=0,
         stop=["pro", "ch once, prefilling "], stop_ids=[], vllm=True)  # fmt: skip
def test_outcome_is_consistent(
    natural: int,
    max_tokens: int,
    ignore_eos: bool,
    min_tokens: int,
    stop: list[str],
    stop_ids: list[int],
    vllm: bool,
) -> None:
    min_tokens = min(min_tokens, max_tokens)
    o = plan_outcome(natural, max_tokens, ignore_eos=ignore_eos, min_tokens=min_tokens,
                     stop=stop, stop_token_ids=stop_ids, vllm=vllm)  # fmt: skip
    assert 1 <= o.tokens <= max_tokens
    assert o.finish_reason in ("stop", "length")
    # the answer is what the model recites, cut short, never more than its tokens' text
    assert text_slice(0, len(o.text)) == o.text
    assert len(o.text) <= text_chars(o.tokens)
    if o.eos:
        assert o.finish_reason == "stop" and o.stop_reason is None and not ignore_eos
        assert o.tokens >= min_tokens + 1 and o.tokens >= 2 and o.text
        assert o.text == text_slice(0, text_chars(o.tokens - 1))
    if isinstance(o.stop_reason, str):
        assert o.stop_reason in stop
        assert o.stop_reason in text_slice(0, text_chars(o.tokens))
        if vllm:
            assert o.tokens > min_tokens
    if isinstance(o.stop_reason, int):
        assert o.stop_reason in stop_ids and o.stop_reason == token_id(o.tokens - 1)
        assert o.text == text_slice(0, text_chars(o.tokens - 1))
    if o.finish_reason == "length":
        assert o.tokens == max_tokens and o.text == text_slice(0, text_chars(max_tokens))
    if o.finish_reason == "stop" and not vllm:
        assert o.tokens < max_tokens  # SGLang checks the length first
    # no stop string completes before the last token (it would have ended the answer
    # sooner; vLLM does not look before min_tokens). In the last token vLLM takes the stop
    # string that completes first, so none shows in the answer; SGLang takes the first
    # listed that matches, so only one listed after it can show (SGLang's TODO "handle
    # the case where multiple stop strs are hit"); SGLang skips the max_tokens-th token.
    if vllm and min_tokens == 0:
        assert not any(s in o.text for s in stop)
    if not vllm:
        assert not any(s in text_slice(0, text_chars(o.tokens - 1)) for s in stop)
        if o.finish_reason == "stop":
            listed = stop.index(o.stop_reason) + 1 if isinstance(o.stop_reason, str) else None
            assert not any(s in o.text for s in stop[:listed])
    # a stream (either holdback) shows a growing prefix of the answer, the whole at the end
    holdback = max((len(s) for s in stop), default=1) - 1 if vllm else 0
    shown = [visible_chars(o, g, holdback) for g in range(o.tokens + 1)]
    assert shown[-1] == len(o.text)
    if vllm:
        assert shown == sorted(shown) and max(shown) == len(o.text)


def test_two_stop_strings_in_one_token() -> None:
    """The first token " Continuous" completes both "C" and " " (vLLM: " " ends first)."""
    assert plan_outcome(2, 2, stop=["C", " "], vllm=True).text == ""
    assert plan_outcome(2, 2, stop=["C", " "], vllm=True).stop_reason == " "
    assert plan_outcome(2, 2, stop=["C", " "], vllm=False).text == " "
    assert plan_outcome(2, 2, stop=["C", " "], vllm=False).stop_reason == "C"


@given(st.integers(0, 2**64 - 1), st.integers(0, 5000), st.integers(0, 20))
def test_logprobs_are_finite_sorted_and_deterministic(key: int, pos: int, top: int) -> None:
    chosen = text_slice(text_chars(pos % 90), text_chars(pos % 90 + 1))
    lp, entries = token_logprobs(key, pos, chosen, top)
    assert (lp, entries) == token_logprobs(key, pos, chosen, top)
    assert math.isfinite(lp) and lp < 0
    assert len(entries) == top
    values = [v for _, v in entries]
    assert all(math.isfinite(v) and v < 0 for v in values)
    assert values == sorted(values, reverse=True)
    if top:
        assert entries[0] == (chosen, lp) and all(v < lp for v in values[1:])
        assert len({t for t, _ in entries}) == top
    assert math.fsum(math.exp(v) for v in values) <= 1.0
