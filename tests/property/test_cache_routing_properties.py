"""Properties of the cache-aware routing pieces over random inputs: the softmax's
invariances, session affinity's load bound, and the active-block accounting returning to
zero whatever the interleaving of dispatches, retries and completions."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.routing import make_router
from policies.routing.kv_state import KvState
from policies.routing.softmax import softmax_probabilities
from policies.types import Outcome, RequestInfo, Status, WorkerView

costs = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(
    costs=costs,
    tau=st.floats(0.05, 50.0),
    scale=st.floats(1e-3, 1e3),
    shift=st.floats(-1e6, 1e6),
)
def test_softmax_is_a_distribution_invariant_to_affine_maps(costs, tau, scale, shift):
    p = softmax_probabilities(costs, tau)
    assert math.isclose(math.fsum(p), 1.0, rel_tol=1e-9)
    assert all(0.0 <= x <= 1.0 for x in p)
    # the cheapest is the likeliest
    best = min(range(len(costs)), key=costs.__getitem__)
    assert p[best] == max(p)
    lo, hi = min(costs), max(costs)
    if hi - lo > 1e-6 * max(1.0, abs(lo), abs(hi)):  # a spread the floats can still scale
        q = softmax_probabilities([scale * c + shift for c in costs], tau)
        assert all(
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12) for a, b in zip(p, q, strict=True)
        )


@settings(max_examples=200, deadline=None)
@given(
    loads=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    session=st.text(min_size=1, max_size=12),
    balance=st.floats(1.0, 3.0),
)
def test_session_affinity_never_exceeds_the_load_bound(loads, session, balance):
    router = make_router("session_affinity", {"balance": balance})
    views = [WorkerView(f"w{i}", "p", 8192, in_flight=n) for i, n in enumerate(loads)]
    got = router.choose(RequestInfo("r", "m", 0.0, 10, 10, session=session), views)
    assert got is not None
    cap = math.ceil(balance * (sum(loads) + 1) / len(loads))
    assert got.load + 1 <= cap
    again = router.choose(RequestInfo("r2", "m", 0.0, 10, 10, session=session), views)
    assert again.id == got.id  # the same state, the same worker


events = st.lists(
    st.tuples(
        st.sampled_from(["dispatch", "complete"]),
        st.integers(0, 5),  # request
        st.integers(0, 2),  # worker
        st.integers(0, 80),  # prompt tokens
        st.integers(0, 3),  # how many of the shared blocks it starts with
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_active_blocks_return_to_zero_after_every_request_ends(evs):
    state = KvState(block_size=16)
    state.seen([WorkerView(f"w{i}", "p", 8192) for i in range(3)])
    shared = (11, 12, 13)
    live: dict[int, RequestInfo] = {}
    for kind, r, w, prompt, k in evs:
        if kind == "dispatch":
            req = live.get(r) or RequestInfo(f"r{r}", "m", 0.0, prompt, 5, prefix_hashes=shared[:k])
            live[r] = req
            state.on_dispatch(req, f"w{w}", 0.0)
        elif r in live:
            state.on_complete(live.pop(r), Outcome(Status.OK), 0.0)
        for i in range(3):  # never negative, never more than the prompts in flight
            assert (
                0
                <= state.active_blocks(f"w{i}")
                <= sum(-(-q.prompt_tokens // 16) + len(q.prefix_hashes) for q in live.values())
            )
    for req in live.values():
        state.on_complete(req, Outcome(Status.DISCONNECT), 0.0)
    assert all(state.active_blocks(f"w{i}") == 0 for i in range(3))
    assert not state._requests and all(not refs for refs in state._refs.values())
