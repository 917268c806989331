"""Content category of a request: code, prose, RAG or chat — fast, no model.

The category keys the bytes-per-token estimate (policies/budget.py; code packs fewer
bytes into a token than prose) and gates compression (FleetOpt §5.2: extraction is safe
for prose and retrieved passages, not for code). It runs on every request, so it only
uses C-speed string operations (`str.count`, two literal-prefixed regular expressions)
on at most `_SAMPLE` characters from the head and tail of the content: ~20–40 µs.

Rules, in order:
1. **code** if the code score ≥ `CODE_THRESHOLD` (0.15), where per line
   score = (lines ending in `:` `;` `{` `}` `)` `,` + ` = ` + `()` + `return ` + `def `)
           − `>>> ` − ½·(`. ` + `, `),
   or if fenced code blocks hold more than half the characters. Documentation with
   examples has doctest prompts and sentences; source code has neither.
2. **rag** if the request carries retrieved material: a `tool` message with content, or
   ≥ 2 numbered source headers at line starts (`[1]`, `Document 2`, `Passage 3:`,
   `<document …>`), or a context/sources label (`Context:`, `Sources:`, `Search
   results:`, `Retrieved …`) — and, for a plain prompt, a question in its last 600
   characters.
3. **chat** if the messages hold a conversation: an assistant turn or ≥ 2 user turns.
4. **prose** otherwise.

Accuracy is measured on the labelled set built by bench/corpus.py (see
bench/compressor_fidelity.py's category table and tests/unit/compressor/test_content.py).
Failure posture: a wrong category only changes the bytes/token prior (the EMA then
learns it per category) or forgoes/permits compression; compression itself still
never cuts a fenced code block and never exceeds its budget.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from compressor.fences import code_spans
from compressor.template import content_text
from policies.types import Category

CODE_THRESHOLD = 0.15
_SAMPLE = 4_000  # characters from each end of long content: enough for a stable ratio

_CODE_TOKENS = (" = ", "()", "return ", "def ")  # assignments, calls, definitions
_CODE_ENDINGS = re.compile(r"[:;{}),]\n")  # lines that end a statement or open a block
_DOCTEST = ">>> "  # documentation shows code after a prompt; source code never does
_SENTENCE = (". ", ", ")  # sentences and clauses: documentation and conversation
_SOURCE_HEADER = re.compile(
    r"\n[^\S\n]*(?:\[\d{1,3}\]|<(?:document|doc|source|passage)\b|"
    r"(?:\#+\s*)?(?:document|doc|passage|source|chunk|result|excerpt|snippet)\s*\#?\s*\d{1,3}\b)",
    re.IGNORECASE,
)
_CONTEXT_LABEL = re.compile(
    r"\n?[^\S\n]*(?:context|sources|search results|retrieved (?:documents|passages|context)|"
    r"documents|references)\s*:",
    re.IGNORECASE,
)


def _sample(text: str) -> str:
    if len(text) <= 2 * _SAMPLE:
        return text
    return text[:_SAMPLE] + "\n" + text[-_SAMPLE:]


def code_score(text: str) -> float:
    """Per-line code evidence minus documentation evidence (see the module docstring)."""
    s = _sample(text)
    lines = s.count("\n") + 1
    code = len(_CODE_ENDINGS.findall(s)) + sum(s.count(k) for k in _CODE_TOKENS)
    prose = sum(s.count(k) for k in _SENTENCE)
    return (code - s.count(_DOCTEST) - 0.5 * prose) / lines


def _fenced_share(text: str) -> float:
    if "```" not in text and "~~~" not in text:
        return 0.0
    return sum(b - a for a, b in code_spans(text)) / max(len(text), 1)


def is_code(text: str) -> bool:
    return code_score(text) >= CODE_THRESHOLD or _fenced_share(text) > 0.5


def _rag_markers(text: str) -> bool:
    s = "\n" + _sample(text)
    if len(_SOURCE_HEADER.findall(s)) >= 2:
        return True
    return _CONTEXT_LABEL.search(s) is not None


def classify_text(text: str) -> Category:
    """Category of a completion prompt (or of one message's text)."""
    if is_code(text):
        return Category.CODE
    if _rag_markers(text) and "?" in text[-600:]:
        return Category.RAG
    return Category.PROSE


def classify_chat(messages: Sequence[Mapping[str, Any]]) -> Category:
    """Category of a chat request (see the module docstring for the rules)."""
    texts = [content_text(m.get("content")) for m in messages]
    roles = [str(m.get("role", "")) for m in messages]
    joined = "\n".join(texts)
    if is_code(joined):
        return Category.CODE
    if any(r == "tool" and t for r, t in zip(roles, texts, strict=True)):
        return Category.RAG
    if any(
        _rag_markers(t)
        for r, t in zip(roles, texts, strict=True)
        if r != "assistant" and len(t) > 1000
    ):
        return Category.RAG
    if "assistant" in roles or roles.count("user") >= 2:
        return Category.CHAT
    return Category.PROSE


def classify(
    prompt: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None
) -> Category:
    """Category of a request given as a completion `prompt` or chat `messages`."""
    if messages is not None:
        return classify_chat(messages)
    return classify_text(prompt or "")
