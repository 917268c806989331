"""Which way a request's text packs bytes into tokens: its script (issue 24).

Bytes per token depend less on what a text is about than on how it is written: English
prose packs 4–6 UTF-8 bytes into a token under every byte-level BPE vocabulary, pasted
logs and JSON 2.5–3.5 (digits, punctuation, hex ids), and Chinese or Japanese 1.5–4.5
depending on the vocabulary (3 bytes a character; one character per token in cl100k,
often two per token in Qwen3). policies/uncertainty.py keeps a bytes-per-token interval
per (content category, script) and counts a request exactly when that interval cannot
tell on which side of a placement boundary it lies.

    TEXT     mostly ASCII (or Latin/Cyrillic) text
    CJK      at least `CJK_SHARE` of the sampled characters are CJK ideographs or kana
    RECORDS  a pasted log (timestamped lines) or JSON (a text that opens with { or [)

Fast: only C-speed string operations on at most `_SAMPLE` characters from each end of
each text, and only for requests the placement is not already sure of (policies/intake.py's
fast path never calls it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any, Protocol

from compressor.content import is_log
from compressor.template import content_text


class Script(StrEnum):
    """How a text packs bytes into tokens (the key, beside the content category, of
    policies/uncertainty.py's bytes-per-token intervals)."""

    TEXT = "text"
    CJK = "cjk"
    RECORDS = "records"  # pasted logs and JSON


class PromptTexts(Protocol):
    """What `script_of_prompt` reads of a request (policies/intake.py's `Prompt`)."""

    @property
    def messages(self) -> Sequence[dict[str, Any]] | None: ...

    @property
    def prompt(self) -> str | Sequence[str] | None: ...

    @property
    def ascii(self) -> bool: ...


_SAMPLE = 1_000
CJK_SHARE = 0.2  # of a sample's characters: enough ideographs to move bytes per token
# CJK ideographs, kana, Hangul and full-width forms: 3 UTF-8 bytes each
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff00-\uffef]")
_JSON_OPEN = re.compile(r"(?:^|\n\n)[^\S\n]*(?:\{\s*\"|\[\s*[\[{\"])")


def _sample(text: str) -> str:
    return text if len(text) <= 2 * _SAMPLE else text[:_SAMPLE] + "\n" + text[-_SAMPLE:]


def script_of(texts: Iterable[str], ascii_only: bool = False) -> Script:
    """The script of a request's texts (the longest text decides; see the module doc).
    `ascii_only`: the caller knows every text is ASCII (no CJK scan needed)."""
    longest = max(texts, key=len, default="")
    s = _sample(longest)
    if not ascii_only and not s.isascii() and len(_CJK.findall(s)) >= CJK_SHARE * len(s):
        return Script.CJK
    if is_log(longest):
        return Script.RECORDS
    head = s[: 2 * _SAMPLE]
    # _JSON_OPEN needs a "{" or a "[" (found at C speed; the regex tries every position)
    if ("{" in head or "[" in head) and _JSON_OPEN.search(head) is not None:
        return Script.RECORDS
    return Script.TEXT


def script_of_prompt(prompt: PromptTexts) -> Script:
    """The script of a request as the Intake sees it (its `scripter`)."""
    if prompt.messages is not None:
        texts = [content_text(m.get("content")) for m in prompt.messages]
    else:
        p = prompt.prompt
        texts = [p] if isinstance(p, str) else list(p or ())
    return script_of(texts, prompt.ascii)
