"""The `select_pair` extension point's conformance suite (policies/protocols/pairs.py):
every registered pair selector keeps the protocol; then each built-in's own promise."""

from __future__ import annotations

import pytest

from policies.build import Choice, CoreSpec, PdSpec, build_core
from policies.clock import ManualClock
from policies.pd import DEFAULT_SELECTOR, PAIR_SELECTORS, make_pair_selector
from policies.types import RequestInfo, WorkerView

NAMES = PAIR_SELECTORS.names()


def _info(rid: str = "r", prefix: tuple[int, ...] = ()) -> RequestInfo:
    return RequestInfo(rid, "m", 0.0, prompt_tokens=256, max_tokens=64, prefix_hashes=prefix)


def _workers(role: str, n: int, **kw: object) -> list[WorkerView]:
    return [WorkerView(f"{role}{i}", "pd", 8192, **kw) for i in range(n)]  # type: ignore[arg-type]


def test_the_built_ins_are_registered():
    assert {"kv_cost_decode", "kv_cost_decode_load", "random", "round_robin"} <= set(NAMES)
    assert DEFAULT_SELECTOR == "kv_cost_decode_load"


@pytest.mark.parametrize("name", NAMES)
def test_a_pair_is_one_worker_of_each_given_role(name: str):
    sel = make_pair_selector(name)
    prefill, decode = _workers("p", 3), _workers("d", 4)
    for i in range(50):
        pair = sel.select(_info(f"r{i}"), prefill, decode)
        assert pair is not None
        assert pair[0] in prefill and pair[1] in decode


@pytest.mark.parametrize("name", NAMES)
def test_no_pair_when_a_role_has_no_worker_that_can_take_it(name: str):
    sel = make_pair_selector(name)
    assert sel.select(_info(), [], _workers("d", 2)) is None
    assert sel.select(_info(), _workers("p", 2), []) is None
    sick = _workers("p", 2, healthy=False)
    assert sel.select(_info(), sick, _workers("d", 2)) is None
    full = _workers("d", 2, capacity=1, in_flight=1)
    assert sel.select(_info(), _workers("p", 2), full) is None


@pytest.mark.parametrize("name", NAMES)
def test_never_an_unhealthy_or_full_worker(name: str):
    sel = make_pair_selector(name)
    prefill = [*_workers("p", 1, healthy=False), WorkerView("p9", "pd", 8192)]
    decode = [*_workers("d", 1, capacity=1, in_flight=1), WorkerView("d9", "pd", 8192)]
    for i in range(20):
        pair = sel.select(_info(f"r{i}"), prefill, decode)
        assert pair is not None and (pair[0].id, pair[1].id) == ("p9", "d9")


@pytest.mark.parametrize("name", NAMES)
def test_unknown_parameters_fail_at_start(name: str):
    with pytest.raises(ValueError, match="unknown parameter"):
        make_pair_selector(name, {"no_such_knob": 1})


def test_unknown_selector_names_the_known_ones():
    with pytest.raises(ValueError, match="kv_cost_decode_load"):
        make_pair_selector("nope")


def test_default_decode_is_the_least_active_decode_load():
    sel = make_pair_selector(DEFAULT_SELECTOR)
    # outstanding tokens → blocks of 16: 320 → 20, 33 → 3, 48 → 3 (tie: fewer in flight)
    decode = [
        WorkerView("d0", "pd", 8192, outstanding_tokens=320, in_flight=1),
        WorkerView("d1", "pd", 8192, outstanding_tokens=33, in_flight=2),
        WorkerView("d2", "pd", 8192, outstanding_tokens=48, in_flight=1),
    ]
    pair = sel.select(_info(), _workers("p", 1), decode)
    assert pair is not None and pair[1].id == "d2"
    # a driver that knows the engine's active blocks wins over our outstanding tokens
    decode[0].active_blocks = 1
    pair = sel.select(_info(), _workers("p", 1), decode)
    assert pair is not None and pair[1].id == "d0"


