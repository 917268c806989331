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
    for _ in range(3):  # three band requests: two compressible, one (code) never tried
        h.band()
    h.compression(True)
    h.compression(False)
    assert h.document()["compression"] == {"borderline": 3, "attempted": 2, "succeeded": 1}


def test_a_quiet_spell_longer_than_a_window_leaves_no_stale_traffic():
    """Before: windows only rotated when the clock was read, and the one that rotated out
    was kept as "previous" however long ago it ended, so after a burst and ten quiet
    minutes (two 5-minute windows) the document still reported the burst's requests, over
    an elapsed time stretched back to the burst, as the current traffic."""
    clock = ManualClock(0.0)
    h = TrafficHistogram(60.0, clock.now)
    for _ in range(100):
        h.observe(1000, 900)
    clock.advance(30)
    assert h.document()["requests"] == 100
    clock.advance(100)  # t = 130: the burst's window [0, 60) ended 70 s ago
    doc = h.document()
    assert doc["requests"] == 0 and doc["arrival_rate"] == 0.0
    assert sum(n for _, n in doc["buckets"]) == 0 and "input_fraction" not in doc
    assert 60 <= doc["window_s"] <= 120  # still a full window's worth of (empty) history
    # new traffic is counted on its own, at its own rate
    h.observe(1000, 900)
    clock.advance(10)  # t = 140: previous [60, 120), current [120, 180)
    doc = h.document()
    assert doc["requests"] == 1 and doc["window_s"] == 80.0
    assert doc["arrival_rate"] == round(1 / 80, 6)


def test_one_window_later_the_previous_window_is_still_reported():
    clock = ManualClock(0.0)
    h = TrafficHistogram(60.0, clock.now)
    h.observe(100, 50)
    clock.advance(90)  # t = 90: [0, 60) is the previous window, [60, 120) the current
    doc = h.document()
    assert doc["requests"] == 1 and doc["window_s"] == 90.0
    clock.advance(30)  # t = 120: [0, 60) falls out
    assert h.document()["requests"] == 0
