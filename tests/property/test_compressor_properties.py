"""Properties of the compressor (compressor/compress.py) on generated documents and chats:

- the result never exceeds T_c, counted with the engine's tokenizer and template, and its
  reported counts are that tokenizer's;
- every shortened text is its own units, in order, keeping its first 3 and last 2;
- fenced code blocks and protected messages come back byte-identical;
- the result is deterministic (and does not depend on the memo's warmth).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compressor.compress import CompressorConfig, compress_chat, compress_prompt
from compressor.document import Analyzer
from compressor.fences import code_spans
from compressor.sentences import split_units
from tests.tokens import engine_tokens

WORDS = [
    "the",
    "data",
    "model",
    "token",
    "request",
    "engine",
    "pool",
    "short",
    "long",
    "budget",
    "gateway",
    "prompt",
    "sentence",
    "answer",
    "question",
    "system",
    "memory",
    "cache",
    "worker",
    "latency",
    "queue",
    "policy",
    "tenant",
    "compress",
    "route",
    "vector",
    "matrix",
    "python",
    "numpy",
    "array",
    "value",
    "function",
    "return",
    "result",
    "error",
    "retry",
    "stream",
]

word = st.sampled_from(WORDS)
sentence = st.builds(
    lambda first, rest, end: " ".join([first.capitalize(), *rest]) + end,
    word,
    st.lists(word, min_size=2, max_size=14),
    st.sampled_from([".", ".", ".", "!", "?", "...", ". (see e.g. the docs)."]),
)
paragraph = st.builds(
    lambda ss, sep: sep.join(ss),
    st.lists(sentence, min_size=1, max_size=7),
    st.sampled_from([" ", " ", "  ", "\n"]),
)
bullets = st.lists(sentence, min_size=1, max_size=5).map(lambda ss: "\n".join("- " + s for s in ss))
code = st.lists(
    st.sampled_from(["x = 1", "def f(a, b):", "    return a. Then", "", "print(x)  # A comment."]),
    min_size=1,
    max_size=6,
).map(lambda lines: "```python\n" + "\n".join(lines) + "\n```")
heading = word.map(lambda w: "## " + w.capitalize())
block = st.one_of(paragraph, paragraph, paragraph, bullets, code, heading)
document = st.lists(block, min_size=1, max_size=25).map("\n\n".join)
fraction = st.floats(min_value=0.3, max_value=1.05)

SETTINGS = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def count(prompt: str) -> int:
    return engine_tokens(prompt=prompt)


def is_unit_subsequence(
    original: str, result: str, keep_first: int = 3, keep_last: int = 2
) -> bool:
    """result == the concatenation of some of original's units, in order, including its
    first `keep_first`, its last `keep_last` and its code blocks."""
    u = split_units(original)
    n = len(u)
    reachable = {0}
    for i in range(n):
        part = u.unit(i)
        required = i < keep_first or i >= n - keep_last or u.code[i]
        nxt = set()
        for p in reachable:
            if result.startswith(part, p):
                nxt.add(p + len(part))
            if not required:
                nxt.add(p)
        reachable = nxt
        if not reachable:
            return False
    return len(result) in reachable


def code_blocks(text: str) -> list[str]:
    return [text[a:b] for a, b in code_spans(text)]


@SETTINGS
@given(document, fraction)
def test_prompt_properties(text: str, frac: float) -> None:
    before = count(text)
    target = max(1, int(before * frac))
    r = compress_prompt(text, target)
    assert r.prompt is not None
    assert r.tokens_before == before
    assert r.tokens_after == count(r.prompt)
    if r.fits:
        assert r.tokens_after <= target
    else:
        assert r.prompt == text
    assert is_unit_subsequence(text, r.prompt)
    for block_text in code_blocks(text):
        assert block_text in r.prompt
    final = text.rsplit("\n\n", 1)[-1]  # the trailing question, when short, stays whole
    if count(final) <= 200:
        assert r.prompt.endswith(final)
    again = compress_prompt(text, target, analyzer=Analyzer())
    assert again.prompt == r.prompt and again.tokens_after == r.tokens_after


chat = st.builds(
    lambda system, turns, last: [
        {"role": "system", "content": system},
        *[{"role": role, "content": text} for role, text in turns],
        {"role": "user", "content": last},
    ],
    paragraph,
    st.lists(
        st.tuples(st.sampled_from(["user", "assistant", "tool"]), document), min_size=1, max_size=6
    ),
    document,
)


@SETTINGS
@given(chat, fraction, st.booleans())
def test_chat_properties(messages: list[dict[str, Any]], frac: float, protect: bool) -> None:
    before = engine_tokens(messages=messages)
    target = max(1, int(before * frac))
    config = CompressorConfig(protect_last_user=protect)
    r = compress_chat(messages, target, config)
    assert r.messages is not None
    assert r.tokens_before == before
    assert r.tokens_after == engine_tokens(messages=r.messages)
    if r.fits:
        assert r.tokens_after <= target
    assert len(r.messages) == len(messages)
    assert r.messages[0] is messages[0]  # the system prompt
    last, new_last = messages[-1]["content"], r.messages[-1]["content"]
    if protect:
        assert r.messages[-1] is messages[-1]  # the last user message
    else:  # its trailing question: a short last paragraph stays whole, at the end
        final = last.rsplit("\n\n", 1)[-1]
        if count(final) <= 200:
            assert new_last.endswith(final)
    for old, new in zip(messages, r.messages, strict=True):
        assert old["role"] == new["role"]
        assert is_unit_subsequence(old["content"], new["content"])
        for block_text in code_blocks(old["content"]):
            assert block_text in new["content"]
    again = compress_chat(messages, target, config, analyzer=Analyzer())
    assert again.messages == r.messages
