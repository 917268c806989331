"""The request log: one JSON line per answered request.

It is the gateway's audit trail, the training set of later predictors, and the trace the
simulator replays (`simulator/workloads.py` reads this format). Lines are buffered in
memory and written by a background task every `FLUSH_S` (or when the buffer is large),
so the hot path never blocks on disk. A file is rotated at `max_bytes`, keeping `backups`.

Fields: ts (unix seconds at arrival), request_id, endpoint, model, stream, pool, worker,
status, est_prompt_tokens, max_tokens, prompt_tokens, completion_tokens (engine counts),
ttft_s, latency_s, retries, error (kind, when it failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import orjson

FLUSH_S = 0.5
_FLUSH_BYTES = 256 * 1024


class RequestLog:
    def __init__(self, path: str | None, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._buf: list[bytes] = []
        self._size = 0
        self._task: asyncio.Task[None] | None = None
        self._fh: Any = None
        if path and path != "-":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(path, "ab")  # noqa: SIM115  (kept open for the process's life)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def start(self) -> None:
        if self.enabled:
            self._task = asyncio.get_running_loop().create_task(self._flusher())

    def write(self, entry: dict[str, Any]) -> None:
        if self.path is None:
            return
        line = orjson.dumps(entry) + b"\n"
        self._buf.append(line)
        self._size += len(line)
        if self._size >= _FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self._buf:
            return
        data = b"".join(self._buf)
        self._buf.clear()
        self._size = 0
        if self._fh is None:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return
        self._fh.write(data)
        self._fh.flush()
        if self._fh.tell() >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        assert self.path is not None
        self._fh.close()
        for i in range(self.backups, 0, -1):
            src = self.path if i == 1 else f"{self.path}.{i - 1}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{i}")
        if self.backups == 0:
            os.remove(self.path)
        self._fh = open(self.path, "ab")  # noqa: SIM115

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self.flush()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.flush()
        if self._fh is not None:
            self._fh.close()
            self._fh = None
