"""Relaying an engine's SSE stream: read usage on the way, strip what we added.

To learn a streamed request's real token counts the gateway asks the engine for the
final usage event (`stream_options.include_usage`), and removes that event again when the
client did not ask for it, so the client sees exactly the stream it requested.

Chunks are forwarded as they arrive. Only an incomplete event at the end of a read (an
event split across TCP reads) is held back until its end arrives; a complete event is
never delayed. Events end with a blank line, and lines end with LF, CRLF or CR (the
WHATWG SSE grammar), so `\n\n`, `\r\n\r\n`, `\r\r` and mixtures all frame events.
The common case (no CR in the read) costs one `in` test, one `endswith` and one substring
search; reads with a CR take a slower, regex-based path. JSON is parsed only for the
event carrying `"usage"`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_SEP = b"\n\n"
# an event ends at a blank line: a line ending followed by another one, where a line ending
# is CRLF, LF or a CR not followed by LF (a CR at the end of a read ends the line: a
# following LF in the next read belongs to it)
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_LINE = re.compile(rb"\r\n|\r|\n")


class StreamScanner:
    __slots__ = ("_after_cr", "_drop_lf", "_tail", "done", "strip_usage", "usage")

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.usage: dict[str, Any] | None = None
        self.done = False  # saw `data: [DONE]`
        self._tail = b""
        self._after_cr = False  # the last forwarded event ended with a CR at a read's end
        self._drop_lf = False  # ... and was dropped: a LF completing that CRLF goes too

    def feed(self, chunk: bytes) -> bytes:
        """Bytes to forward to the client for this upstream chunk (possibly empty)."""
        if self._after_cr or b"\r" in chunk or (self._tail and b"\r" in self._tail):
            return self._feed_cr(chunk)
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
            if b'"usage"' in event and self._usage_event(event):
                continue  # the usage-only event we asked for on the client's behalf
            kept.append(event + _SEP)
        return b"".join(kept)

    def _feed_cr(self, chunk: bytes) -> bytes:
        """`feed` for reads with CR line endings (or right after one)."""
        head = b""
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":  # the LF of a CRLF that ended the previous event
                if not self._drop_lf:
                    head = b"\n"
                chunk = chunk[1:]
            self._drop_lf = False
        if self._tail:
            chunk = self._tail + chunk
            self._tail = b""
        ends = [m.end() for m in _EVENT_END.finditer(chunk)]
        if not ends:
            self._tail = chunk
            return head
        last = ends[-1]
        self._tail = chunk[last:]
        data = chunk[:last]
        if not self._tail and data[-1:] == b"\r":
            self._after_cr = True
        if b'"usage"' not in data and b"[DONE]" not in data:
            return head + data
        kept: list[bytes] = [head]
        start = 0
        for end in ends:
            event = data[start:end]
            start = end
            if b'"usage"' in event and self._usage_event(event):
                if end == last and self._after_cr:
                    self._drop_lf = True
                continue
            if not self.done and b"[DONE]" in event and _data_of(event) == b"[DONE]":
                self.done = True
            kept.append(event)
        return b"".join(kept)

    def _usage_event(self, event: bytes) -> bool:
        """Read the usage of an event; True if it is to be stripped."""
        data = _data_of(event)
        if not data.startswith(b"{"):
            return False
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return False
        if isinstance(obj, dict):
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self.usage = usage
                return self.strip_usage and not obj.get("choices")
        return False


def _data_of(event: bytes) -> bytes:
    """The data of one SSE event: its `data:` lines' values, joined by LF."""
    if event.startswith(b"data: ") and b"\ndata:" not in event and b"\rdata:" not in event:
        return event[6:].rstrip(b"\r\n")  # one data line (the usual)
    values = []
    for line in _LINE.split(event):
        if line.startswith(b"data:"):
            value = line[5:]
            values.append(value[1:] if value[:1] == b" " else value)
    return b"\n".join(values)


def usage_of(body: bytes) -> dict[str, Any] | None:
    """The `usage` object of a non-streamed answer, if any."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None


def token_events(out: bytes, started: bool) -> int:
    """How many of the SSE events in `out` (whole events, as `StreamScanner.feed` returns
    them) carry generated tokens, for a dp_group rank's load. Once the stream has `started`
    (a token event was seen) every `data: {` event counts, by bytes alone (a finish-only or
    usage event at the end is corrected by the engine's usage); before it, each event is
    parsed so the chat stream's role-only first events (one per choice) count nothing."""
    if started:
        return out.count(b"data: {")
    n = 0
    for event in out.split(_SEP):
        data = _data_of(event.lstrip(b"\r\n"))
        if not data.startswith(b"{"):
            continue
        if n or _carries_tokens(data):
            n += 1
    return n


def _carries_tokens(data: bytes) -> bool:
    """An event with generated output: a completion's `text`, or a chat delta with more
    than its `role` (content, reasoning, tool calls)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return True  # not ours to judge: count it, as the byte count would
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        return True
    for choice in choices:
        if not isinstance(choice, dict):
            return True
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role"):
            return True
    return False
