"""Offline text corpora for the compressor/budget benchmarks and tests, built at run time.

Nothing is downloaded and nothing generated is committed: every text comes from what
ships with Python or with the project's own dependencies, read when a script runs:
- documentation prose: the Python reference manual (`pydoc_data.topics`, part of the
  standard library) and NumPy's docstrings (NumPy is a runtime dependency);
- code: the standard library's own `.py` sources, cut at top-level definitions.

From these, seeded builders make requests of four labelled kinds (prose, RAG = retrieved
passages plus a question, multi-turn chat, code), as completion prompts or chat messages,
at a target size in cl100k tokens. Labels are what the builder made, so they are exact;
the texts are documentation-flavoured, which the benchmarks' reports say.
"""

from __future__ import annotations

import os
import random
import re
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from compressor.compress import request_tokens
from compressor.counting import default_counter
from policies.types import Category


@dataclass(frozen=True)
class Source:
    title: str
    text: str


@dataclass
class Sample:
    """One request: a completion `prompt` or chat `messages`, its label and max_tokens."""

    label: Category
    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def tokens(self) -> int:
        """Prompt tokens as the engine counts them (template and BOS included)."""
        return request_tokens(self.prompt, self.messages)


def count(text: str) -> int:
    return default_counter().count(text)


# ---------------------------------------------------------------- sources


@lru_cache(maxsize=1)
def pydoc_sources() -> tuple[Source, ...]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a trimmed Python without pydoc_data: fall back to NumPy alone
        return ()
    out = []
    for key in sorted(topics):
        text = topics[key].strip()
        title = text.split("\n", 1)[0].strip() or key
        if len(text) > 1500:
            out.append(Source(title, text))
    return tuple(out)


@lru_cache(maxsize=1)
def numpy_sources() -> tuple[Source, ...]:
    import numpy as np

    seen: set[str] = set()
    out = []
    for modname in (
        "numpy",
        "numpy.linalg",
        "numpy.fft",
        "numpy.random",
        "numpy.ma",
        "numpy.polynomial",
    ):
        module = __import__(modname, fromlist=["_"])
        for name in sorted(dir(module)):
            doc = getattr(getattr(module, name, None), "__doc__", None)
            if isinstance(doc, str) and len(doc) > 1500 and doc not in seen:
                seen.add(doc)
                out.append(Source(f"{modname}.{name}", _dedent(doc)))
    del np
    return tuple(out)


def doc_sources() -> tuple[Source, ...]:
    return pydoc_sources() + numpy_sources()


def _dedent(doc: str) -> str:
    import inspect

    return inspect.cleandoc(doc)


_STDLIB_CODE = (
    "argparse.py",
    "ast.py",
    "calendar.py",
    "configparser.py",
    "csv.py",
    "dataclasses.py",
    "difflib.py",
    "enum.py",
    "fractions.py",
    "functools.py",
    "heapq.py",
    "inspect.py",
    "ipaddress.py",
    "logging/__init__.py",
    "pathlib.py",
    "pprint.py",
    "shlex.py",
    "shutil.py",
    "statistics.py",
    "string.py",
    "tarfile.py",
    "textwrap.py",
    "threading.py",
    "tokenize.py",
    "typing.py",
    "zipfile.py",
    "json/decoder.py",
    "json/encoder.py",
    "email/message.py",
    "http/client.py",
    "urllib/parse.py",
    "collections/__init__.py",
)


