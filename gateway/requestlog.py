"""The request log: one JSON line per answered request.

It is the gateway's audit trail, the training set of later predictors, and the trace the
simulator replays (`simulator/workloads.py` reads this format). A file is rotated at
`max_bytes`, keeping `backups` (`path.1` the newest of them); `-` writes to stdout.

Threading: the event loop only serialises an entry (orjson, about a microsecond) and
appends the line to a bounded in-memory queue, a `deque` (appends and pops are atomic, so
one producer and one consumer need no lock). A writer thread drains it every `FLUSH_S`
and does all the file work: writing, flushing, rotating. A slow or stalled disk
therefore never blocks the loop; instead the queue fills, and once it holds `queue_max`
lines further entries are dropped and counted (`on_drop("queue_full")`, the metric
`fleetgate_request_log_dropped_total{reason}`), as are lines lost to a write error
(`write_error`) and entries written after `close()` (`closed`). `close()` stops the thread
after it has drained the queue, so every entry accepted before it is on disk.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

log = logging.getLogger("fleetgate.requestlog")

FLUSH_S = 0.1  # the writer thread wakes this often (and at close)
QUEUE_MAX = 65_536  # lines held in memory while the disk lags (~25 MB at ~400 B a line)
_CHUNK_BYTES = 256 * 1024  # at most this much per write call; rotation is checked after each


class RequestLog:
    def __init__(
        self,
        path: str | None,
        max_bytes: int,
        backups: int,
        *,
        queue_max: int = QUEUE_MAX,
        on_drop: Callable[[str, int], None] | None = None,
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.queue_max = queue_max
        self.on_drop = on_drop
        self.dropped = 0
        self._queue: collections.deque[bytes] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._fh: IO[bytes] | None = None
        if path and path != "-":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "ab")  # noqa: SIM115  (kept open for the process's life)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def start(self) -> None:
        if self.enabled and self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._run, name="fleetgate-request-log", daemon=True
            )
            self._thread.start()

    def write(self, entry: dict[str, Any]) -> None:
        """Queue one entry (called on the event loop: no I/O, never blocks)."""
        if self.path is None:
            return
        if self._closed:
            self._drop("closed")
        elif len(self._queue) >= self.queue_max:
            self._drop("queue_full")
        else:
            self._queue.append(orjson.dumps(entry) + b"\n")

    def _drop(self, reason: str, n: int = 1) -> None:
        self.dropped += n
        if self.on_drop is not None:
            self.on_drop(reason, n)

    # --- the writer thread -------------------------------------------------------------
    def _run(self) -> None:
        while True:
            stopping = self._stop.wait(FLUSH_S)
            try:
                self._drain()
            except Exception:  # the thread must outlive any one bad write
                log.exception("request log: writing failed")
            if stopping:
                return

    def _drain(self) -> None:
        """Write out everything queued, in order, in chunks; rotate when a file is full."""
        q = self._queue
        while q:
            limit = _CHUNK_BYTES  # a file gets lines until it reaches max_bytes
            if self._fh is not None:
                limit = max(1, min(limit, self.max_bytes - self._fh.tell()))
            lines: list[bytes] = []
            size = 0
            while q and size < limit:
                line = q.popleft()
                lines.append(line)
                size += len(line)
            try:
                self._emit(b"".join(lines))
            except OSError as exc:
                log.error("request log: %d lines lost: %s", len(lines), exc)
                self._drop("write_error", len(lines))
                continue
            if self._fh is not None and self._fh.tell() >= self.max_bytes:
                try:
                    self._rotate()
                except OSError as exc:  # keep appending to the file we have
                    log.error("request log: rotation failed: %s", exc)

    def _emit(self, data: bytes) -> None:
        if self._fh is None:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return
        self._fh.write(data)
        self._fh.flush()

    def _rotate(self) -> None:
        assert self.path is not None and self._fh is not None
        self._fh.close()
        try:
            for i in range(self.backups, 0, -1):
                src = self.path if i == 1 else f"{self.path}.{i - 1}"
                if os.path.exists(src):
                    os.replace(src, f"{self.path}.{i}")
            if self.backups == 0:
                os.remove(self.path)
        finally:
            self._fh = open(self.path, "ab")  # noqa: SIM115

    def flush(self) -> None:
        """Write out what is queued now, on the caller's thread (tests, or no loop)."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("flush() while the writer thread runs: use close()")
        self._drain()

    async def close(self) -> None:
        """Stop accepting entries, let the thread drain the queue, close the file."""
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        self._drain()  # entries queued without a thread ever started
        if self._fh is not None:
            self._fh.close()
            self._fh = None
