"""Engine KV events applied to the prefix index (policies/kv_events.py), and the index's
removals (policies/prefix_index.py `remove`). The oracle for the re-hashed chains is the
engine model's own hashing (emulator/prefix.py), a separate implementation of the scheme."""

from __future__ import annotations

import pytest

from emulator.prefix import block_hashes
from policies.kv_events import KvEventApplier
from policies.prefix_index import PrefixIndex, token_block_hashes

BS = 4
IDS = list(range(100, 124))  # six full blocks of 4
ENGINE = [b"e%d" % i for i in range(6)]  # an engine's opaque 32-byte-like hashes


def stored(hashes: list[bytes], parent: bytes | None, ids: list[int]) -> list[object]:
    return ["BlockStored", hashes, parent, ids, BS, None, "GPU"]


def applier() -> KvEventApplier:
    return KvEventApplier(PrefixIndex(block_tokens=BS, ttl_s=1e9))


def test_stored_blocks_are_rehashed_into_the_engines_own_chain_in_pieces():
    a = applier()
    a.apply("w0", [stored(ENGINE[:2], None, IDS[:8])], 0.0)
    a.apply("w0", [stored(ENGINE[2:6], ENGINE[1], IDS[8:24])], 1.0)
    chain = block_hashes(IDS, BS)
    assert len(chain) == 6 and a.index.overlap("w0", chain) == 6
    assert a.index.overlap("w1", chain) == 0 and a.stored == 6
    # a prompt sharing the first three blocks only
    other = block_hashes([*IDS[:12], 1, 2, 3, 4], BS)
    assert a.index.overlap("w0", other) == 3


def test_a_removed_block_ends_the_prefix_there_as_the_engines_match_does():
    a = applier()
    a.apply("w0", [stored(ENGINE, None, IDS)], 0.0)
    a.apply("w0", [["BlockRemoved", [ENGINE[3]], "GPU"]], 1.0)
    chain = block_hashes(IDS, BS)
    assert a.index.overlap("w0", chain) == 3 and a.removed == 1
    a.apply("w0", [["BlockRemoved", [ENGINE[0], b"unknown"]]], 2.0)
    assert a.index.overlap("w0", chain) == 0 and a.removed == 2


def test_all_blocks_cleared_and_an_unknown_parent():
    a = applier()
    a.apply("w0", [stored(ENGINE[:2], None, IDS[:8])], 0.0)
    a.apply("w1", [stored(ENGINE[:1], None, IDS[:4])], 0.0)
    a.apply("w0", [["AllBlocksCleared"]], 1.0)
    chain = block_hashes(IDS, BS)
    assert a.index.overlap("w0", chain) == 0 and a.index.overlap("w1", chain) == 1
    # after the clear, a child of a block it no longer knows cannot be placed
    a.apply("w0", [stored(ENGINE[2:3], ENGINE[1], IDS[8:12])], 2.0)
    assert a.unplaced == 1 and a.index.blocks_of("w0") == 0


@pytest.mark.parametrize(
    "event",
    [
        [],
        ["Nope"],
        ["BlockStored", [b"x"]],
        ["BlockStored", [b"x"], None, [1, 2, 3], BS],  # a partial block
        ["BlockStored", [b"x"], None, [1, 2, 3, 4], 16],  # not the index's block size
        ["BlockRemoved", "x"],
    ],
)
def test_malformed_events_raise(event: list[object]):
    with pytest.raises(ValueError):
        applier().apply("w0", [event], 0.0)


def test_token_chains_extend_from_a_parent():
    whole = token_block_hashes(IDS, BS)
    assert token_block_hashes(IDS[8:], BS, whole[1]) == whole[2:]
    assert whole == block_hashes(IDS, BS)


def test_remove_keeps_the_bound_count_and_forgets_empty_workers():
    index = PrefixIndex(block_tokens=BS, ttl_s=100.0, max_blocks=10)
    chain = token_block_hashes(IDS, BS)
    index.record("w0", chain, 0.0)
    assert len(index) == 6 and index.remove("w0", chain[4:]) == 2 and len(index) == 4
    assert index.overlap("w0", chain) == 4 and index.remove("w9", chain) == 0
    assert index.remove("w0", chain) == 4 and len(index) == 0 and index.workers() == []


def test_a_lost_block_removed_ages_out_after_the_ttl():
    a = KvEventApplier(PrefixIndex(block_tokens=BS, ttl_s=10.0))
    a.apply("w0", [stored(ENGINE[:3], None, IDS[:12])], 0.0)
    # (the BlockRemoved of these blocks is lost) — at 8 s the engine extends the second
    # block: the map keeps the parent it used, and the index hears the children
    a.apply("w0", [stored(ENGINE[2:3], ENGINE[1], IDS[8:12])], 8.0)
    chain = block_hashes(IDS[:12], BS)
    assert a.index.overlap("w0", chain, 9.0) == 3
    # one TTL after the first store: the first block is gone from the index, and with it
    # the prefix (the engine's match would start there)
    assert a.index.overlap("w0", chain, 10.5) == 0
    a.apply("w1", [], 10.5)  # another worker's batch does not age w0's map
    assert a.mapped("w0") == 3
    a.apply("w0", [], 10.5)  # w0's next batch: the first block's mapping expires
    assert a.mapped("w0") == 2 and a.mapped() == 2
    a.apply("w0", [], 18.5)  # the rest, stored or extended at 8 s, one TTL later
    assert a.mapped() == 0
    # the memory back: the index's three entries (two stored at 0 s, one at 8 s)
    assert a.index.evict(18.5) == 3 and len(a.index) == 0
    # a removal arriving for a forgotten block changes nothing
    a.apply("w0", [["BlockRemoved", ENGINE[:3]]], 19.0)
    assert a.removed == 0 and a.mapped() == 0


def test_the_maps_and_the_index_never_exceed_their_bounds_over_workers():
    import random

    rng = random.Random(7)
    bound = 9
    a = KvEventApplier(PrefixIndex(block_tokens=BS, ttl_s=50.0, max_blocks=bound), bound)
    parents: dict[str, list[bytes]] = {}
    for step in range(400):
        worker = f"w{rng.randrange(3)}"
        now = step * 0.5
        kind = rng.random()
        known = parents.setdefault(worker, [])
        if kind < 0.6:
            n = rng.randint(1, 5)
            parent = rng.choice(known) if known and rng.random() < 0.5 else None
            hashes = [b"%s-%d-%d" % (worker.encode(), step, i) for i in range(n)]
            ids = [rng.randrange(1000) for _ in range(n * BS)]
            a.apply(worker, [stored(hashes, parent, ids)], now)
            known.extend(hashes)
        elif kind < 0.9 and known:
            a.apply(worker, [["BlockRemoved", rng.sample(known, min(3, len(known)))]], now)
        else:
            a.apply(worker, [["AllBlocksCleared"]], now)
            known.clear()
        assert a.mapped() == sum(a.mapped(w) for w in ("w0", "w1", "w2")) <= bound
        assert len(a.index) <= bound
    assert a.stored > bound and a.unplaced > 0  # the bound bit, and parents were lost
