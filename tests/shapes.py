"""Borderline requests in the shapes users send (issue 13), from real offline text.

Every builder makes one request whose L_total = prompt tokens (as the engine counts them,
template included) + max_tokens lies in the borderline band (B_short, γ·B_short], and
records in `meta` its `shape` and the `question`: the exact trailing text of the last
user message (or of the completion prompt) that a compressor must keep verbatim. Shapes:

| shape        | request                                                              |
|--------------|----------------------------------------------------------------------|
| doc_question | one user message: (instruction) + a pasted document + the question   |
| system_doc   | a system prompt + that user message                                  |
| rag_user     | retrieved passages [1] … [n] inside the user message + the question  |
| log          | a pasted log (syslog, Python logging, key=value) + the question      |
| json         | pasted JSON (package metadata as an API prints it) + the question    |
| tool         | the question, an assistant tool call, the retrieved text as `tool`   |
| completion   | a `/v1/completions` prompt: document + question (+ "Answer:")        |
| multi_turn   | a chat with a long history and a short last question                 |
| code         | Python source (fenced or not) + a question about it                  |

Documents are licences, man pages, package READMEs and the Python/NumPy reference
(tests/realtext.py); questions are written for the shape, sometimes several sentences,
sometimes followed by 2–3 polite sentences (in the same paragraph or the next).

Lengths (`shape_set(lengths=...)`, tests/band_lengths.py): by default each request's L_total
is drawn from the LMSYS-Chat-1M CDF restricted to the band (FleetOpt Table 7's source) and
its max_tokens from the Azure 2023 trace's measured output lengths; `uniform` is the corpus
before (L_total uniform in the band, max_tokens 256/512/512/1024), `azure` the Azure trace.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from policies.types import Category
from tests import realtext
from tests.band_lengths import BandLengths, band_lengths
from tests.corpus import Sample, Source, code_sources, count, paragraphs

SHAPES = (
    "doc_question",
    "system_doc",
    "rag_user",
    "log",
    "json",
    "tool",
    "completion",
    "multi_turn",
    "code",
)
PROSE_SHAPES = ("doc_question", "system_doc", "rag_user", "tool", "completion", "multi_turn")
# issue 24: documents that pack few bytes into a token under one tokenizer and many under
# another (Chinese and Japanese man pages, /usr/share/man/{zh_CN,ja}); not in SHAPES, so
# the corpus of the issues before stays as it was: pass shapes=SHAPES + CJK_SHAPES
CJK_SHAPES = ("doc_zh", "doc_ja")

_POLITE = (
    "Thanks in advance!",
    "Thank you so much for your help.",
    "Please keep the answer short.",
    "I really appreciate it.",
    "Sorry if this is a basic question.",
    "Bullet points would be great.",
    "This is for a report I have to hand in tomorrow, so accuracy matters.",
    "No need to repeat the text back to me.",
)
_DOC_QUESTIONS = (
    "What are the key points of {t}?",
    "Can you summarise {t} in five bullet points?",
    "According to {t}, what am I allowed to do and what am I not allowed to do?",
    "What does {t} say about configuration, and which options matter most?",
    "I need to explain {t} to a colleague who has no background in this. "
    "What are the three things they must know? Please give a one-line example for each.",
    "Is there anything in {t} that would surprise a new user? If so, quote the relevant sentence.",
    "Which parts of {t} are outdated or unclear, in your opinion?",
    "Based on the text above, how do I get started with {t}?",
)
_LEADS = (
    "",
    "Please read the following document carefully.\n\n",
    "Here is {t}:\n\n",
    "I pasted {t} below.\n\n",
    "Document:\n\n",
)
_BOUNDS = (("", ""), ('"""\n', '\n"""'), ("<document>\n", "\n</document>"), ("", "\n\n---"))
_SYSTEMS = (
    "You are a careful technical assistant. Answer only from the material the user provides, "
    "and say so when the answer is not in it.",
    "You are a helpful assistant for a software company's support team. Be concise and precise. "
    "Cite the relevant section when you can.",
    "You are an expert in open-source licensing and Linux administration. Answer in English, "
    "use short paragraphs, and never invent options or clauses that are not in the text.",
)
_RAG_QUESTIONS = (
    "Using only the passages above, explain {t}. Cite passage numbers.",
    "Which of the passages answer the question of how {t} works? Give the numbers and a short answer.",
    "Question: What do the sources say about {t}?",
    "Answer from the retrieved context: what are the caveats of {t}? "
    "If the passages disagree, say which ones.",
)
_LOG_QUESTIONS = (
    "These are the logs from last night's incident. What went wrong first, and what was a consequence of it?",
    "Why does the service keep logging errors here? Which component should I look at?",
    "Can you group these log messages by cause and tell me which ones are harmless?",
    "What happened around the first ERROR line? "
    "I suspect a TLS problem but I'm not sure. Is there evidence for or against it?",
)
_JSON_QUESTIONS = (
    "Which of these packages require Python 3.9 or later, and which have no dependencies at all?",
    "List the licences used in this JSON and how many packages use each one.",
    "Which packages are marked as production/stable? Give their names and versions.",
    "From this API response, which projects link to a documentation URL? "
    "Please format the answer as a table.",
)
_TOOL_QUESTIONS = (
    "How do I configure {t}?",
    "What does {t} say about licensing and redistribution?",
    "I'm evaluating {t} for a project. What are its main features and limitations?",
    "What is the difference between the options described in {t}?",
)
_CHAT_TURNS = (
    "Can you explain {t}?",
    "What is {t} about?",
    "Tell me more about {t}, please.",
    "I don't get {t}. Could you walk me through it?",
    "Here is {t}; what should I know about it?",
)
_CHAT_LAST = (
    "Thanks. Now compare the first and the last topic we discussed.",
    "OK, that helps. Which of these would you recommend for a small team, and why?",
    "Great. Can you write a short summary of everything we covered so far?",
    "One more question: what did you say earlier about the defaults? I lost track.",
)
_CODE_QUESTIONS = (
    "Find the bug in this module.",
    "Refactor the code above and explain the changes.",
    "What does this code do? Explain it function by function.",
    "Write unit tests for the functions above.",
)


_FENCE_LINE = re.compile(r"^[^\S\n]*(?:```|~~~)", re.MULTILINE)


def _unbalanced(text: str) -> bool:
    """A slice of paragraphs that cuts a fenced block in two (chunkers keep them whole)."""
    return len(_FENCE_LINE.findall(text)) % 2 == 1


def _title(src: Source) -> str:
    return src.title.strip().rstrip("*").strip()


def _question(rng: random.Random, templates: Sequence[str], title: str) -> str:
    """A question, sometimes followed by 2–3 polite sentences (same or next paragraph)."""
    q = rng.choice(templates).format(t=title)
    if rng.random() < 0.5:
        polite = " ".join(rng.sample(_POLITE, rng.randint(2, 3)))
        q += (" " if rng.random() < 0.5 else "\n\n") + polite
    return q


def _fill(rng: random.Random, pool: Sequence[Source], target: int, sep: str) -> tuple[str, str]:
    """Whole sources, then paragraphs of one more, up to `target` tokens; the first title."""
    parts: list[str] = []
    title = ""
    used = 0
    for src in rng.sample(list(pool), len(pool)):
        n = count(src.text)
        title = title or _title(src)
        if used + n <= target:
            parts.append(src.text)
            used += n + 2
            continue
        for para in paragraphs(src.text):
            m = count(para)
            if used + m > target:
                break
            parts.append(para)
            used += m + 1
        while parts and _unbalanced("\n\n".join(parts)):
            parts.pop()  # the last source was cut inside a fenced block
        if used > 0.95 * target:
            break
    return sep.join(parts), title


def _pool(rng: random.Random) -> tuple[Source, ...]:
    """One kind of document per request (licences, man pages, READMEs, the reference)."""
    pools = [
        p
        for p in (
            realtext.licence_sources(),
            realtext.man_sources(),
            realtext.readme_sources(),
            realtext.doc_sources(),
        )
        if p
    ]
    return rng.choice(pools)


def _document_message(rng: random.Random, target: int) -> tuple[str, str]:
    """(user message text, its trailing question): lead + bounded document + question."""
    doc, title = _fill(rng, _pool(rng), target - 120, "\n\n")
    question = _question(rng, _DOC_QUESTIONS, title)
    lead = rng.choice(_LEADS).format(t=title)
    opening, closing = rng.choice(_BOUNDS)
    return lead + opening + doc + closing + "\n\n" + question, question


def doc_question(rng: random.Random, target: int) -> Sample:
    text, q = _document_message(rng, target)
    return Sample(
        Category.PROSE, _max_tokens(rng), messages=[{"role": "user", "content": text}],
        meta={"question": q},
    )  # fmt: skip


def system_doc(rng: random.Random, target: int) -> Sample:
    system = rng.choice(_SYSTEMS)
    text, q = _document_message(rng, target - count(system) - 8)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return Sample(Category.PROSE, _max_tokens(rng), messages=messages, meta={"question": q})


_RAG_HEADERS = ("[{i}] {t}\n", "Passage [{i}] ({t}):\n", "[{i}] Source: {t}\n")


def _passages(rng: random.Random, target: int) -> tuple[str, str]:
    pool = list(realtext.prose_sources())
    style = rng.choice(_RAG_HEADERS)
    chosen: list[str] = []
    title = ""
    used = 0
    while used < target and pool:
        src = pool.pop(rng.randrange(len(pool)))
        paras = paragraphs(src.text)
        start = rng.randrange(max(1, len(paras) - 4))
        text = "\n\n".join(paras[start : start + rng.randint(2, 6)])
        if _unbalanced(text):
            continue
        n = count(text) + 12
        if used + n > target:
            if used > 0.9 * target:
                break
            continue
        chosen.append(style.format(i=len(chosen) + 1, t=_title(src)) + text)
        title = title or _title(src)
        used += n
    return "\n\n".join(chosen), title


def rag_user(rng: random.Random, target: int) -> Sample:
    body, title = _passages(rng, target - 120)
    q = _question(rng, _RAG_QUESTIONS, title)
    lead = rng.choice(("", "Context:\n\n", "Search results:\n\n", "Retrieved documents:\n\n"))
    text = lead + body + "\n\n" + q
    return Sample(
        Category.RAG, _max_tokens(rng), messages=[{"role": "user", "content": text}],
        meta={"question": q},
    )  # fmt: skip


def log(rng: random.Random, target: int) -> Sample:
    style = rng.randrange(3)
    text = realtext.log_text(rng, 40, style)
    per_line = count(text) / 40
    lines = max(40, int((target - 120) / per_line))
    body = realtext.log_text(rng, lines, style)
    while count(body) > target - 120:
        lines = int(lines * 0.97)
        body = realtext.log_text(rng, lines, style)
    q = _question(rng, _LOG_QUESTIONS, "")
    lead = rng.choice(("", "Here are the logs:\n\n", "Log excerpt from the api-gw cluster:\n\n"))
    text = lead + body + "\n\n" + q
    return Sample(
        Category.PROSE, _max_tokens(rng), messages=[{"role": "user", "content": text}],
        meta={"question": q},
    )  # fmt: skip


def json_paste(rng: random.Random, target: int) -> Sample:
    records = list(realtext.package_records())
    rng.shuffle(records)
    style = rng.randrange(3)
    chosen: list[dict[str, Any]] = []
    for r in records:
        if count(realtext.json_document(rng, [*chosen, r], style)) > target - 120:
            break
        chosen.append(r)
    body = realtext.json_document(rng, chosen, style)
    q = _question(rng, _JSON_QUESTIONS, "")
    lead = rng.choice(("", "Here is the JSON I got back from our package index:\n\n"))
    text = lead + body + "\n\n" + q
    return Sample(
        Category.PROSE, _max_tokens(rng), messages=[{"role": "user", "content": text}],
        meta={"question": q},
    )  # fmt: skip


def tool(rng: random.Random, target: int) -> Sample:
    body, title = _passages(rng, target - 160)
    q = _question(rng, _TOOL_QUESTIONS, title)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": rng.choice(_SYSTEMS)},
        {"role": "user", "content": q},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "search_docs", "arguments": '{"query": "' + title + '"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": body},
    ]
    return Sample(Category.RAG, _max_tokens(rng), messages=messages, meta={"question": q})


def completion(rng: random.Random, target: int) -> Sample:
    doc, title = _fill(rng, _pool(rng), target - 120, "\n\n")
    q = _question(rng, _DOC_QUESTIONS, title)
    if rng.random() < 0.4:
        q = "Question: " + q + "\nAnswer:"
    lead = rng.choice(_LEADS).format(t=title)
    return Sample(
        Category.PROSE, _max_tokens(rng), prompt=lead + doc + "\n\n" + q, meta={"question": q}
    )


def multi_turn(rng: random.Random, target: int) -> Sample:
    pool = list(realtext.prose_sources())
    messages: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(_SYSTEMS)}]
    used = 60
    while pool:
        src = pool.pop(rng.randrange(len(pool)))
        ask = rng.choice(_CHAT_TURNS).format(t=_title(src))
        paras = paragraphs(src.text)
        start = rng.randrange(max(1, len(paras) - 6))
        answer = "\n\n".join(paras[start : start + rng.randint(3, 10)])
        if _unbalanced(answer):
            continue
        n = count(answer) + count(ask) + 12
        if used + n > target - 60:
            if used > 0.9 * target:
                break
            continue
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
        used += n
    q = _question(rng, _CHAT_LAST, "")
    messages.append({"role": "user", "content": q})
    return Sample(Category.CHAT, _max_tokens(rng), messages=messages, meta={"question": q})


def code(rng: random.Random, target: int) -> Sample:
    body, _ = _fill(rng, code_sources(), target - 100, "\n\n\n")
    q = _question(rng, _CODE_QUESTIONS, "")
    if rng.random() < 0.5:
        body = "```python\n" + body + "\n```"
    text = body + "\n\n" + q
    return Sample(
        Category.CODE, _max_tokens(rng), messages=[{"role": "user", "content": text}],
        meta={"question": q},
    )  # fmt: skip


_CJK_QUESTIONS = {
    "zh_CN": (
        "请用五个要点总结上面的文档。",
        "根据上面的手册页，这个命令最重要的选项是什么？请举例说明。",
        "上面的文档中有哪些容易让新用户困惑的地方？",
    ),
    "ja": (
        "上の文書の要点を五つの箇条書きでまとめてください。",
        "このマニュアルによると、最も重要なオプションは何ですか？例を挙げて説明してください。",
        "上の文書で初心者が戸惑いそうな点はどこですか？",
    ),
}


def _cjk_document(lang: str) -> Callable[[random.Random, int], Sample]:
    def build(rng: random.Random, target: int) -> Sample:
        pool = realtext.cjk_sources(lang) or realtext.cjk_sources("zh_TW")
        doc, _ = _fill(rng, pool, target - 120, "\n\n")
        q = rng.choice(_CJK_QUESTIONS[lang])
        text = doc + "\n\n" + q
        return Sample(
            Category.PROSE, _max_tokens(rng), messages=[{"role": "user", "content": text}],
            meta={"question": q},
        )  # fmt: skip

    return build


def _max_tokens(rng: random.Random) -> int:
    return rng.choice((256, 512, 512, 1024))


BUILDERS: dict[str, Callable[[random.Random, int], Sample]] = {
    "doc_question": doc_question,
    "system_doc": system_doc,
    "rag_user": rag_user,
    "log": log,
    "json": json_paste,
    "tool": tool,
    "completion": completion,
    "multi_turn": multi_turn,
    "code": code,
    "doc_zh": _cjk_document("zh_CN"),
    "doc_ja": _cjk_document("ja"),
}


def shape_set(
    per_shape: int = 45,
    seed: int = 13,
    b_short: int = 8192,
    gamma: float = 1.5,
    shapes: Sequence[str] = SHAPES,
    lengths: str = "lmsys",
    max_tokens: str | None = None,
) -> list[Sample]:
    """`per_shape` borderline requests of each shape (B_short < L_total ≤ γ·B_short),
    interleaved. `lengths` (tests/band_lengths.py): `uniform` draws L_total uniformly and
    redraws a build that lands outside the band (the corpus before); `lmsys` / `azure` draw
    L_total and max_tokens from that workload's CDF restricted to the band, then rebuild
    until the request's real L_total is within `_TOLERANCE` tokens of the drawn one (the
    builders undershoot by 100–1,000 tokens), so the corpus follows the CDF. `max_tokens`
    overrides the mode's max_tokens source (`mix`, `azure-output`, `split`)."""
    rng = random.Random(seed)
    lo, hi = b_short + 1, int(gamma * b_short)
    model = band_lengths(lengths, b_short, gamma, max_tokens)
    out: list[Sample] = []
    for _ in range(per_shape):
        for shape in shapes:
            if model.band is None and model.max_tokens_source == "mix":
                s = _uniform_build(rng, shape, lo, hi)
            else:
                s = _cdf_build(rng, shape, model)
            if s is not None:
                out.append(s)
    return out