def test_default_prefill_follows_the_cached_prefix_and_else_the_lower_kv_cost():
    sel = make_pair_selector(DEFAULT_SELECTOR)
    prefill, decode = _workers("p", 2), _workers("d", 1)
    prefix = tuple(range(1, 17))  # 16 blocks of 16 tokens: the whole 256-token prompt
    first = sel.select(_info("a", prefix), prefill, decode)
    assert first is not None
    # the same prefix again: on the worker that computed (and cached) it, whatever else
    for i in range(5):
        pair = sel.select(_info(f"b{i}", prefix), prefill, decode)
        assert pair is not None and pair[0].id == first[0].id
    # no shared prefix: the lower active load (kv_cost's second term) decides
    busy = first[0]
    busy.outstanding_tokens = 16 * 100
    other = next(w for w in prefill if w is not busy)
    pair = sel.select(_info("c", (99, 98)), prefill, decode)
    assert pair is not None and pair[0].id == other.id


def test_round_robin_takes_each_role_in_turn():
    sel = make_pair_selector("round_robin")
    prefill, decode = _workers("p", 2), _workers("d", 3)
    got = [sel.select(_info(), prefill, decode) for _ in range(6)]
    assert [(p.id, d.id) for p, d in got if True] == [  # type: ignore[misc]
        ("p0", "d0"), ("p1", "d1"), ("p0", "d2"), ("p1", "d0"), ("p0", "d1"), ("p1", "d2"),
    ]  # fmt: skip


def test_random_pairs_repeat_with_their_seed():
    a = make_pair_selector("random", {"seed": 7})
    b = make_pair_selector("random", {"seed": 7})
    prefill, decode = _workers("p", 3), _workers("d", 3)
    draws_a = [a.select(_info(), prefill, decode) for _ in range(20)]
    draws_b = [b.select(_info(), prefill, decode) for _ in range(20)]
    assert draws_a == draws_b
    assert len({p.id for p, _ in draws_a if True}) == 3  # type: ignore[misc]


def test_build_core_makes_the_pd_pools_with_their_selector():
    spec = CoreSpec(
        placement="short_long",
        pd_pools={
            "short": PdSpec("sglang", Choice("random")),
        },
    )
    core, _ = build_core(spec, ManualClock())
    pool = core.pd_pools["short"]
    assert pool.concurrent and pool.selector.name == "random"
    with pytest.raises(ValueError, match="protocol"):
        build_core(
            CoreSpec(pd_pools={"x": PdSpec("trtllm")}),
            ManualClock(),
        )


def test_default_decode_ties_go_in_turn():
    sel = make_pair_selector(DEFAULT_SELECTOR)
    decode = _workers("d", 3)
    got = [sel.select(_info(), _workers("p", 1), decode) for _ in range(6)]
    assert [pair[1].id for pair in got if pair is not None] == ["d0", "d1", "d2"] * 2


def test_kv_cost_decode_follows_the_prefix_on_decode_and_the_queue_on_prefill():
    sel = make_pair_selector("kv_cost_decode")
    prefill = [
        WorkerView("p0", "pd", 8192, outstanding_tokens=512),
        WorkerView("p1", "pd", 8192, outstanding_tokens=0),
    ]
    decode = _workers("d", 2)
    prefix = tuple(range(1, 17))
    first = sel.select(_info("a", prefix), prefill, decode)
    assert first is not None and first[0].id == "p1"  # the shorter prefill queue
    for i in range(5):  # τ = 0, ω = 1: the same prompt goes back to the decode that had it
        pair = sel.select(_info(f"b{i}", prefix), prefill, decode)
        assert pair is not None and pair[1].id == first[1].id
    # ω = 0 and a busier decode: load alone decides
    busy = sel.select(_info("c", prefix), prefill, decode)
    assert busy is not None
    sel.set_params(0.0, 0.0)  # type: ignore[attr-defined]
    first[1].outstanding_tokens = 16 * 50
    pair = sel.select(_info("d", prefix), prefill, decode)
    assert pair is not None and pair[1].id != first[1].id
