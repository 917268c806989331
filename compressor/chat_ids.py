"""Token ids of a prompt as the emulated model renders it (emulator/chat_template.py says
the template): Llama-3's chat layout over cl100k with five special ids, or a real model's
template and tokenizer (`hf:<folder>`, compressor/hf_template.py). Here, below the
emulator, so that the gateway can compute the same ids — and so the same KV block hashes
as the engine (a pool whose engines publish KV events, docs/CACHE_ROUTING.md).
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from compressor.hf_template import HFTemplate
from compressor.template import TOOLS_ROLE, call_json, tool_calls, tools_text
from compressor.tokenizer import cl100k

BOS = 100257
EOT = 100258
START_HEADER = 100259
END_HEADER = 100260
EOS = 100261  # <|eot_id|>: ends every assistant turn, the token generation stops on

SPECIALS: dict[int, str] = {
    BOS: "<|begin_of_text|>",
    EOT: "<|end_of_text|>",
    START_HEADER: "<|start_header_id|>",
    END_HEADER: "<|end_header_id|>",
    EOS: "<|eot_id|>",
}


def encode(text: str) -> list[int]:
    return cl100k().encode(text)


def message_text(content: Any) -> str:
    """The countable text of one message's `content`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                if part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                    parts.append(part["text"])
            else:
                raise TypeError("content parts must be objects")
        return "".join(parts)
    raise TypeError("message content must be a string, a list of parts or null")


@dataclass(slots=True)
class MessageIdsCache:
    """The ids of rendered messages, by (role, text), least recently used first, at most
    `max_tokens` ids in all. Under the template above each message renders to ids of its
    own — it is framed by special tokens, where cl100k's encoding starts afresh — so a
    conversation's next turn re-renders its earlier messages to the same ids, and encoding
    them again is most of the cost of its token-id chain (docs/CACHE_ROUTING.md). Ids are
    kept as 4-byte arrays; the keys hold the messages' text (~4–5 bytes a token of prose),
    so the default bound is ~10 MB. Thread-safe (the gateway hashes long bodies on a pool
    of threads, short ones on the event loop)."""

    max_tokens: int = 1 << 20
    hits: int = 0
    misses: int = 0
    _entries: OrderedDict[tuple[str, str], array[int]] = field(default_factory=OrderedDict)
    _tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        """Ids held over all entries."""
        return self._tokens

    def ids(self, role: str, text: str) -> array[int]:
        """A message's ids (without tool calls), encoded on a miss."""
        key = (role, text)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return found
        made = array("I", _message_ids(role, text, ()))
        with self._lock:
            self.misses += 1
            if len(made) > self.max_tokens or key in self._entries:
                return made
            self._entries[key] = made
            self._tokens += len(made)
            while self._tokens > self.max_tokens:
                _, gone = self._entries.popitem(last=False)
                self._tokens -= len(gone)
        return made


def _message_ids(role: str, text: str, calls: Sequence[Any]) -> list[int]:
    ids = [START_HEADER, *encode(role), END_HEADER, *encode("\n\n" + text)]
    for call in calls:
        ids += encode(call_json(call))
    ids.append(EOS)
    return ids


def chat_ids(
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    served: HFTemplate | None = None,
    cache: MessageIdsCache | None = None,
) -> list[int]:
    """Token ids of a chat prompt under the template above (or `served`, a real model's).
    `cache`: messages already rendered (the template above only; a served template
    renders the whole conversation at once)."""
    if served is not None:
        for m in messages:
            message_text(m.get("content"))  # the same TypeError for a bad content
        return served.tokenizer.encode(served.render(messages, tools or ()))
    ids = [BOS]
    if tools:
        ids.append(START_HEADER)
        ids += encode(TOOLS_ROLE)
        ids.append(END_HEADER)
        ids += encode(tools_text(tools))
        ids.append(EOS)
    for m in messages:
        role = m.get("role")
        if not isinstance(role, str):
            raise TypeError("every message needs a string role")
        text = message_text(m.get("content"))
        calls = tool_calls(m)
        if cache is not None and not calls:
            ids += cache.ids(role, text)
        else:
            ids += _message_ids(role, text, calls)
    if add_generation_prompt:
        ids.append(START_HEADER)
        ids += encode("assistant")
        ids.append(END_HEADER)
        ids += encode("\n\n")
    return ids


def completion_ids(
    prompt: str | Sequence[int], add_special_tokens: bool = True, served: HFTemplate | None = None
) -> list[int]:
    """Token ids of one completion prompt: BOS + text, or the ids as given."""
    if isinstance(prompt, str):
        if served is not None:
            t = served.tokenizer
            return t.encode_with_specials(prompt) if add_special_tokens else t.encode(prompt)
        return ([BOS] if add_special_tokens else []) + encode(prompt)
    return list(prompt)
