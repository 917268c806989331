"""What a prompt costs an engine: the chat template and vocabulary of the served model.

`ServedTemplate` is what the compressor and the gateway count with: a vocabulary (an
exact `TokenCounter`) and a chat template. Two implementations: `Llama3Cl100k` below
(the emulated engines' own layout, the default) and `compressor.hf_template.HFTemplate`
(a real model's tokenizer.json and its Jinja chat template, rendered as transformers
does). `compressor.served.load_served` builds one from a `tokenizer:` setting.

The default, `Llama3Cl100k`:

fleetgate's budgets are in the engine's tokens. The emulated engines
(emulator/chat_template.py) count like a Llama-3 server with OpenAI's cl100k vocabulary:
five special tokens of ONE id each, text in cl100k BPE, and the Llama-3 layout

    <|begin_of_text|>
    for each message:  <|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>
    then:              <|start_header_id|>assistant<|end_header_id|>\\n\\n

so a chat prompt costs 1 + Σ_m (3 + tokens(role_m) + tokens("\\n\\n" + content_m))
+ 2 + tokens("assistant") + tokens("\\n\\n") tokens, and a completion prompt BOS + its
text. A message's content is a string, null, or a list of parts whose text parts are
joined with nothing (images and audio cost nothing). Every text is encoded on its own
(special tokens separate them), which is what lets the compressor count a shortened
message without re-encoding the others.

This module mirrors the emulator's definition for the pure side (the gateway may not
import the emulator): tests/unit/compressor/test_template.py checks that both count
the same. `chat_segments` exposes the encoded texts one by one so the compressor can
edit message contents and still know the exact total.

Tools (not in Llama-3.0's template; the documented allowance of this layout, which the
emulator renders the same way): a request's `tools` are one more header block ahead of
the messages, role `tools`, content "\\n\\n" + one compact JSON object per tool per line
(`tool_json`); every assistant `tool_calls` entry is its call as JSON
(`{"name": …, "arguments": …}`, `call_json`) encoded on its own after the message's
content. `tool_choice` is not rendered (no template renders it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from compressor.counting import TokenCounter, default_counter


def count(text: str) -> int:
    return default_counter().count(text)


SPECIALS_PER_MESSAGE = 3  # <|start_header_id|>, <|end_header_id|>, <|eot_id|>
BOS = 1  # <|begin_of_text|>
REPLY_ROLE = "assistant"
CONTENT_PREFIX = "\n\n"  # follows <|end_header_id|>, encoded with the content
TOOLS_ROLE = "tools"  # the header of the tools block (see the module docstring)

Message = Mapping[str, Any]
Tools = Sequence[Mapping[str, Any]]
Slot = tuple[int, int | None]  # (message index, index of its only text part; None: a string)
Editable = Callable[[int, str, str], bool]  # (message index, role, text) → may be edited


class ServedTemplate(Protocol):
    """The served model's vocabulary and chat template, as the compressor counts with it.

    `chat_segments` gives (fixed tokens, one text per message, slots): total tokens =
    fixed + Σ counter.count(text i), and text i is `content_prefix` + the content of
    message i. `verify` true: that sum is exact for the request as given but an edited
    request must be counted again (a template we do not control may transform contents
    or join them with their surroundings). Counts are quick — `quick_chat_tokens`, and
    the fixed part of `chat_segments` — within `margin` tokens of the engine's count
    (`chat_tokens`, a full encode); callers settle a count closer than that to a limit
    with `chat_tokens`. `margin` 0: every count is exact."""

    name: str
    counter: TokenCounter
    content_prefix: str
    verify: bool
    margin: int

    def chat_segments(
        self, messages: Sequence[Message], editable: Editable | None = None, tools: Tools = ()
    ) -> tuple[int, list[str], list[Slot | None]]: ...

    def chat_tokens(self, messages: Sequence[Message], tools: Tools = ()) -> int: ...

    def quick_chat_tokens(self, messages: Sequence[Message], tools: Tools = ()) -> int: ...

    def fixed_tokens(self, messages: Sequence[Message], tools: Tools = ()) -> int: ...

    def completion_tokens(self, prompt: str) -> int: ...


def content_text(content: object) -> str:
    """The countable text of a message's `content`."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Mapping) and part.get("type", "text") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    out.append(text)
        return "".join(out)
    return ""


def tool_json(tool: object) -> str:
    """A tool schema as one line of compact JSON (how the tools block lists it)."""
    return json.dumps(tool, ensure_ascii=False, separators=(",", ":"))


