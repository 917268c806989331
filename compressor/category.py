"""The content category of a prompt (compressor/content.py classifies it).

It lives in the compressor, the bottom of the import graph, because the compressor
decides it and gates compression by it; policies/types.py re-exports it for the policies
(the bytes-per-token estimate is keyed by it)."""

from __future__ import annotations

from enum import StrEnum


class Category(StrEnum):
    """Content category of a prompt (what the bytes-per-token estimate is keyed by)."""

    CHAT = "chat"
    PROSE = "prose"
    CODE = "code"
    RAG = "rag"
