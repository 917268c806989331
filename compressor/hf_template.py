"""A served model's own tokenizer and chat template: `tokenizer.json` + its Jinja template.

A folder as Hugging Face ships a model's tokenizer: `tokenizer.json` (read by the Rust
`tokenizers` package, compressor/tokenizer.py) and `tokenizer_config.json`, whose
`chat_template` (or a `chat_template.jinja` file beside it) is the Jinja program that
turns messages into the prompt text. vLLM and SGLang render it with transformers'
settings, reproduced here (transformers' `_compile_jinja_template`): a sandboxed
immutable environment with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, a `tojson` filter that is `json.dumps(ensure_ascii=False)`, the
`raise_exception` and `strftime_now` globals, the tokenizer's special tokens
(`bos_token`, `eos_token`, …) as variables, `add_generation_prompt=True` and the
request's `tools`. The rendered text is encoded without adding special tokens: the
template spells them and the tokenizer recognises them in the text.

Messages are passed as the engines pass them (vLLM's chat parsing): a list of text parts
becomes its texts joined by "\\n", a null content "", and a tool call's `arguments`
string is parsed into the object templates expect.

Counting fast (`count_text`, `quick_chat_tokens`): a full encode of a 40 KB prompt costs
~20 ms in `tokenizers`, ten times the whole compression with cl100k. The engine's
tokenizer cuts the rendered text at its added tokens (`<|im_start|>`, `<|eot_id|>`, …)
before anything else, so the count is the number of added tokens in the text plus the
counts of the pieces between them, each encoded on its own; those pieces are counted
with the memoised per-chunk counter (compressor/counting.py), exact for the ByteLevel
pre-tokenizers with a cl100k-style split (Llama-3, Qwen2/2.5/3, GPT-4o-style). The
message contents are cut out of the rendered text at safe cuts (`_skeleton_tokens`), so
the template's own tokens (`fixed_tokens`) cost a render and a count of its short pieces,
and the compressor, which counts the contents anyway, never counts them twice: warm, a
borderline chat costs 1.5× what it costs with cl100k (bench/served_tokenizers.py).
Whether that holds for a given tokenizer is tested when it is loaded: the tokenizer's
added tokens must match plainly (no `lstrip`/`rstrip`/`single_word`), and the quick
count must equal a full encode on probe texts (whitespace runs, digits, accents,
combining marks, CJK, added tokens inside content, the template itself). A tokenizer
that fails (e.g. SentencePiece's Metaspace layouts, where a text's first word is spelled
differently) gets `piecewise` false and every count is a full encode, as before.

`margin` is the quick count's error bound as callers use it: the quick count is trusted
when it is more than `margin` tokens from the target, and a full encode settles anything
closer (compressor/compress.py). Measured on the borderline corpus (bench/
served_tokenizers.py: every original and compressed chat under Qwen3 and Llama-3.1) the
quick count's error is 0; the default margin of 8 tokens is a safety allowance for
text the corpus does not have, costing a compressed request 8 tokens of its T_c.

Counting per message (what the compressor needs): each message's content is counted on
its own and `fixed` = quick total − Σ contents; that sum is the count of the request as
given. After the compressor edits contents the template's joins may count differently (a
content glued to the text around it, a template that strips or rewrites a content), so
`verify` is true: the compressor counts its result again before it trusts it (quickly,
and with a full render and encode when that count is within `margin` of the target).

`strftime_now` reads no clock (the compressor is pure): it formats `today`, fixed when the
template is loaded (a date's spelling costs the same few tokens on any day).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from compressor.counting import TokenCounter
from compressor.template import (
    Editable,
    Message,
    Slot,
    Tools,
    content_text,
    message_slots,
)
from compressor.tokenizer import HFTokenizer, hf_tokenizer

DEFAULT_TODAY = date(2024, 7, 26)  # Llama-3.1's own default date_string
QUICK_MARGIN = 8  # tokens: the quick count's allowance (see the module docstring)
# A safe cut (compressor/counting.py): a space after a non-space, a line start after a newline.
_SAFE_CUT = re.compile(r"(?<=\S)(?= )|(?<=\n)(?=\S)")
_NEAR = 512  # characters searched for a safe cut near a content's start or end

# Texts on which the quick count must equal a full encode for it to be used (see above).
PROBE_TEXTS = (
    "  leading spaces, trailing space \n\n\tTabbed\t\tline  \r\n  x",
    "digits 1234567 3.14159 -42 1e10 2024-07-26T10:00:00Z  ",
    "accents é ü ñ, combining e\u0301 a\u0308, CJK 日本語のテキスト、です。 emoji 🙂👍🏽",
    "\n\n\n  indented\n    code()\n\t}\n\n",
    "punctuation!!! ... --- *** ``` \"quoted\" 'single' (parens) [brackets] {braces}",
    "don't I'll we've THEY'RE it's  's 'S",
)


def _added_splitter(tokenizer: HFTokenizer) -> re.Pattern[str] | None:
    """A regex that cuts a text at the vocabulary's added tokens (longest first, as the
    tokenizer matches them), or None when one matches by context (lstrip/rstrip/…)."""
    tokens = tokenizer.added_tokens()
    if not all(plain for _, plain in tokens):
        return None
    contents = sorted({c for c, _ in tokens if c}, key=len, reverse=True)
    if not contents:
        return re.compile("(?!)")  # matches nothing
    return re.compile("(" + "|".join(map(re.escape, contents)) + ")")


class TemplateError(ValueError):
    """The chat template refused the request (`raise_exception`) or failed to render."""


def _special(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def read_chat_template(folder: Path) -> tuple[str, dict[str, Any]]:
    """The chat template source and the special-token variables of a tokenizer folder."""
    config_path = folder / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.exists() else {}
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": …}, {"name": "tool_use", …}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, Mapping)}
        source = named.get("default") or next(iter(named.values()), None)
    jinja_file = folder / "chat_template.jinja"
    if not isinstance(source, str) and jinja_file.exists():
        source = jinja_file.read_text()
    if not isinstance(source, str) or not source.strip():
        raise FileNotFoundError(
            f"{folder}: no chat template (tokenizer_config.json's chat_template or chat_template.jinja)"
        )
    specials: dict[str, Any] = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = _special(config.get(key))
        if v is not None:
            specials[key] = v
    extra = config.get("additional_special_tokens")
    if isinstance(extra, list):
        specials["additional_special_tokens"] = [s for s in map(_special, extra) if s]
    return source, specials


def _compile(source: str, today: date) -> Any:
    from jinja2.exceptions import TemplateError as JinjaError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise JinjaError(message)

    def tojson(
        x: object,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return today.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def engine_message(m: Message) -> dict[str, Any]:
    """A message as vLLM hands it to the template (see the module docstring)."""
    out = dict(m)
    content = m.get("content")
    if content is None:
        out["content"] = ""
    elif not isinstance(content, str):
        parts = content if isinstance(content, Sequence) else []
        out["content"] = "\n".join(
            p if isinstance(p, str) else str(p.get("text", ""))
            for p in parts
            if isinstance(p, str) or (isinstance(p, Mapping) and p.get("type", "text") == "text")
        )
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        fixed = []
        for call in calls:
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                fn = dict(call["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass  # rendered as the string it is
                call = {**call, "function": fn}
            fixed.append(call)
        out["tool_calls"] = fixed
    return out


class HFTemplate:
    """A model's tokenizer.json and chat template (see the module docstring)."""

    content_prefix = ""
    verify = True

    def __init__(
        self,
        folder: str | Path,
        tokenizer: HFTokenizer | None = None,
        today: date = DEFAULT_TODAY,
        margin: int = QUICK_MARGIN,
    ) -> None:
        self.folder = Path(folder)
        self.name = f"hf:{self.folder}"
        self.tokenizer = tokenizer or hf_tokenizer(str(self.folder))
        self.counter = TokenCounter(self.tokenizer)
        source, self._specials = read_chat_template(self.folder)
        self._template = _compile(source, today)
        # what add_special_tokens=True adds to a completion prompt (BOS for Llama, none for Qwen)
        self._completion_specials = len(self.tokenizer.encode_with_specials(""))
        self._split = _added_splitter(self.tokenizer)
        self.piecewise = False
        self.piecewise = self._split is not None and self._quick_is_exact()
        self.margin = margin if self.piecewise else 0  # no quick count: every count is exact

    def _quick_is_exact(self) -> bool:
        """Does the quick count equal a full encode on the probe texts and on the template
        rendered around them (see the module docstring)?"""
        probes = list(PROBE_TEXTS)
        added = [c for c, _ in self.tokenizer.added_tokens()][:4]
        probes.append(" ".join(f"{c}x {c} y{c}\n{c}" for c in added))
        chats: list[list[Message]] = []
        try:
            chats = [
                [{"role": "system", "content": probes[0]}, {"role": "user", "content": p}]
                for p in probes
            ]
            probes += [self.render(m) for m in chats]
            probes.append(self.render([{"role": "user", "content": " ".join(PROBE_TEXTS)}]))
        except TemplateError:
            pass  # a template that needs other messages: the texts alone decide
        if not all(self.count_text(p) == len(self.tokenizer.encode(p)) for p in probes):
            return False
        self.piecewise = True  # provisionally: the chats below count through the skeleton
        return all(self.quick_chat_tokens(m) == self.chat_tokens(m) for m in chats)

    def render(self, messages: Sequence[Message], tools: Tools = ()) -> str:
        """The prompt text, as the engine renders it (add_generation_prompt=True)."""
        from jinja2.exceptions import TemplateError as JinjaError

        try:
            text: str = self._template.render(
                messages=[engine_message(m) for m in messages],
                tools=[dict(t) for t in tools] if tools else None,
                add_generation_prompt=True,
                **self._specials,
            )
        except (JinjaError, TypeError, AttributeError, KeyError, IndexError) as exc:
            raise TemplateError(f"{self.name}: the chat template failed: {exc}") from exc
        return text

    def chat_tokens(self, messages: Sequence[Message], tools: Tools = ()) -> int:
        """The engine's count: a full render and encode (~20 ms for a 40 KB prompt)."""
        return len(self.tokenizer.encode(self.render(messages, tools)))

    def count_text(self, text: str) -> int:
        """Tokens of a rendered prompt, piece by piece between the added tokens (exact
        for the tokenizers that pass the load-time test; see the module docstring)."""
        if self._split is None:
            return len(self.tokenizer.encode(text))
        parts = self._split.split(text)  # text, added token, text, …, text
        count = self.counter.count
        return len(parts) // 2 + sum(count(p) for p in parts[::2] if p)

    def quick_chat_tokens(self, messages: Sequence[Message], tools: Tools = ()) -> int:
        """The count within `margin` of the engine's (exact when not `piecewise`)."""
        text = self.render(messages, tools)
        if not self.piecewise:
            return len(self.tokenizer.encode(text))
        texts = message_slots(messages, None, "")[0]
        fixed = self._skeleton_tokens(text, messages, texts)
        if fixed is None:
            return self.count_text(text)
        return fixed + self.counter.count_all(texts)

    def fixed_tokens(
        self, messages: Sequence[Message], tools: Tools = (), texts: list[str] | None = None
    ) -> int:
        """The prompt's tokens outside the message texts: quick total − Σ tokens(text i),
        from the template's own text alone when the contents sit in it at safe cuts."""
        if texts is None:
            texts = message_slots(messages, None, "")[0]
        text = self.render(messages, tools)
        if not self.piecewise:
            return len(self.tokenizer.encode(text)) - self.counter.count_all(texts)
        fixed = self._skeleton_tokens(text, messages, texts)
        if fixed is None:
            return self.count_text(text) - self.counter.count_all(texts)
        return fixed

    def _skeleton_tokens(
        self, text: str, messages: Sequence[Message], texts: list[str]
    ) -> int | None:
        """count(text) − Σ count(texts i) without counting the contents' bulk.

        Each message's content (as the template got it, or trimmed) is found in the
        rendered `text`, in order. Its core — from its first to its last safe cut (an
        added token's edge, a space after a non-space, a line start after a newline:
        compressor/counting.py's claims; usually its own start and end) — is cut out: the
        text's count is the count of the pieces around the cores (the template's own text
        and the contents' first and last few words) plus the cores', and a core's count
        is its content's minus its head's and tail's. None when a content is not found or
        has no safe cut near an end."""
        assert self._split is not None
        edges = {0, len(text)}
        for special in self._split.finditer(text):
            edges.add(special.start())
            edges.add(special.end())

        def safe(p: int) -> bool:
            return p in edges or _SAFE_CUT.match(text, p) is not None

        count = self.counter.count
        pos = 0
        pieces: list[str] = []
        extra = 0
        for message, own in zip(messages, texts, strict=True):
            content = message.get("content")
            given = content if isinstance(content, str) else engine_message(message)["content"]
            if not given:
                continue
            found = given
            at = text.find(found, pos)
            if at < 0:  # templates that trim contents (Llama-3.1)
                found = given.strip()
                at = text.find(found, pos) if found else -1
            if at < 0:
                return None
            end = at + len(found)
            head = at
            if not safe(at):
                cut = _SAFE_CUT.search(text, at + 1, min(end, at + _NEAR) + 1)
                if cut is None:
                    return None
                head = cut.start()
            tail = end
            if not safe(end):
                cuts = list(_SAFE_CUT.finditer(text, max(head, end - _NEAR), end))
                if not cuts:
                    return None
                tail = cuts[-1].start()
            pieces.append(text[pos:head])
            pos = tail
            if found != own:
                extra += count(found) - count(own)
            if head > at:
                extra -= count(text[at:head])
            if tail < end:
                extra -= count(text[tail:end])
        pieces.append(text[pos:])
        return sum(self.count_text(p) for p in pieces if p) + extra

    def completion_tokens(self, prompt: str) -> int:
        return self._completion_specials + self.counter.count(prompt)

    def chat_segments(
        self, messages: Sequence[Message], editable: Editable | None = None, tools: Tools = ()
    ) -> tuple[int, list[str], list[Slot | None]]:
        texts, slots = message_slots(messages, editable, "")
        return self.fixed_tokens(messages, tools, texts), texts, slots


__all__ = ["HFTemplate", "TemplateError", "content_text", "engine_message", "read_chat_template"]
