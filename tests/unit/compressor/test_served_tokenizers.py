"""Eq. 15 for a served model that is not cl100k: Qwen3 and Llama-3 (tests/served_models.py).

The oracle (`oracle_tokens`) is written here, not imported: it renders the model's shipped
chat template with jinja2 under transformers' settings and encodes the whole prompt in
one call of the `tokenizers` package. The compressor counts differently — per unit,
from memoised chunk counts (compressor/counting.py, exact.py) and a template overhead
obtained by subtraction — so agreement checks its counting against the real tokenizer,
not against itself.
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from compressor.compress import fit_request
from compressor.counting import TokenCounter
from compressor.hf_template import HFTemplate
from compressor.tokenizer import HFTokenizer
from tests.corpus import borderline_set
from tests.served_models import llama31_dir, qwen3_dir

B_SHORT = 8192


@cache
def _llama_dir() -> Path:
    import tempfile

    return llama31_dir(Path(tempfile.mkdtemp(prefix="fleetgate-llama")))


def _folder(name: str) -> Path:
    return qwen3_dir() if name == "qwen3" else _llama_dir()


@cache
def served(name: str) -> HFTemplate:
    return HFTemplate(_folder(name))


@cache
def _oracle(name: str) -> tuple[Any, Tokenizer, dict[str, str]]:
    folder = _folder(name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    source = config.get("chat_template") or (folder / "chat_template.jinja").read_text()
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    specials = {k: config[k] for k in ("bos_token", "eos_token") if isinstance(config.get(k), str)}
    return env.from_string(source), Tokenizer.from_file(str(folder / "tokenizer.json")), specials


def oracle_tokens(name: str, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> int:
    template, tok, specials = _oracle(name)
    msgs = []
    for m in messages:
        m = {**m, "content": m.get("content") or ""}
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in m["tool_calls"]
            ]
        msgs.append(m)
    text = template.render(messages=msgs, tools=tools, add_generation_prompt=True, **specials)
    return len(tok.encode(text, add_special_tokens=False).ids)


MODELS = ("qwen3", "llama3")


@pytest.fixture(scope="module")
def corpus() -> list[Any]:
    return [s for s in borderline_set(n=45, seed=3) if s.messages is not None]


@pytest.mark.parametrize("name", MODELS)
def test_counter_is_exact_for_the_real_tokenizer(name: str, corpus: list[Any]) -> None:
    """The memoised chunk counts (a cl100k-style pre-tokenizer's safe cuts) hold for the
    model's own pre-tokenizer: every message text counts as one encode call says."""
    tok = Tokenizer.from_file(str(_folder(name) / "tokenizer.json"))
    counter = TokenCounter(HFTokenizer(_folder(name) / "tokenizer.json"))
    texts = [m["content"] for s in corpus[:10] for m in s.messages if isinstance(m["content"], str)]
    texts += ["  indented\n\n\tx  y 123456 é ́ x", "a  b\n c\r\n d", "日本語のテキスト、です。 ok"]
    for t in texts:
        assert counter.count(t) == len(tok.encode(t, add_special_tokens=False).ids)


@pytest.mark.parametrize("name", MODELS)
def test_every_compressed_request_fits_in_the_served_models_tokens(
    name: str, corpus: list[Any]
) -> None:
    template = served(name)
    compressed = 0
    for s in corpus:
        target = B_SHORT - s.max_tokens
        before = oracle_tokens(name, s.messages)
        result = fit_request(target, messages=s.messages, template=template)
        assert result.tokens_before == before
        if result.fits:
            assert oracle_tokens(name, result.messages) == result.tokens_after <= target
            compressed += result.changed
    assert compressed >= len(corpus) // 2


def test_cl100k_counting_overflows_a_qwen_engine(corpus: list[Any]) -> None:
    """Why the setting exists: compressed for cl100k, most requests exceed B_short on Qwen."""
    over = 0
    fitted = 0
    for s in corpus:
        target = B_SHORT - s.max_tokens
        result = fit_request(target, messages=s.messages)
        if result.fits and result.changed:
            fitted += 1
            over += oracle_tokens("qwen3", result.messages) > target
    assert fitted and over / fitted > 0.5


def _agent_request() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    s = borderline_set(n=3, seed=5)[1]  # a RAG request
    docs = (
        "\n\n".join(m["content"] for m in (s.messages or []) if m["role"] != "system")
        if s.messages
        else s.prompt
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"search_{k}",
                "description": f"Search the {k} index for passages that answer a question.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
                    "required": ["query"],
                },
            },
        }
        for k in ("docs", "code", "tickets", "wiki")
    ]
    call = {"id": "c1", "type": "function",
            "function": {"name": "search_docs", "arguments": json.dumps({"query": "licence terms", "top_k": 8})}}  # fmt: skip
    messages = [
        {"role": "system", "content": "You are a careful assistant. Use the tools when needed."},
        {"role": "user", "content": "What do the licence terms say about redistribution?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": docs},
        {"role": "user", "content": "Summarise the answer in three sentences."},
    ]
    return messages, tools


