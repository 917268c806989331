"""The request log: the event loop only queues; a thread writes, flushes and rotates."""

import asyncio
import json
import threading
import time
from pathlib import Path

from gateway import requestlog
from gateway.requestlog import RequestLog


def _entry(i: int) -> dict[str, object]:
    return {"ts": 1700000000.0 + i, "request_id": f"r{i}", "status": 200, "pad": "x" * 40}


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


async def test_entries_are_complete_and_in_order(tmp_path):
    path = tmp_path / "log" / "requests.jsonl"
    log = RequestLog(str(path), 1 << 30, 3)
    log.start()
    for i in range(5000):
        log.write(_entry(i))
        if i % 500 == 0:
            await asyncio.sleep(0)  # let the writer thread interleave with the producer
    await log.close()
    assert [e["request_id"] for e in _lines(path)] == [f"r{i}" for i in range(5000)]
    assert _lines(path)[7] == _entry(7)  # complete entries, the JSONL format unchanged
    assert log.dropped == 0


async def test_close_drains_the_queue(tmp_path):
    """Entries written just before close() (before the thread's next wake) are on disk."""
    path = tmp_path / "requests.jsonl"
    log = RequestLog(str(path), 1 << 30, 3)
    log.start()
    for i in range(100):
        log.write(_entry(i))
    await log.close()
    assert len(_lines(path)) == 100
    log.write(_entry(100))  # after close: dropped and counted, never a write on the loop
    assert log.dropped == 1 and len(_lines(path)) == 100


async def test_rotation_keeps_backups_in_order(tmp_path):
    path = tmp_path / "requests.jsonl"
    line_size = len(json.dumps(_entry(0), separators=(",", ":"))) + 1
    log = RequestLog(str(path), max_bytes=10 * line_size, backups=2)
    log.start()
    for i in range(45):
        log.write(_entry(i))
    await log.close()
    files = [Path(f"{path}.2"), Path(f"{path}.1"), path]
    ids = [e["request_id"] for f in files for e in _lines(f)]
    # each file is rotated once it reaches max_bytes (10 lines); the oldest fell out
    assert [len(_lines(f)) for f in files] == [10, 10, 5]
    assert ids == [f"r{i}" for i in range(20, 45)]
    assert not Path(f"{path}.3").exists()


async def test_a_stalled_disk_never_blocks_the_loop_and_a_full_queue_drops(tmp_path, monkeypatch):
    """Before: write() called flush() itself once 256 kB were buffered, and a task flushed
    every 0.5 s, both on the event loop: the file write, its flush and any rotation ran
    there, so a slow or stalled disk stalled every request the process was serving, and
    there was no bound on what waited in memory. Now write() only appends to a bounded
    queue: with the writer thread stuck in a write, write() still returns at once, the
    queue stops at queue_max and the rest is dropped and counted under queue_full."""
    path = tmp_path / "requests.jsonl"
    drops: list[tuple[str, int]] = []
    log = RequestLog(str(path), 1 << 30, 3, queue_max=50, on_drop=lambda r, n: drops.append((r, n)))
    disk = threading.Event()
    emit = log._emit

    def stalled_emit(data: bytes) -> None:
        disk.wait(10)  # the disk hangs until the test releases it
        emit(data)

    monkeypatch.setattr(log, "_emit", stalled_emit)
    monkeypatch.setattr(requestlog, "FLUSH_S", 0.001)
    log.start()
    log.write(_entry(0))
    deadline = time.monotonic() + 5
    while log._queue and time.monotonic() < deadline:  # the thread took it and is stuck
        await asyncio.sleep(0.001)
    t0 = time.perf_counter()
    for i in range(1, 201):
        log.write(_entry(i))
    assert time.perf_counter() - t0 < 0.5  # no write waited for the disk
    assert len(log._queue) == 50
    assert log.dropped == 150 and drops == [("queue_full", 1)] * 150
    disk.set()
    await log.close()
    ids = [e["request_id"] for e in _lines(path)]
    assert ids == [f"r{i}" for i in range(51)]  # the queued ones, in order


async def test_a_failing_write_is_counted_and_the_thread_goes_on(tmp_path, monkeypatch):
    path = tmp_path / "requests.jsonl"
    drops: list[tuple[str, int]] = []
    log = RequestLog(str(path), 1 << 30, 3, on_drop=lambda r, n: drops.append((r, n)))
    emit = log._emit
    fail = [True]

    def flaky_emit(data: bytes) -> None:
        if fail[0]:
            fail[0] = False
            raise OSError(28, "No space left on device")
        emit(data)

    monkeypatch.setattr(log, "_emit", flaky_emit)
    log.write(_entry(0))
    log.flush()  # no thread started: drains on the caller
    log.write(_entry(1))
    await log.close()
    assert drops == [("write_error", 1)]
    assert [e["request_id"] for e in _lines(path)] == ["r1"]


async def test_disabled_log_writes_nothing(tmp_path):
    log = RequestLog(None, 100, 1)
    log.start()
    log.write(_entry(0))
    await log.close()
    assert not log.enabled and log.dropped == 0