def _uniform_build(rng: random.Random, shape: str, lo: int, hi: int) -> Sample | None:
    """The corpus before --lengths: target uniform in [lo+150, hi−150], redraw if outside."""
    for _attempt in range(20):
        max_tokens = _max_tokens(rng)
        total = rng.randint(lo + 150, hi - 150)
        s = BUILDERS[shape](rng, total - max_tokens)
        s.max_tokens = max_tokens
        l_total = s.tokens() + max_tokens
        if lo <= l_total <= hi:
            s.meta.update(shape=shape, l_total=l_total, l_target=total)
            return s
    return None


_TOLERANCE = 64  # tokens between the drawn L_total and the built request's


def _cdf_build(rng: random.Random, shape: str, model: BandLengths) -> Sample | None:
    """One request whose L_total is the drawn one within `_TOLERANCE` (else the closest
    in-band build after 8 corrections; a new draw if none was in the band)."""
    for _draw in range(5):
        total = model.draw_total(rng)
        max_tokens = model.draw_max_tokens(rng, total)
        best: Sample | None = None
        aim = total - max_tokens
        for _attempt in range(8):
            s = BUILDERS[shape](rng, aim)
            s.max_tokens = max_tokens
            l_total = s.tokens() + max_tokens
            if model.lo < l_total <= model.hi and (
                best is None or abs(l_total - total) < abs(best.meta["l_total"] - total)
            ):
                s.meta.update(shape=shape, l_total=l_total, l_target=total)
                best = s
            if best is not None and abs(best.meta["l_total"] - total) <= _TOLERANCE:
                break
            aim += (total - l_total) if l_total > total else (total - l_total) + _TOLERANCE // 2
        if best is not None:
            return best
    return None
