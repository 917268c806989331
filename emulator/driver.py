"""Steps the pure engine model in scaled real time and hands each step's tokens to requests.

One asyncio task per emulator runs the loop of `emulator/engine.py`'s docstring:

    result = engine.step()                       # plans one iteration at clock.now()
    sleep until wall(result.start + result.duration)
    deliver result.tokens / result.finished       # to per-request queues

Time: engine seconds map to wall seconds by `time_scale` (wall = engine × scale). The
engine's clock is an explicit cursor, not the wall clock: while the engine is busy the
next step starts exactly where the previous one ended, and the loop sleeps until that
end's *absolute* wall deadline, so asyncio's ~1 ms timer granularity never accumulates
into engine time (at scale 0.01 several engine steps run per timer tick and their
tokens arrive in small bursts; metrics stay in exact engine seconds). After an idle
period, or when the process has fallen more than `max_lag` wall seconds behind (CPU
starved), the cursor jumps to the wall clock: the stall becomes engine time, which is
what the client saw. A request arriving during a step is stamped no later than the
step's end (it joins the next step).

Delivery: each engine request id maps to a sink (an asyncio.Queue of the HTTP request it
belongs to, plus a key); per step each touched sink gets one event
`(key, new_tokens, FinishedRequest | None)`, all put before the loop yields, so a handler
sees a step's token and its finish together.

Failure posture: an exception in step() or delivery is logged and ends every in-flight
request with reason "abort" (handlers answer 500/close); the loop keeps running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from emulator.dp_engine import DpConfig, DpEngine
from emulator.engine import Engine, EngineConfig, EngineRequest, FinishedRequest, StepResult

log = logging.getLogger("emulator.driver")

# (the sequence's index in its HTTP request, tokens produced this step, its finish)
Event = tuple[int, int, FinishedRequest | None]


class Recorder(Protocol):
    """Metric hooks (emulator/metrics.py); all times are engine seconds."""

    def on_step(self, result: StepResult) -> None: ...

    def on_first_token(self, ttft: float, tag: object) -> None: ...

    def on_token_gaps(self, gaps: list[tuple[float, object]]) -> None: ...

    def on_finished(self, fin: FinishedRequest, tag: object) -> None: ...


class ScaledClock:
    """Engine time: a cursor the driver moves, tied to the wall clock by `scale`."""

    def __init__(self, scale: float) -> None:
        if scale <= 0:
            raise ValueError("time scale must be > 0")
        self.scale = scale
        self._t0 = time.monotonic()
        self._t = 0.0

    def now(self) -> float:
        return self._t

    def wall_now(self) -> float:
        """The wall clock read in engine seconds."""
        return (time.monotonic() - self._t0) / self.scale

    def deadline(self, t: float) -> float:
        """time.monotonic() value at which engine time t is due."""
        return self._t0 + t * self.scale

    def advance_to(self, t: float) -> None:
        if t > self._t:
            self._t = t


@dataclass(slots=True)
class _Sink:
    queue: asyncio.Queue[Event] | None  # None once the client is gone
    key: int  # the sequence's index in its HTTP request (a completion's choice)
    tag: object  # handed back to the recorder with the FinishedRequest
    arrival: float
    last_token: float | None = None
    new: int = 0  # tokens produced in the step being delivered


class Driver:
    def __init__(
        self,
        config: EngineConfig,
        scale: float,
        recorder: Recorder,
        max_lag: float = 0.05,
        dp: DpConfig | None = None,
    ) -> None:
        self.clock = ScaledClock(scale)
        # --data-parallel-size G > 1: G ranks stepping in lockstep (emulator/dp_engine.py)
        self.engine: Engine | DpEngine = (
            DpEngine(config, self.clock, dp)
            if dp is not None and dp.ranks > 1
            else Engine(config, self.clock)
        )
        self.recorder = recorder
        self.max_lag = max_lag  # wall seconds behind schedule before the cursor resyncs
        self._sinks: dict[str, _Sink] = {}
        self._wake = asyncio.Event()
        self._step_end: float | None = None  # engine time the in-flight step ends
        self._task: asyncio.Task[None] | None = None
        self._seq = 0
        self.after_step: Callable[[], None] | None = None  # the KV-event publisher's

    # -- request side -------------------------------------------------------------------

    def new_id(self) -> str:
        self._seq += 1
        return f"r{self._seq}"

    def submit(
        self, request: EngineRequest, queue: asyncio.Queue[Event], key: int, tag: object
    ) -> None:
        """Queue a request; its events go to `queue`. Raises ValueError like Engine.submit."""
        wall = self.clock.wall_now()
        self.clock.advance_to(wall if self._step_end is None else min(wall, self._step_end))
        self.engine.submit(request)
        self._sinks[request.id] = _Sink(queue, key, tag, request.arrival)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Drop a request whose client is gone; no-op once it has finished."""
        sink = self._sinks.pop(request_id, None)
        if sink is None:
            return
        if self._step_end is None:
            self.clock.advance_to(self.clock.wall_now())
        fin = self.engine.abort(request_id)
        if fin is not None:
            self.recorder.on_finished(fin, sink.tag)
        elif self._step_end is not None:
            # It finished inside the step now in flight: let delivery record it.
            sink.queue = None
            self._sinks[request_id] = sink

    @property
    def in_flight(self) -> int:
        return len(self._sinks)

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-driver")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        clock = self.clock
        busy = False
        while True:
            if not self.engine.has_work():
                busy = False
                self._wake.clear()
                await self._wake.wait()
                continue
            if not busy or (clock.wall_now() - clock.now()) * clock.scale > self.max_lag:
                clock.advance_to(clock.wall_now())
            busy = True
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("engine step failed; aborting all requests")
                self._abort_all()

    async def _step(self) -> None:
        clock = self.clock
        result = self.engine.step()
        end = result.start + result.duration
        self._step_end = end
        delay = clock.deadline(end) - time.monotonic()
        try:
            # Always yield once, so HTTP handlers run even when behind schedule.
            await asyncio.sleep(delay if delay > 0 else 0)
        finally:
            self._step_end = None
        clock.advance_to(end)
        if self.after_step is not None:
            self.after_step()
        self.recorder.on_step(result)
        self._deliver(result, end)

    def _deliver(self, result: StepResult, end: float) -> None:
        sinks = self._sinks
        touched: dict[str, _Sink] = {}
        gaps: list[tuple[float, object]] = []
        for rid in result.tokens:
            sink = sinks.get(rid)
            if sink is None:
                continue
            sink.new += 1
            if sink.last_token is not None:
                gaps.append((end - sink.last_token, sink.tag))
            else:
                self.recorder.on_first_token(end - sink.arrival, sink.tag)
            sink.last_token = end
            touched[rid] = sink
        if gaps:
            self.recorder.on_token_gaps(gaps)
        done: dict[str, FinishedRequest] = {}
        for fin in result.finished:
            sink = sinks.pop(fin.id, None)
            if sink is None:
                continue
            done[fin.id] = fin
            touched[fin.id] = sink
            self.recorder.on_finished(fin, sink.tag)
        for rid, sink in touched.items():
            new = sink.new
            sink.new = 0
            if sink.queue is not None:
                sink.queue.put_nowait((sink.key, new, done.get(rid)))

    def _abort_all(self) -> None:
        for rid in list(self._sinks):
            sink = self._sinks.pop(rid)
            try:
                fin = self.engine.abort(rid)
            except Exception:
                log.exception("abort of %s failed", rid)
                fin = None
            if fin is not None:
                self.recorder.on_finished(fin, sink.tag)
                if sink.queue is not None:
                    sink.queue.put_nowait((sink.key, 0, fin))