def call_json(call: object) -> str:
    """An assistant tool call as `{"name": …, "arguments": …}` JSON (arguments as sent)."""
    fn = call.get("function", call) if isinstance(call, Mapping) else {}
    fn = fn if isinstance(fn, Mapping) else {}
    return json.dumps(
        {"name": fn.get("name"), "arguments": fn.get("arguments")},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def tool_calls(message: Message) -> list[Any]:
    calls = message.get("tool_calls")
    return list(calls) if isinstance(calls, list) else []


def tools_text(tools: Tools) -> str:
    """The content of the Llama3Cl100k tools block ("" when there are no tools)."""
    return (CONTENT_PREFIX + "\n".join(tool_json(t) for t in tools)) if tools else ""


def _slot(index: int, content: object) -> tuple[Slot | None, str]:
    """Where the editable text of a message lives: a string content, or its only text part."""
    if isinstance(content, str):
        return (index, None), content
    if isinstance(content, Sequence):
        texts = [
            k
            for k, p in enumerate(content)
            if isinstance(p, Mapping)
            and p.get("type", "text") == "text"
            and isinstance(p.get("text"), str)
        ]
        if len(texts) == 1 and all(isinstance(p, Mapping) for p in content):
            return (index, texts[0]), str(content[texts[0]]["text"])
    return None, content_text(content)


def message_slots(
    messages: Sequence[Message], editable: Editable | None, prefix: str
) -> tuple[list[str], list[Slot | None]]:
    """Each message's text (prefix + content) and where its editable text lives."""
    texts: list[str] = []
    slots: list[Slot | None] = []
    for i, m in enumerate(messages):
        slot, text = _slot(i, m.get("content"))
        if slot is not None and (editable is None or not editable(i, str(m.get("role", "")), text)):
            slot = None
        texts.append(prefix + text)
        slots.append(slot)
    return texts, slots


class Llama3Cl100k:
    """cl100k text inside the Llama-3.0 layout: the emulated engines' template."""

    name = "cl100k"
    content_prefix = CONTENT_PREFIX
    verify = False
    margin = 0  # every count is exact

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter or default_counter()

    def fixed_tokens(self, messages: Sequence[Message], tools: Tools = ()) -> int:
        """Tokens outside the message texts: BOS, the specials, the role names, the
        tools block, the tool calls and the reply header."""
        c = self.counter
        roles = c.count_all([str(m.get("role", "")) for m in messages])
        reply = 2 + c.count(REPLY_ROLE) + c.count(CONTENT_PREFIX)
        extra = 0
        if tools:
            extra += SPECIALS_PER_MESSAGE + c.count(TOOLS_ROLE) + c.count(tools_text(tools))
        calls = [call_json(t) for m in messages for t in tool_calls(m)]
        if calls:
            extra += c.count_all(calls)
        return BOS + SPECIALS_PER_MESSAGE * len(messages) + roles + reply + extra

    def chat_segments(
        self, messages: Sequence[Message], editable: Editable | None = None, tools: Tools = ()
    ) -> tuple[int, list[str], list[Slot | None]]:
        texts, slots = message_slots(messages, editable, CONTENT_PREFIX)
        return self.fixed_tokens(messages, tools), texts, slots

    def chat_tokens(self, messages: Sequence[Message], tools: Tools = ()) -> int:
        fixed, texts, _ = self.chat_segments(messages, tools=tools)
        return fixed + self.counter.count_all(texts)

    def quick_chat_tokens(self, messages: Sequence[Message], tools: Tools = ()) -> int:
        return self.chat_tokens(messages, tools)

    def completion_tokens(self, prompt: str) -> int:
        return BOS + self.counter.count(prompt)


_DEFAULT: Llama3Cl100k | None = None


def default_template() -> Llama3Cl100k:
    """The process-wide default: cl100k inside the Llama-3.0 layout."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Llama3Cl100k()
    return _DEFAULT


def fixed_tokens(messages: Sequence[Message], tools: Tools = ()) -> int:
    """Tokens of a chat prompt outside the message texts (the default template)."""
    return default_template().fixed_tokens(messages, tools)


def chat_segments(
    messages: Sequence[Message], editable: Editable | None = None, tools: Tools = ()
) -> tuple[int, list[str], list[Slot | None]]:
    """The chat prompt as (fixed tokens, encoded texts, slots) under the default template:
    text i is "\\n\\n" + content of message i, encoded on its own; its slot says where an
    editable text lives (None: not editable). Total tokens = fixed + Σ tokens(text i)."""
    return default_template().chat_segments(messages, editable, tools)


def chat_tokens(messages: Sequence[Message], tools: Tools = ()) -> int:
    """Prompt tokens of a chat request as the default engine counts them."""
    return default_template().chat_tokens(messages, tools)


def completion_tokens(prompt: str) -> int:
    """Prompt tokens of a completion request (BOS + text)."""
    return default_template().completion_tokens(prompt)
