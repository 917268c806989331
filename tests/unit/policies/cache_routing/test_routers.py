"""The cache-aware routers (policies/routing/kv_cost.py, prefix_overlap.py,
session_affinity.py, softmax.py): cost and overlap arithmetic, the softmax's invariances,
and the conformance every scorer and picker of a profile owes."""

import math
from collections import Counter

import pytest

from policies.routing import make_router
from policies.routing.kv_cost import KvCost, KvCostConfig, kv_cost
from policies.routing.kv_state import CacheConfig, KvState
from policies.routing.prefix_overlap import PrefixOverlap
from policies.routing.session_affinity import RingDistance, bounded_load
from policies.routing.softmax import Softmax, softmax_probabilities
from policies.types import Outcome, RequestInfo, Status, WorkerView
from tests.unit.policies import test_routing as routing_suite


def view(i: int, **kw) -> WorkerView:
    return WorkerView(id=f"w{i}", pool="p", max_model_len=32768, **kw)


def req(prompt: int = 100, hashes: tuple[int, ...] = (), **kw) -> RequestInfo:
    return RequestInfo("r", "m", 0.0, prompt, 64, prefix_hashes=hashes, **kw)


# --- kv_cost: c_j = ω · prefill blocks + active blocks ----------------------------------


def test_kv_cost_arithmetic():
    state = CacheConfig(block_size=16).state()
    state.index.record("w0", (1, 2, 3, 4), 0.0)
    cost = KvCost(state, overlap_weight=1.0)
    r = req(100, (1, 2, 3, 4, 5, 6))
    # w0 holds 4 blocks = 64 tokens: (100 − 64) / 16 = 2.25 blocks to prefill; w1 all 100
    assert cost.prefill_blocks(r, view(0)) == pytest.approx(2.25)
    assert cost.prefill_blocks(r, view(1)) == pytest.approx(6.25)
    assert cost.score(r, view(0, active_blocks=5)) == pytest.approx(7.25)
    assert cost.score(r, view(1, active_blocks=0)) == pytest.approx(6.25)
    cost.overlap_weight = 0.5
    assert cost.score(r, view(1, active_blocks=2)) == pytest.approx(0.5 * 6.25 + 2)
    # a request's own ω wins; the worker's block size wins over the configured one
    assert cost.score(req(100, (1, 2, 3, 4), overlap_weight=0.0), view(0, active_blocks=3)) == 3
    assert cost.prefill_blocks(req(100, (1, 2)), view(0, block_size=32)) == pytest.approx(
        (100 - 32) / 32
    )
    # the overlap never exceeds the prompt
    assert cost.prefill_blocks(req(50, (1, 2, 3, 4)), view(0)) == 0.0


def test_kv_cost_active_blocks_sources():
    state = CacheConfig(block_size=16).state()
    cost = KvCost(state)
    # nothing known: ⌈outstanding tokens / block size⌉ (this gateway's Σ prompt + max_tokens)
    assert cost.decode_blocks(view(0, outstanding_tokens=33)) == 3
    assert cost.decode_blocks(view(0, outstanding_tokens=33, active_blocks=7)) == 7
    # fed by the core's events: the accounting
    state.seen([view(0)])
    state.on_dispatch(req(40), "w0", 1.0)
    assert state.fed and cost.decode_blocks(view(0, outstanding_tokens=10_000)) == 3


def test_active_blocks_count_a_shared_prefix_once_and_release_on_every_exit():
    state = KvState(block_size=16)
    state.index.block_tokens = 16
    state.seen([view(0), view(1)])
    a = RequestInfo("a", "m", 0.0, 40, 10, prefix_hashes=(7, 8))  # 3 blocks, 2 hashed
    b = RequestInfo("b", "m", 0.0, 40, 10, prefix_hashes=(7, 8))
    state.on_dispatch(a, "w0", 0.0)
    state.on_dispatch(b, "w0", 0.0)
    assert state.active_blocks("w0") == 2 + 1 + 1
    state.on_dispatch(b, "w1", 1.0)  # a retry elsewhere moves b's blocks
    assert state.active_blocks("w0") == 3 and state.active_blocks("w1") == 3
    state.on_complete(a, Outcome(Status.ERROR), 2.0)
    state.on_complete(b, Outcome(Status.DISCONNECT), 2.0)
    state.on_complete(b, Outcome(Status.OK), 2.0)  # a second completion is harmless
    assert state.active_blocks("w0") == 0 and state.active_blocks("w1") == 0
    state.on_dispatch(RequestInfo("c", "m", 0.0, 40, 10), "other-pool-worker", 3.0)
    assert state.active_blocks("other-pool-worker") == 0 and not state._requests


