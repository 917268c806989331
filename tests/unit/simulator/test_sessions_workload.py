"""The multi-turn sessions workload of the cache-routing experiments
(tests/experiments/cache_routing.py `sessions`): a turn's KV block chain extends the
previous turn's, conversations on one system prompt share exactly its full blocks."""

from __future__ import annotations

import itertools

from tests.experiments.cache_routing import BLOCK, Workload, sessions


def test_turns_extend_their_conversation_and_templates_are_shared():
    w = Workload(templates=3, zipf_s=0.0)
    seqs = sessions(w, clients=4, per_client=30, seed=5)
    assert all(len(s) == 30 for s in seqs)
    by_conv: dict[str, list] = {}
    for seq in seqs:
        for spec in seq:
            by_conv.setdefault(spec.session, []).append(spec)
            assert len(spec.prefix_hashes) == spec.prompt_tokens // BLOCK
            assert spec.prompt_tokens + w.output_max <= w.context
    multi = [turns for turns in by_conv.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for a, b in itertools.pairwise(turns):
            # the next prompt is this one, its answer and a new message: a longer chain
            assert b.prompt_tokens > a.prompt_tokens + a.output_tokens
            assert b.prefix_hashes[: len(a.prefix_hashes)] == a.prefix_hashes
    # first blocks: one of three system prompts, so at most three distinct first hashes
    firsts = {t[0].prefix_hashes[0] for t in by_conv.values()}
    assert 1 < len(firsts) <= 3
    # two conversations share a prefix only through their system prompt: short of the
    # whole chain (their own turns differ from the block the system prompt ends in)
    a, b = (t[0] for t in list(by_conv.values())[:2])
    shared = next(
        (
            i
            for i, (x, y) in enumerate(zip(a.prefix_hashes, b.prefix_hashes, strict=False))
            if x != y
        ),
        min(len(a.prefix_hashes), len(b.prefix_hashes)),
    )
    assert shared < len(a.prefix_hashes)
