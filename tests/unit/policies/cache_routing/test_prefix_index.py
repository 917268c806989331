"""The cache-aware routers' prefix index (policies/prefix_index.py): overlap arithmetic,
TTL and LRU aging, forget/evict, and the hash chains against the engine model's."""

import pytest

from emulator.prefix import block_hashes as engine_block_hashes
from policies.clock import ManualClock
from policies.prefix_index import PrefixIndex, byte_block_hashes, token_block_hashes


def test_overlap_counts_leading_blocks_sent_to_that_worker():
    ix = PrefixIndex()
    ix.record("a", (1, 2, 3, 4), now=0.0)
    assert ix.overlap("a", (1, 2, 3, 4)) == 4
    assert ix.overlap("a", (1, 2, 3, 4, 5, 6)) == 4  # a longer prompt: its first 4
    assert ix.overlap("a", (1, 2)) == 2
    assert ix.overlap("a", (9, 2, 3)) == 0  # chained: a different first block, nothing
    assert ix.overlap("b", (1, 2, 3, 4)) == 0
    assert ix.overlap("a", ()) == 0
    assert len(ix) == 4 and ix.blocks_of("a") == 4 and ix.blocks_of("b") == 0


def test_shared_prefix_of_two_prompts_is_held_once():
    ix = PrefixIndex()
    ix.record("a", (1, 2, 3), 0.0)
    ix.record("a", (1, 2, 7, 8), 1.0)
    assert len(ix) == 5
    assert ix.overlap("a", (1, 2, 3)) == 3
    assert ix.overlap("a", (1, 2, 7, 8, 9)) == 4
    assert ix.overlap("a", (1, 2, 5)) == 2


def test_ttl_with_an_injected_clock():
    clock = ManualClock()
    ix = PrefixIndex(ttl_s=10.0, clock=clock)
    ix.record("a", (1, 2, 3), now=0.0)
    clock.set(10.0)
    assert ix.overlap("a", (1, 2, 3)) == 3  # exactly at the TTL: still held
    ix.record("a", (1, 2), now=5.0)  # the first two blocks sent again at 5
    clock.set(12.0)
    assert ix.overlap("a", (1, 2, 3)) == 2
    clock.set(15.5)
    assert ix.overlap("a", (1, 2, 3)) == 0
    assert ix.evict() == 3 and len(ix) == 0 and ix.workers() == []


def test_ttl_without_a_clock_follows_the_latest_record():
    ix = PrefixIndex(ttl_s=10.0)
    ix.record("a", (1, 2), 0.0)
    ix.record("b", (5,), 11.0)
    assert ix.overlap("a", (1, 2)) == 0
    assert ix.overlap("a", (1, 2), now=3.0) == 2


def test_lru_evicts_least_recent_over_all_workers_and_keeps_prefixes():
    ix = PrefixIndex(max_blocks=6)
    ix.record("a", (1, 2, 3, 4), 0.0)
    ix.record("b", (1, 2, 3), 1.0)  # 7 > 6: a's last block (its least recent) goes
    assert len(ix) == 6
    assert ix.overlap("a", (1, 2, 3, 4)) == 3
    assert ix.overlap("b", (1, 2, 3)) == 3
    ix.record("c", (8, 9, 10, 11, 12), 2.0)  # 11 > 6: all of a's, then b's oldest two
    assert len(ix) == 6
    assert ix.overlap("a", (1, 2, 3, 4)) == 0
    assert ix.overlap("b", (1, 2, 3)) == 1
    assert ix.overlap("c", (8, 9, 10, 11, 12)) == 5


def test_a_chain_longer_than_the_bound_keeps_its_first_blocks():
    ix = PrefixIndex(max_blocks=3)
    ix.record("a", tuple(range(1, 11)), 0.0)
    assert len(ix) == 3 and ix.overlap("a", tuple(range(1, 11))) == 3


def test_forget_and_evict_to_a_smaller_size():
    ix = PrefixIndex()
    ix.record("a", (1, 2, 3), 0.0)
    ix.record("b", (1, 2), 1.0)
    assert ix.forget("a") == 3 and ix.forget("a") == 0
    assert len(ix) == 2 and ix.overlap("a", (1, 2, 3)) == 0
    assert ix.evict(max_blocks=1) == 1 and len(ix) == 1
    assert ix.overlap("b", (1, 2)) == 1


def test_bad_parameters_fail():
    for kw in ({"block_tokens": 0}, {"ttl_s": 0.0}, {"max_blocks": 0}):
        with pytest.raises(ValueError):
            PrefixIndex(**kw)


def test_token_chain_is_the_engine_models_chain():
    """The gateway-side chain from token ids is the engine model's (an independent
    implementation, emulator/prefix.py), so overlaps are counted in its cache's keys."""
    tokens = list(range(1000, 1000 + 16 * 7 + 5))
    for bs in (1, 16, 32):
        assert token_block_hashes(tokens, bs) == engine_block_hashes(tokens, bs)
    assert token_block_hashes(tokens[:15], 16) == ()


def test_byte_chain_is_prefix_closed_and_deterministic():
    a = b"system prompt " * 100 + b"question one"
    b = b"system prompt " * 100 + b"another question entirely"
    ha, hb = byte_block_hashes(a, 64), byte_block_hashes(b, 64)
    common = len(b"system prompt " * 100) // 64
    assert ha[:common] == hb[:common] and ha[common] != hb[common]
    assert len(ha) == len(a) // 64
    # a known value: stable across processes and machines (BLAKE2b, not Python's hash)
    assert byte_block_hashes(b"x" * 8, 8) == (byte_block_hashes(b"x" * 8, 8)[0],)
    import hashlib

    first = hashlib.blake2b(b"fleetgate-prefix", digest_size=8)
    first.update(b"x" * 8)
    assert byte_block_hashes(b"x" * 8, 8)[0] == int.from_bytes(first.digest(), "big")