def test_kv_cost_router_prefers_the_cached_worker_at_dynamo_defaults():
    r = kv_cost()
    assert (r.picker.temperature, r.cost.overlap_weight) == (0.0, 1.0)
    workers = [view(0), view(1), view(2)]
    first = r.choose(req(160, tuple(range(10))), workers)
    assert first is not None
    # the router recorded its own choice (no hooks yet): the same prefix follows it
    for _ in range(20):
        assert r.choose(req(160, tuple(range(10))), workers).id == first.id
    # unless that worker is busier than the prefill it saves: 10 blocks saved vs 11 active
    busy = [view(i, active_blocks=11 if f"w{i}" == first.id else 0) for i in range(3)]
    assert r.choose(req(160, tuple(range(10))), busy).id != first.id


def test_kv_cost_tie_break_is_the_smallest_tree_then_seeded():
    r = kv_cost(KvCostConfig(seed=3))
    r.state.index.record("w0", (100, 101, 102), 0.0)  # w0 holds more unrelated blocks
    workers = [view(0), view(1), view(2)]
    picks = [r.choose(req(64, ()), workers).id for _ in range(30)]
    assert "w0" not in picks  # tied costs: the smaller trees first
    again = kv_cost(KvCostConfig(seed=3))
    again.state.index.record("w0", (100, 101, 102), 0.0)
    assert [again.choose(req(64, ()), workers).id for _ in range(30)] == picks


def test_kv_cost_parameters_per_pool_and_per_request():
    r = make_router("kv_cost", {"temperature": 0.7, "overlap_weight": 0.1, "block_size": 32})
    assert (r.picker.temperature, r.cost.overlap_weight, r.state.block_size) == (0.7, 0.1, 32)
    with pytest.raises(ValueError, match="temperature"):
        make_router("kv_cost", {"temperature": -1})
    with pytest.raises(ValueError, match="normalise"):
        make_router("kv_cost", {"normalise": "zscore"})
    with pytest.raises(ValueError, match="unknown parameter"):
        make_router("kv_cost", {"tau": 1})
    # τ overridden per request: τ = 0 makes the cheaper worker certain
    r = kv_cost(KvCostConfig(temperature=5.0))
    two = [view(0, active_blocks=0), view(1, active_blocks=10)]
    assert {r.choose(req(16, (), router_temperature=0.0), two).id for _ in range(200)} == {"w0"}


# --- the softmax picker ----------------------------------------------------------------


def test_softmax_is_invariant_to_shifting_and_scaling_costs():
    costs = [3.0, 7.5, 4.0, 12.0]
    for tau in (0.1, 0.7, 1.0, 3.0):
        p = softmax_probabilities(costs, tau)
        for a, b in ((1.0, 100.0), (0.01, -5.0), (250.0, 1e6)):
            q = softmax_probabilities([a * c + b for c in costs], tau)
            assert q == pytest.approx(p, rel=1e-9)
    assert softmax_probabilities([5.0, 5.0, 5.0], 0.7) == [pytest.approx(1 / 3)] * 3


def test_softmax_tends_to_uniform_as_tau_grows():
    costs = [0.0, 1.0, 10.0, 3.0]
    spread = [max(abs(p - 0.25) for p in softmax_probabilities(costs, t)) for t in (1, 10, 1e3)]
    assert spread[0] > spread[1] > spread[2] and spread[2] < 1e-3
    # and to the argmin as τ → 0
    assert softmax_probabilities(costs, 1e-3)[0] == pytest.approx(1.0)


def test_softmax_is_deterministic_at_tau_zero():
    workers = [view(i) for i in range(4)]
    scored = [(3.0, workers[0]), (1.0, workers[1]), (2.0, workers[2]), (1.5, workers[3])]
    for seed in range(5):
        picker = Softmax(0.0, seed=seed)
        assert {picker.pick(req(), scored).id for _ in range(100)} == {"w1"}


def test_two_workers_at_tau_0_7_the_worse_gets_19_3_percent():
    """Range-normalised: P(worse) = e^{−1/0.7} / (1 + e^{−1/0.7}) = 0.1934, whatever the
    costs' scale (checked on 10⁴ draws of the router, not the formula)."""
    assert math.exp(-1 / 0.7) / (1 + math.exp(-1 / 0.7)) == pytest.approx(0.193, abs=5e-4)
    r = kv_cost(KvCostConfig(temperature=0.7, seed=11))
    two = [view(0, active_blocks=40), view(1, active_blocks=3)]
    picks = Counter(r.choose(req(16, ()), two).id for _ in range(10_000))
    assert abs(picks["w0"] / 10_000 - 0.193) <= 0.01
    picker = Softmax(0.7, seed=5)
    picks = Counter(
        picker.pick(req(), [(1e-3, view(0)), (2e-3, view(1))]).id for _ in range(10_000)
    )
    assert abs(picks["w1"] / 10_000 - 0.193) <= 0.01


def test_softmax_normalise_none_is_in_cost_units():
    p = softmax_probabilities([0.0, 1.0], 1.0, "none")
    assert p[1] == pytest.approx(math.exp(-1) / (1 + math.exp(-1)))
    p = softmax_probabilities([0.0, 100.0], 1.0, "none")
    assert p[1] == pytest.approx(0.0, abs=1e-40)
    with pytest.raises(ValueError):
        softmax_probabilities([1.0], 0.0)


