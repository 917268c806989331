"""Relaying an engine's SSE stream: read usage on the way, strip what we added.

To learn a streamed request's real token counts the gateway asks the engine for the
final usage event (`stream_options.include_usage`), and removes that event again when the
client did not ask for it, so the client sees exactly the stream it requested.

Chunks are forwarded as they arrive. Only an incomplete event at the end of a read (an
event split across TCP reads) is held back until its end arrives; a complete event is
never delayed. The scan per chunk is one `endswith` and one substring search; JSON is
parsed only for the event carrying `"usage"`.
"""

from __future__ import annotations

from typing import Any

import orjson

_SEP = b"\n\n"


class StreamScanner:
    __slots__ = ("_tail", "done", "strip_usage", "usage")

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.usage: dict[str, Any] | None = None
        self.done = False  # saw `data: [DONE]`
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward to the client for this upstream chunk (possibly empty)."""
        if self._tail:
            chunk = self._tail + chunk
            self._tail = b""
        if not chunk.endswith(_SEP):
            cut = chunk.rfind(_SEP)
            if cut == -1:
                self._tail = chunk
                return b""
            self._tail = chunk[cut + 2 :]
            chunk = chunk[: cut + 2]
        if b'"usage"' in chunk:
            chunk = self._take_usage(chunk)
        if not self.done and chunk.endswith(b"data: [DONE]\n\n"):
            self.done = True
        return chunk

    def flush(self) -> bytes:
        """What is left when the upstream stream ends."""
        tail, self._tail = self._tail, b""
        return tail

    def _take_usage(self, data: bytes) -> bytes:
        kept: list[bytes] = []
        for event in data.split(_SEP)[:-1]:
            if b'"usage"' in event and event.startswith(b"data: {"):
                try:
                    obj = orjson.loads(event[6:])
                except orjson.JSONDecodeError:
                    obj = None
                if isinstance(obj, dict):
                    usage = obj.get("usage")
                    if isinstance(usage, dict):
                        self.usage = usage
                        if self.strip_usage and not obj.get("choices"):
                            continue  # the usage-only event we asked for on the client's behalf
            kept.append(event + _SEP)
        return b"".join(kept)


def usage_of(body: bytes) -> dict[str, Any] | None:
    """The `usage` object of a non-streamed answer, if any."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None