@lru_cache(maxsize=1)
def code_sources() -> tuple[Source, ...]:
    """Top-level blocks (def/class with their bodies) of a fixed list of stdlib modules."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for rel in _STDLIB_CODE:
        path = os.path.join(root, rel)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            src = f.read()
        blocks = re.split(r"\n(?=(?:def|class|async def) )", src)
        out.extend(Source(rel, block.strip("\n")) for block in blocks if len(block) > 400)
    return tuple(out)


def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


# ---------------------------------------------------------------- builders


def _fill(
    rng: random.Random, pool: Sequence[Source], target: int, sep: str = "\n\n"
) -> tuple[str, list[str]]:
    """Concatenate whole sources (then paragraphs of the last one) up to `target` tokens."""
    parts: list[str] = []
    titles: list[str] = []
    used = 0
    for src in rng.sample(list(pool), len(pool)):
        n = count(src.text)
        if used + n <= target:
            parts.append(src.text)
            titles.append(src.title)
            used += n + 1
        else:
            for para in paragraphs(src.text):
                m = count(para)
                if used + m > target:
                    break
                parts.append(para)
                used += m + 1
            if used > 0.9 * target:
                break
    return sep.join(parts), titles


_QUESTIONS = (
    "Based on the passages above, what does the documentation say about {t}?",
    "Using only the retrieved documents, explain {t} and give an example.",
    "Question: How does {t} work, according to the sources?",
    "Summarise what the context says about {t}, citing the passage numbers.",
)


def _question(rng: random.Random, title: str) -> str:
    return rng.choice(_QUESTIONS).format(t=title.lower().rstrip("*").strip())


def prose_prompt(rng: random.Random, target: int) -> Sample:
    body, titles = _fill(rng, doc_sources(), target - 40)
    lead = rng.choice(
        (
            "Read the following documentation carefully and then answer.\n\n",
            "Here is a long excerpt from a technical manual.\n\n",
            "",
        )
    )
    tail = rng.choice(
        (
            "\n\nWhat are the three most important points above?",
            "\n\nSummarise the text above in five bullet points.",
            "",
        )
    )
    return Sample(Category.PROSE, 256, prompt=lead + body + tail, meta={"titles": titles})


_HEADERS = (
    "[{i}] {t}\n",
    "Document {i} (source: {t}):\n",
    "### Passage {i}: {t}\n",
    '<document index="{i}" source="{t}">\n',
    "Source: {t}\n",
)
_FOOTERS = ("", "", "", "\n</document>", "\n---")


def _passages(rng: random.Random, target: int) -> tuple[list[str], str]:
    pool = list(doc_sources())
    chosen: list[str] = []
    title = ""
    used = 0
    style = rng.randrange(len(_HEADERS))
    while used < target and pool:
        src = pool.pop(rng.randrange(len(pool)))
        paras = paragraphs(src.text)
        start = rng.randrange(max(1, len(paras) - 3))
        text = "\n\n".join(paras[start : start + rng.randint(2, 8)])
        n = count(text)
        if used + n > target:
            if chosen:
                break
            continue
        i = len(chosen) + 1
        chosen.append(_HEADERS[style].format(i=i, t=src.title) + text + _FOOTERS[style])
        title = title or src.title
        used += n + 14
    return chosen, title


def rag_sample(rng: random.Random, target: int, as_chat: bool | None = None) -> Sample:
    chat = rng.random() < 0.5 if as_chat is None else as_chat
    passages, title = _passages(rng, target - 80)
    question = _question(rng, title)
    if not chat:
        lead = rng.choice(
            (
                "Answer the question using the retrieved context below. Cite passages by number.\n\nContext:\n\n",
                "Search results:\n\n",
                "You are given some documents. Use them to answer at the end.\n\n",
            )
        )
        prompt = lead + "\n\n".join(passages) + "\n\n" + question
        return Sample(Category.RAG, 512, prompt=prompt)
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are a helpful assistant. Answer from the search results; cite them.",
        },
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "\n\n".join(passages)},
    ]
    return Sample(Category.RAG, 512, messages=messages)


def chat_sample(rng: random.Random, target: int) -> Sample:
    pool = list(doc_sources())
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a patient Python and NumPy tutor."}
    ]
    used = 20
    while pool:
        src = pool.pop(rng.randrange(len(pool)))
        question = rng.choice(
            (
                "Can you explain {t}?",
                "What is {t} about?",
                "Tell me more about {t}, please.",
                "I don't get {t}. Help?",
            )
        ).format(t=src.title.lower())
        paras = paragraphs(src.text)
        answer = "\n\n".join(paras[: rng.randint(3, 12)])
        n = count(answer) + count(question) + 14
        if used + n > target - 30:
            if used > 0.85 * target:
                break
            continue
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
        used += n
    messages.append(
        {
            "role": "user",
            "content": "Thanks. Now compare the first and the last topic we discussed.",
        }
    )
    return Sample(Category.CHAT, 256, messages=messages)


def code_sample(rng: random.Random, target: int, as_chat: bool = False) -> Sample:
    body, _ = _fill(rng, code_sources(), target - 40)
    ask = rng.choice(
        (
            "Refactor the following code and explain the changes.\n\n",
            "Find the bug in this module:\n\n",
            "",
        )
    )
    if as_chat:
        return Sample(
            Category.CODE,
            512,
            messages=[{"role": "user", "content": ask + "```python\n" + body + "\n```"}],
        )
    return Sample(Category.CODE, 512, prompt=ask + body)


# ---------------------------------------------------------------- sets


def labelled_set(
    per_class: int = 50, seed: int = 0, sizes: tuple[int, int] = (300, 6000)
) -> list[Sample]:
    """`per_class` requests of each category at log-uniform sizes (tokens)."""
    rng = random.Random(seed)
    out: list[Sample] = []
    for i in range(per_class):
        for kind in ("prose", "rag", "chat", "code"):
            target = int(sizes[0] * (sizes[1] / sizes[0]) ** rng.random())
            if kind == "prose":
                out.append(prose_prompt(rng, target))
            elif kind == "rag":
                out.append(rag_sample(rng, target))
            elif kind == "chat":
                out.append(chat_sample(rng, target))
            else:
                out.append(code_sample(rng, target, as_chat=i % 3 == 0))
    return out


def borderline_set(
    n: int = 300, seed: int = 1, b_short: int = 8192, gamma: float = 1.5
) -> list[Sample]:
    """`n` requests with B_short < L_total ≤ γ·B_short (prompt as the engine counts it +
    max_tokens): a third prose, a third RAG (half chat with a tool message), a third chat."""
    rng = random.Random(seed)
    out: list[Sample] = []
    kinds = ("prose", "rag", "chat")
    while len(out) < n:
        kind = kinds[len(out) % 3]
        lo, hi = b_short + 1, int(gamma * b_short)
        total = rng.randint(lo + 200, hi - 200)
        if kind == "prose":
            s = prose_prompt(rng, total - 256)
        elif kind == "rag":
            s = rag_sample(rng, total - 512)
        else:
            s = chat_sample(rng, total - 256)
        l_total = s.tokens() + s.max_tokens
        if lo <= l_total <= hi:
            s.meta["l_total"] = l_total
            out.append(s)
    return out