# --- prefix_overlap -----------------------------------------------------------------------


def test_prefix_overlap_scores_the_fraction_held():
    state = CacheConfig().state()
    state.index.record("w1", (1, 2, 3), 0.0)
    s = PrefixOverlap(state)
    assert s.score(req(100, (1, 2, 3, 4)), view(1)) == pytest.approx(-0.75)
    assert s.score(req(100, (1, 2, 3, 4)), view(0)) == 0.0
    assert s.score(req(100, ()), view(1)) == 0.0


def test_prefix_overlap_router_follows_the_prefix_within_the_load_trade():
    r = make_router("prefix_overlap")
    workers = [view(0), view(1), view(2)]
    first = r.choose(req(160, tuple(range(10))), workers).id
    assert {r.choose(req(160, tuple(range(10))), workers).id for _ in range(10)} == {first}
    # 0.05 per request of load: 19 more requests still lose to a full hit, 21 win
    loaded = [view(i, running=19 if f"w{i}" == first else 0) for i in range(3)]
    assert r.choose(req(160, tuple(range(10))), loaded).id == first
    loaded = [view(i, running=21 if f"w{i}" == first else 0) for i in range(3)]
    assert r.choose(req(160, tuple(range(10))), loaded).id != first


# --- session_affinity -----------------------------------------------------------------------


def test_session_affinity_keeps_a_session_on_one_worker():
    r = make_router("session_affinity")
    workers = [view(i) for i in range(5)]
    homes = {}
    for s in range(200):
        got = {r.choose(req(session=f"user-{s}"), workers).id for _ in range(3)}
        assert len(got) == 1
        homes[s] = got.pop()
    assert len(set(homes.values())) == 5  # the ring spreads sessions over every worker
    # a worker leaving moves only its own sessions
    fewer = [w for w in workers if w.id != "w2"]
    moved = [s for s in homes if r.choose(req(session=f"user-{s}"), fewer).id != homes[s]]
    assert moved and all(homes[s] == "w2" for s in moved)


def test_session_affinity_bounds_the_load():
    r = make_router("session_affinity", {"balance": 1.25})
    home = r.choose(req(session="s"), [view(i) for i in range(4)]).id
    # Σ load + 1 = 13 over 4 workers × 1.25: a cap of ⌈4.06⌉ = 5, so 4 in flight + 1 fits
    near = [view(i, in_flight=4 if f"w{i}" == home else 3) for i in range(4)]
    assert r.choose(req(session="s"), near).id == home
    over = [view(i, in_flight=9 if f"w{i}" == home else 1) for i in range(4)]
    assert r.choose(req(session="s"), over).id != home
    keep = bounded_load(1.0)
    assert [w.id for w in keep(req(), [view(0, running=2), view(1)])] == ["w1"]
    # without a session: least-loaded
    assert r.choose(req(), [view(0, running=2), view(1), view(2, running=1)]).id == "w1"


# --- conformance: what every scorer and picker of a profile owes ----------------------------


def _states():
    state = CacheConfig().state()
    state.index.record("w3", (1, 2), 0.0)
    return state


SCORERS = [
    lambda: KvCost(_states()),
    lambda: PrefixOverlap(_states()),
    lambda: RingDistance(),
]
PICKERS = [lambda: Softmax(0.0), lambda: Softmax(0.7), lambda: Softmax(5.0, normalise="none")]


@pytest.mark.parametrize("make", SCORERS, ids=["kv_cost", "prefix_overlap", "session_affinity"])
def test_scorer_conformance(make):
    routing_suite.test_scorer_conformance(make)
    scorer = make()
    for r in (req(100, (1, 2, 3)), req(100, (1, 2, 3), session="abc")):
        for v in routing_suite.MIXED:
            assert math.isfinite(scorer.score(r, v))


@pytest.mark.parametrize("make", PICKERS, ids=["tau0", "tau0.7", "none"])
def test_picker_conformance(make):
    routing_suite.test_picker_conformance(make)


@pytest.mark.parametrize("name", ["kv_cost", "prefix_overlap", "session_affinity"])
def test_router_conformance(name):
    """The registry's suite (tests/unit/policies/test_routing.py) runs every registered
    router; here also with prefixes and sessions, the cases the new routers branch on."""
    routing_suite.test_conformance_every_router(name)
    r = make_router(name)
    for extra in ({"prefix_hashes": (1, 2, 3)}, {"session": "u1"}):
        x = RequestInfo("r", "m", 0.0, 100, 10, **extra)
        assert r.choose(x, []) is None
        assert r.choose(x, [view(0, healthy=False)]) is None
        for _ in range(20):
            got = r.choose(x, [view(0, healthy=False), view(1), view(2, stale=True)])
            assert got is not None and got.id == "w1"
