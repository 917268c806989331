"""The gateway's prefix index (policies/quantile/prefix_index.py): longest prefix sent to
a worker, buckets, TTL, and the hard memory bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.quantile.prefix_index import HIGH, NONE, PARTIAL, PrefixIndex


def chain(*blocks: int) -> tuple[int, ...]:
    """Chained block hashes, as the engines compute them: block i's hash covers 0..i."""
    out, h = [], 0
    for b in blocks:
        h = hash((h, b))
        out.append(h)
    return tuple(out)


def test_longest_prefix_per_worker_in_tokens():
    idx = PrefixIndex(block_tokens=16, stride=1)
    sent = chain(1, 2, 3, 4)
    idx.add("w0", sent, 0.0)
    assert idx.locality("w0", chain(1, 2, 3, 4, 5, 6), 100, 1.0) == 64
    assert idx.locality("w0", chain(1, 2, 9), 100, 1.0) == 32
    assert idx.locality("w0", chain(9, 2), 100, 1.0) == 0
    assert idx.locality("w1", sent, 100, 1.0) == 0  # never sent to w1
    assert idx.locality("w0", sent, 40, 1.0) == 40  # never more than the prompt
    assert idx.best_locality(chain(1, 2, 7), 100, 1.0) == 32


def test_a_stride_indexes_every_nth_block_and_knows_locality_to_it():
    idx = PrefixIndex(block_tokens=16, stride=4)
    sent = chain(*range(10))
    idx.add("w0", sent, 0.0)
    assert len(idx) == 3  # blocks 0, 4, 8
    assert idx.matched_blocks("w0", sent, 0.0) == 9
    assert idx.matched_blocks("w0", chain(*range(7), 99), 0.0) == 5


def test_buckets():
    idx = PrefixIndex(high_fraction=0.5)
    assert idx.bucket(0, 1000) == NONE
    assert idx.bucket(100, 1000) == PARTIAL
    assert idx.bucket(500, 1000) == HIGH


def test_entries_expire_after_the_ttl():
    idx = PrefixIndex(ttl_s=10.0, stride=1)
    idx.add("w0", chain(1, 2), 0.0)
    assert idx.matched_blocks("w0", chain(1, 2), 9.0) == 2
    assert idx.matched_blocks("w0", chain(1, 2), 10.5) == 0
    idx.add("w1", chain(3), 20.0)
    assert idx.sweep(20.0) == 2 and len(idx) == 1


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.lists(st.integers(0, 5), min_size=1, max_size=12)),
        max_size=60,
    ),
    st.integers(1, 40),
    st.integers(1, 4),
)
def test_memory_is_bounded_and_what_remains_of_a_prefix_is_a_prefix(sends, bound, stride):
    idx = PrefixIndex(max_entries=bound, ttl_s=1e9, stride=stride)
    for t, (worker, blocks) in enumerate(sends):
        hashes = chain(*blocks)
        idx.add(f"w{worker}", hashes, float(t))
        assert len(idx) <= bound
        # the binary search agrees with a linear scan from the front
        for w in ("w0", "w1", "w2", "w3"):
            n = idx.matched_blocks(w, hashes, float(t))
            linear = 0
            for i in range(0, len(hashes), stride):
                at = idx._blocks.get(hashes[i])
                if at is None or w not in at:
                    break
                linear = i + 1
            assert n == linear
