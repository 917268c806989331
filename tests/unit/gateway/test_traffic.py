from gateway.traffic import BOUNDS, SCHEMA, TrafficHistogram
from policies.clock import ManualClock


def test_buckets_rate_and_input_fraction():
    clock = ManualClock(100.0)
    h = TrafficHistogram(60.0, clock.now)
    for total, prompt in [(10, 5), (64, 60), (65, 60), (8192, 8000), (70000, 69000)]:
        h.observe(total, prompt)
    clock.advance(10)
    doc = h.document({"b_short": 8192, "gamma": 1.0, "n_short": 2, "n_long": 1})
    assert doc["schema"] == SCHEMA
    counts = dict(map(tuple, doc["buckets"]))
    assert counts[64] == 2 and counts[128] == 1 and counts[8192] == 1
    assert doc["overflow"] == 1 and doc["requests"] == 5
    assert sum(counts.values()) + doc["overflow"] == doc["requests"]
    assert doc["window_s"] == 10.0 and doc["arrival_rate"] == 0.5
    assert doc["input_fraction"] == round(
        sum([5, 60, 60, 8000, 69000]) / sum([10, 64, 65, 8192, 70000]), 6
    )
    assert doc["current"]["n_short"] == 2
    assert [b for b, _ in doc["buckets"]] == list(BOUNDS)


def test_windows_rotate_and_keep_one_complete_window():
    clock = ManualClock(0.0)
    h = TrafficHistogram(60.0, clock.now)
    h.observe(100, 50)
    clock.advance(61)
    h.observe(100, 50)  # opens a new window; the first is kept as the previous one
    assert h.document()["requests"] == 2
    clock.advance(61)
    h.observe(100, 50)  # the oldest window falls out
    doc = h.document()
    assert doc["requests"] == 2
    assert 61 <= doc["window_s"] <= 122


def test_compression_counts():
    h = TrafficHistogram(60.0, ManualClock(0.0).now)
    h.compression(True)
    h.compression(False)
    assert h.document()["compression"] == {"attempted": 2, "succeeded": 1}
