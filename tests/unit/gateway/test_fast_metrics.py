"""The proxy's fast metric updates (gateway/metrics.py `FastCounter`, `FastHistogram`)
against prometheus_client's own `inc` and `observe` (the oracle): the same exposition."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import FastCounter, FastHistogram

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
amounts = st.lists(
    st.one_of(
        st.sampled_from(BUCKETS),  # on a bound: that bucket (le is inclusive)
        st.floats(min_value=0.0, max_value=20.0, allow_nan=False),
        st.integers(min_value=0, max_value=10**6).map(float),
    ),
    max_size=40,
)


def _exposition(registry: CollectorRegistry) -> list[str]:
    # creation timestamps differ between the two registries
    return [ln for ln in generate_latest(registry).decode().splitlines() if "_created" not in ln]


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    r = CollectorRegistry()
    return r, Histogram("x", "x", ["pool"], buckets=BUCKETS, registry=r).labels("short")


def _counter() -> tuple[CollectorRegistry, Counter]:
    r = CollectorRegistry()
    return r, Counter("x", "x", ["pool"], registry=r).labels("short")


@given(amounts)
def test_histogram_as_the_library(values: list[float]) -> None:
    (lib_r, lib), (fast_r, child) = _histogram(), _histogram()
    fast = FastHistogram(child)
    for v in values:
        lib.observe(v)
        fast.observe(v)
    assert _exposition(fast_r) == _exposition(lib_r)


@given(amounts)
def test_counter_as_the_library(values: list[float]) -> None:
    (lib_r, lib), (fast_r, child) = _counter(), _counter()
    fast = FastCounter(child)
    for v in values:
        lib.inc(v)
        fast.inc(v)
    assert _exposition(fast_r) == _exposition(lib_r)


def test_falls_back_to_the_public_api() -> None:
    """A library version without the private values still counts (more slowly)."""

    class Plain:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def inc(self, amount: float = 1) -> None:
            self.seen.append(amount)

        def observe(self, amount: float) -> None:
            self.seen.append(amount)

    c, h = Plain(), Plain()
    FastCounter(c).inc(2.0)  # type: ignore[arg-type]
    FastHistogram(h).observe(0.3)  # type: ignore[arg-type]
    assert c.seen == [2.0] and h.seen == [0.3]


def test_other_value_classes_keep_their_own_inc() -> None:
    """Only the library's in-process value is added to without its lock; any other value
    class (multiprocess mode's file-backed one) is updated through its own `inc`."""

    class FileBacked:
        def __init__(self) -> None:
            self._value = 0.0
            self.calls = 0

        def inc(self, amount: float) -> None:
            self.calls += 1
            self._value += amount

    class Child:
        def __init__(self) -> None:
            self._value = FileBacked()

    child = Child()
    FastCounter(child).inc(3.0)  # type: ignore[arg-type]
    assert child._value.calls == 1 and child._value._value == 3.0