@pytest.mark.parametrize("name", MODELS)
def test_tools_and_tool_calls_are_counted_within_one_percent(name: str) -> None:
    messages, tools = _agent_request()
    template = served(name)
    engine = oracle_tokens(name, messages, tools)
    without_tools = oracle_tokens(name, messages)
    assert engine - without_tools > 200  # the schemas are a real part of the prompt
    result = fit_request(engine - 600, messages=messages, template=template, tools=tools)
    assert abs(result.tokens_before - engine) <= 0.01 * engine
    assert result.fits and result.changed
    after = oracle_tokens(name, result.messages, tools)
    assert abs(result.tokens_after - after) <= 0.01 * after
    assert after <= engine - 600


# --- the quick count (piece by piece) and when a full encode settles it ------------------


@pytest.mark.parametrize("name", MODELS)
def test_quick_count_equals_the_engines_on_the_corpus(name: str, corpus: list[Any]) -> None:
    """The quick count (added tokens, template pieces, memoised contents) is the engine's,
    for every request and its compressed form, tools included (bench: error 0)."""
    template = served(name)
    assert template.piecewise and template.margin > 0
    messages, tools = _agent_request()
    assert template.quick_chat_tokens(messages, tools) == oracle_tokens(name, messages, tools)
    for s in corpus:
        result = fit_request(B_SHORT - s.max_tokens, messages=s.messages, template=template)
        for m in (s.messages, result.messages):
            assert template.quick_chat_tokens(m) == oracle_tokens(name, m)


class _OffBy(HFTemplate):
    """A template whose quick counts are off by `error` (|error| ≤ margin): what the
    margin is for. Full counts (`chat_tokens`) stay exact; the calls are recorded."""

    def __init__(self, folder: Path, error: int) -> None:
        self.error = self.full = 0  # exact while the load-time test runs
        super().__init__(folder)
        self.error = error
        self.full = 0

    def quick_chat_tokens(self, messages: Any, tools: Any = ()) -> int:
        return super().quick_chat_tokens(messages, tools) + self.error

    def fixed_tokens(self, messages: Any, tools: Any = (), texts: Any = None) -> int:
        return super().fixed_tokens(messages, tools, texts) + self.error

    def chat_tokens(self, messages: Any, tools: Any = ()) -> int:
        self.full += 1
        return super().chat_tokens(messages, tools)


@pytest.mark.parametrize("error", [-8, -3, 3, 8])
def test_a_quick_count_off_within_the_margin_never_overflows(error: int, corpus: list[Any]) -> None:
    template = _OffBy(qwen3_dir(), error)
    assert template.margin >= abs(error)
    for s in corpus[:12]:
        target = B_SHORT - s.max_tokens
        result = fit_request(target, messages=s.messages, template=template)
        if result.fits:
            assert oracle_tokens("qwen3", result.messages) <= target


def test_only_a_count_near_the_target_is_settled_with_a_full_encode(corpus: list[Any]) -> None:
    template = _OffBy(qwen3_dir(), 0)
    s = corpus[0]
    engine = oracle_tokens("qwen3", s.messages)
    for target, full in ((engine + 100, 0), (engine - 100, 0), (engine, 1), (engine - 8, 1)):
        template.full = 0
        result = fit_request(target, messages=s.messages, template=template, may_compress=False)
        assert result.tokens_before == engine
        assert result.fits == (engine <= target)
        assert template.full == full, target - engine


def test_a_tokenizer_whose_added_tokens_match_by_context_counts_in_full(tmp_path: Path) -> None:
    """An added token with `lstrip` eats the spaces before it: cutting the text at added
    tokens would miscount, so every count is a full encode (margin 0)."""
    source = qwen3_dir()
    spec = json.loads((source / "tokenizer.json").read_text())
    for token in spec["added_tokens"]:
        if token["content"] == "<|im_end|>":
            token["lstrip"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    shutil.copy(source / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    template = HFTemplate(tmp_path)
    assert not template.piecewise and template.margin == 0
    messages = [{"role": "user", "content": "spaces before the end   "}]
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    engine = len(tok.encode(template.render(messages), add_special_tokens=False).ids)
    assert template.quick_chat_tokens(messages) == template.chat_tokens(messages) == engine


_PIECES = [*"abc XYZ  \n\n\t\r.,;:!?'\"-_()[]{}<>/\\0123456789"]
_PIECES += ["é", "e\u0301", "日本", "🙂", " 's", "'ll", "\u00a0", "\u3000", "\x1c", "\x85"]
_PIECES += ["\u200b", "\u2028", "\x0b", "<think>", "<|im_start|>", "<|eot_id|>", "```", "  \n"]


@pytest.mark.parametrize("name", MODELS)
def test_quick_count_on_random_chats(name: str) -> None:
    """Seeded random contents of whitespace runs, odd Unicode spaces, combining marks and
    added tokens: the quick count is the engine's (what the margin only backs up)."""
    import random

    rng = random.Random(5)
    template = served(name)
    for _ in range(300):
        roles = ["system", "user", "assistant", "user"][: rng.randint(1, 4)]
        messages = [
            {"role": r, "content": "".join(rng.choices(_PIECES, k=rng.randint(0, 60)))}
            for r in roles
        ]
        assert template.quick_chat_tokens(messages) == oracle_tokens(name, messages), messages
