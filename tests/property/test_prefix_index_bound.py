"""The prefix index never holds more than its bound, whatever is recorded, forgotten,
removed (an engine's eviction, from inside a chain) or evicted; it never claims a block that was not sent within the TTL, and while the bound has
not bitten it answers exactly what a plain model (every send remembered) answers."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.prefix_index import PrefixIndex, token_block_hashes

# real chains: block i's hash covers blocks 0..i (few symbols, so prompts share prefixes)
chains = st.lists(st.integers(0, 3), min_size=0, max_size=12).map(
    lambda blocks: token_block_hashes(blocks, 1)
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from("abcd"), chains, st.floats(0, 5)),
        st.tuples(st.just("forget"), st.sampled_from("abcd")),
        st.tuples(st.just("remove"), st.sampled_from("abcd"), chains),  # an engine evicted
        st.tuples(st.just("evict"), st.floats(0, 5)),
        st.tuples(st.just("overlap"), st.sampled_from("abcd"), chains),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(bound=st.integers(1, 20), ttl=st.floats(0.5, 20), ops=ops)
def test_never_over_the_bound(bound, ttl, ops):
    ix = PrefixIndex(ttl_s=ttl, max_blocks=bound)
    sent: dict[tuple[str, int], float] = {}  # the plain model: (worker, block) → last sent
    bitten = False
    now = 0.0
    for op in ops:
        if op[0] == "record":
            _, worker, chain, dt = op
            now += dt
            ix.record(worker, chain, now)
            sent.update({(worker, h): now for h in chain})
            bitten |= len({k for k, t in sent.items() if t >= now - ttl}) > bound
        elif op[0] == "forget":
            ix.forget(op[1])
            sent = {k: t for k, t in sent.items() if k[0] != op[1]}
        elif op[0] == "remove":
            ix.remove(op[1], op[2])
            for h in op[2]:
                sent.pop((op[1], h), None)
        elif op[0] == "evict":
            now += op[1]
            ix.evict(now)
        else:
            worker, chain = op[1], op[2]
            matched = ix.overlap(worker, chain, now)
            exact = 0
            while exact < len(chain) and sent.get((worker, chain[exact]), -math.inf) >= now - ttl:
                exact += 1
            assert 0 <= matched <= exact
            if not bitten:
                assert matched == exact
        assert len(ix) <= bound
        assert len(ix) == sum(ix.blocks_of(w) for w in ix.workers())
