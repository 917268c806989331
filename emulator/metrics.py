"""Prometheus exposition of the emulated engine, per personality (WIRE_SPEC §6).

Series are plain accumulators (`_Family`) fed by the driver's hooks and rendered at
scrape time through prometheus_client's own encoders, so the text format (label
sorting, float spelling, `_created` gauges, OpenMetrics negotiation) is the library's:

- vLLM: a single-process registry → counters and histograms carry `_created`; the
  default process/gc/platform collectors are registered; `http_*` series mimic
  prometheus-fastapi-instrumentator (handlers /metrics, /health, /ping, /version, /load
  and /server_info excluded); Content-Type is always the library's latest text format.
- SGLang: a multiprocess-style registry → no `_created`, histograms listed `_sum`,
  buckets, `_count` as MultiProcessCollector emits them; tokenizer series appear on first
  use; Accept-negotiated (text 0.0.4 by default, OpenMetrics 1.0 if asked).

Gauges (running, waiting, KV usage) are read from the engine at scrape time, so they
are exact at every scrape (real SGLang refreshes them every few steps). Counters of
tokens, prefix-cache lookups and preemptions come from `EngineStats`; per-request
histograms are observed when a request finishes, TTFT at its first token. Every duration
is in engine seconds.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString as _go_float

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class RequestTag:
    """What the recorder needs to know about the request an engine request belongs to."""

    streaming: bool
    max_tokens: int  # effective max_tokens of the engine request
    n: int = 1
    internal: bool = False  # SGLang's /health generation: engine load, not a request


@dataclass(slots=True)
class _Series:
    value: float = 0.0
    created: float = field(default_factory=time.time)
    buckets: list[float] | None = None  # per-bucket (not cumulative) counts
    count: float = 0.0


class _Family:
    def __init__(
        self, name: str, doc: str, kind: str, buckets: Iterable[float] = (), created: bool = True
    ) -> None:
        self.name = name  # without _total for counters
        self.doc = doc
        self.kind = kind  # counter | gauge | histogram | summary
        self.bounds = [*buckets, float("inf")] if kind == "histogram" else []
        self.created = created
        self.series: dict[Labels, _Series] = {}

    def _get(self, labels: Labels) -> _Series:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = _Series(
                buckets=[0.0] * len(self.bounds) if self.bounds else None
            )
        return s

    def touch(self, labels: Labels) -> None:
        self._get(labels)

    def set(self, labels: Labels, value: float) -> None:
        self._get(labels).value = value

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self._get(labels).value += amount

    def observe(self, labels: Labels, value: float) -> None:
        s = self._get(labels)
        s.value += value
        s.count += 1
        if s.buckets is not None:
            for i, b in enumerate(self.bounds):
                if value <= b:
                    s.buckets[i] += 1
                    break

    def metric(self, sum_first: bool) -> Metric:
        m = Metric(self.name, self.doc, self.kind)
        for labels, s in self.series.items():
            d = dict(labels)
            if self.kind == "counter":
                m.add_sample(self.name + "_total", d, s.value)
            elif self.kind == "gauge":
                m.add_sample(self.name, d, s.value)
            elif self.kind == "summary":
                m.add_sample(self.name + "_count", d, s.count)
                m.add_sample(self.name + "_sum", d, s.value)
            else:
                if sum_first:
                    m.add_sample(self.name + "_sum", d, s.value)
                acc = 0.0
                for b, c in zip(self.bounds, s.buckets or (), strict=True):
                    acc += c
                    m.add_sample(self.name + "_bucket", {**d, "le": _le(b)}, acc)
                m.add_sample(self.name + "_count", d, s.count)
                if not sum_first:
                    m.add_sample(self.name + "_sum", d, s.value)
            if self.created and self.kind != "gauge":
                m.add_sample(self.name + "_created", d, s.created)
        return m


def _le(bound: float) -> str:
    """Bucket bounds spelled as prometheus_client spells them ("0.001", "1.0", "+Inf")."""
    # prometheus_client.utils.floatToGoString has no annotations (a stub gap)
    text: str = _go_float(bound)  # type: ignore[no-untyped-call]
    return text


class _Collector:
    def __init__(self, families: Callable[[], list[_Family]], sum_first: bool) -> None:
        self._families = families
        self._sum_first = sum_first

    def collect(self) -> Iterable[Metric]:
        return [f.metric(self._sum_first) for f in self._families()]


class Throughput:
    """Generated tokens per engine second over a trailing window (SGLang's gen_throughput)."""

    def __init__(self, window: float = 5.0) -> None:
        self.window = window
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, t: float, total_tokens: int) -> None:
        self._samples.append((t, total_tokens))
        while len(self._samples) > 2 and self._samples[1][0] < t - self.window:
            self._samples.popleft()

    def rate(self, now: float) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        if now - t1 > self.window or t1 <= t0:
            return 0.0
        return (n1 - n0) / (t1 - t0)


class Exposition:
    """A registry built from families plus (vLLM) the default collectors."""

    def __init__(self, families: Callable[[], list[_Family]], *, single_process: bool) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.single_process = single_process
        if single_process:
            GCCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            ProcessCollector(registry=self.registry)
        self.registry.register(_Collector(families, sum_first=not single_process))

    def render(self, accept: str) -> tuple[bytes, str]:
        if self.single_process:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


def build_1_2_5(limit: int) -> list[float]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, … up to `limit`."""
    out: list[float] = []
    base = 1
    while True:
        for m in (1, 2, 5):
            v = m * base
            if v > limit:
                return out
            out.append(float(v))
        base *= 10
