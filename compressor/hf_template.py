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

Counting per message (what the compressor needs): the request is rendered and encoded
once; each message's content is counted on its own; `fixed` = total − Σ contents. That
sum is exact for the request as given. After the compressor edits contents the
template's joins may count differently (a content glued to the text around it, a
template that strips or rewrites a content), so `verify` is true: the compressor counts
its result again with `chat_tokens` (a full render and encode) before it trusts it.

`strftime_now` reads no clock (the compressor is pure): it formats `today`, fixed when the
template is loaded (a date's spelling costs the same few tokens on any day).
"""

from __future__ import annotations

import json
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
    ) -> None:
        self.folder = Path(folder)
        self.name = f"hf:{self.folder}"
        self.tokenizer = tokenizer or hf_tokenizer(str(self.folder))
        self.counter = TokenCounter(self.tokenizer)
        source, self._specials = read_chat_template(self.folder)
        self._template = _compile(source, today)
        # what add_special_tokens=True adds to a completion prompt (BOS for Llama, none for Qwen)
        self._completion_specials = len(self.tokenizer.encode_with_specials(""))

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
        return len(self.tokenizer.encode(self.render(messages, tools)))

    def completion_tokens(self, prompt: str) -> int:
        return self._completion_specials + self.counter.count(prompt)

    def chat_segments(
        self, messages: Sequence[Message], editable: Editable | None = None, tools: Tools = ()
    ) -> tuple[int, list[str], list[Slot | None]]:
        texts, slots = message_slots(messages, editable, "")
        total = self.chat_tokens(messages, tools)
        return total - self.counter.count_all(texts), texts, slots


__all__ = ["HFTemplate", "TemplateError", "content_text", "engine_message", "read_chat_template"]
