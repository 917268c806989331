"""What the gateway has seen: a windowed histogram of L_total, for the planner.

Every placed request adds its L_total (estimated prompt tokens + max_tokens, the figure
placement decides on) to a histogram whose bucket bounds are the breakpoints of the
shipped workload CDFs (64 … 65,536 tokens), so an observed CDF compares directly with
them. Two windows rotate, tiling time in steps of `window_s` from start: the document
covers the last complete window plus the current one, so it describes between `window_s`
and 2·`window_s` seconds once the gateway has run that long, and never traffic older than
that (after a quiet spell both windows are empty: 0 requests, rate 0). The hot-path cost
is one bisect and four additions.

The document is `fleetgate.plan_histogram/v1` (policies/planner/live.py), served at
GET /admin/plan/histogram and planned on at GET /admin/plan.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

BOUNDS = (
    64,
    128,
    256,
    512,
    768,
    1024,
    1536,
    2048,
    3072,
    4096,
    6144,
    8192,
    12288,
    16384,
    24576,
    32768,
    49152,
    65536,
)
SCHEMA = "fleetgate.plan_histogram/v1"


class _Window:
    __slots__ = (
        "attempted",
        "borderline",
        "counts",
        "overflow",
        "prompt_tokens",
        "requests",
        "start",
        "succeeded",
        "total_tokens",
    )

    def __init__(self, start: float) -> None:
        self.start = start
        self.counts = [0] * len(BOUNDS)
        self.overflow = 0
        self.requests = 0
        self.prompt_tokens = 0
        self.total_tokens = 0
        self.borderline = 0
        self.attempted = 0
        self.succeeded = 0


class TrafficHistogram:
    def __init__(self, window_s: float, now: Callable[[], float]) -> None:
        self.window_s = window_s
        self.now = now
        self._current = _Window(now())
        self._previous: _Window | None = None

    def _window(self) -> _Window:
        t = self.now()
        elapsed = t - self._current.start
        if elapsed >= self.window_s:
            # windows tile time from the first one's start, so a window never stretches
            # over a quiet spell: after n ≥ 2 windows without traffic the previous window
            # is an empty one, not the last window that saw requests
            n = int(elapsed // self.window_s)
            start = self._current.start + n * self.window_s
            if n == 1:
                self._previous = self._current
            else:
                self._previous = _Window(start - self.window_s)
            self._current = _Window(start)
        return self._current

    def observe(self, total_tokens: int, prompt_tokens: int) -> None:
        w = self._window()
        w.requests += 1
        i = bisect_left(BOUNDS, total_tokens)
        if i == len(BOUNDS):
            w.overflow += 1
        else:
            w.counts[i] += 1
        w.prompt_tokens += prompt_tokens
        w.total_tokens += total_tokens

    def band(self) -> None:
        """A request placed in the C&R band B_short < L_total ≤ γ·B_short, whatever its
        category: code and requests C&R never tries count here too, so the planner's p_c
        (succeeded / borderline) is the share of the band that reaches the short pool."""
        self._window().borderline += 1

    def compression(self, succeeded: bool) -> None:
        """A borderline request that Compress-and-Route tried to fit into the short pool."""
        w = self._window()
        w.attempted += 1
        w.succeeded += succeeded

    def document(self, current: dict[str, Any] | None = None) -> dict[str, Any]:
        cur = self._window()
        windows = [cur] if self._previous is None else [self._previous, cur]
        elapsed = max(self.now() - windows[0].start, 1e-3)
        total = sum(w.total_tokens for w in windows)
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "window_s": round(elapsed, 3),
            "requests": sum(w.requests for w in windows),
            "buckets": [[b, sum(w.counts[i] for w in windows)] for i, b in enumerate(BOUNDS)],
            "overflow": sum(w.overflow for w in windows),
            "compression": {
                "borderline": sum(w.borderline for w in windows),
                "attempted": sum(w.attempted for w in windows),
                "succeeded": sum(w.succeeded for w in windows),
            },
        }
        doc["arrival_rate"] = round(doc["requests"] / elapsed, 6)
        if total:
            doc["input_fraction"] = round(sum(w.prompt_tokens for w in windows) / total, 6)
        if current is not None:
            doc["current"] = current
        return doc
