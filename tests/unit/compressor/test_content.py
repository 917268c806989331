"""Content category (compressor/content.py): accuracy on the project's labelled set and
the rules on hand-made cases."""

from __future__ import annotations

import inspect
import textwrap
from collections import Counter

from compressor.content import classify, classify_chat, classify_text, is_code
from policies.types import Category
from tests.corpus import labelled_set


def test_accuracy_on_the_labelled_set() -> None:
    samples = labelled_set(per_class=12, seed=7, sizes=(300, 3000))
    right: Counter[Category] = Counter()
    total: Counter[Category] = Counter()
    for s in samples:
        total[s.label] += 1
        right[s.label] += classify(s.prompt, s.messages) == s.label
    overall = sum(right.values()) / sum(total.values())
    assert overall >= 0.9, (right, total)
    for label in total:
        assert right[label] / total[label] >= 0.75, (label, right, total)


def test_source_code_is_code_and_its_documentation_is_not() -> None:
    source = inspect.getsource(textwrap)
    assert is_code(source)
    assert classify_text(source) is Category.CODE
    assert classify_text(textwrap.dedent(textwrap.__doc__ or "").strip() * 20) is Category.PROSE


def test_fenced_code_dominating_a_message_is_code() -> None:
    body = "def f(x):\n    return x + 1\n" * 30
    assert (
        classify_chat([{"role": "user", "content": f"Fix this:\n```python\n{body}```"}])
        is Category.CODE
    )


def test_rag_needs_sources_and_a_question() -> None:
    passages = "\n\n".join(f"[{i}] Title {i}\nSome text about topic {i}. " * 3 for i in range(1, 5))
    assert classify_text(passages + "\n\nWhat does the context say about topic 2?") is Category.RAG
    assert classify_text(passages + "\n\nSummarise.") is Category.PROSE


def test_tool_results_make_a_chat_rag() -> None:
    messages = [
        {"role": "user", "content": "What is X?"},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": "Result text. " * 50},
    ]
    assert classify_chat(messages) is Category.RAG


def test_conversations_are_chat_and_single_turns_prose() -> None:
    turn = "This is a fairly ordinary sentence of conversation. " * 5
    assert (
        classify_chat(
            [
                {"role": "user", "content": turn},
                {"role": "assistant", "content": turn},
                {"role": "user", "content": "ok?"},
            ]
        )
        is Category.CHAT
    )
    assert (
        classify_chat(
            [{"role": "system", "content": "Be nice."}, {"role": "user", "content": turn}]
        )
        is Category.PROSE
    )
