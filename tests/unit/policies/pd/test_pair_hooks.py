"""The core's pair events (policies/hooks.py `PairHook`) and what hears them: the default
selector's prefill-side KV state (a prompt active on the prefill until the hand-off, in its
cache from the hand-off on), the decode side's, and the pair-aware TTFT sampler and regime
controller (policies/pd/regime_adaptive.py). Built by `build_core`, as both drivers do."""

from __future__ import annotations

from typing import Any

import pytest

from policies.actions import SendDecode, SendPair
from policies.budget import ChatSize
from policies.build import Choice, CoreSpec, PdSpec, build_core
from policies.clock import ManualClock
from policies.core import Core
from policies.events import FIRST_TOKEN, HANDED_OFF, Finished, Request, UpstreamFailed
from policies.intake import CHAT, Prompt
from policies.pd.kv_cost_decode import KvCostDecode
from policies.pd.kv_cost_decode_load import KvCostDecodeLoad
from policies.pd.pair_state import PairKvState
from policies.pd.regime_adaptive import RegimeAdaptivePairs
from policies.routing.kv_state import KvState
from policies.saturation import Regime
from policies.types import Outcome, PoolSpec, RequestInfo, Status, WorkerView

POOLS = [PoolSpec("short", 8192, frozenset({"m"}))]
CHAIN = tuple(range(100, 108))  # 8 blocks of 16 tokens: the whole 128-token prompt


class Recorder:
    """A driver's hook that also wants pair events: what it heard, in order."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, ...]] = []

    def on_arrival(self, request: RequestInfo, now: float) -> None:
        self.heard.append(("arrival", request.id))

    def on_dispatch(self, request: RequestInfo, worker: str, now: float) -> None:
        self.heard.append(("dispatch", request.id, worker))

    def on_first_token(self, request: RequestInfo, now: float) -> None:
        self.heard.append(("first_token", request.id))

    def on_complete(self, request: RequestInfo, outcome: Outcome, now: float) -> None:
        self.heard.append(("complete", request.id))

    def on_pair(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        self.heard.append(("pair", request.id, prefill, decode))

    def on_handoff(self, request: RequestInfo, prefill: str, decode: str, now: float) -> None:
        self.heard.append(("handoff", request.id, prefill, decode))


def _core(selector: str, params: dict[str, Any] | None = None, *hooks: Any) -> Core:
    spec = CoreSpec(
        placement="short_long", pd_pools={"short": PdSpec("vllm", Choice(selector, params or {}))}
    )
    core, _ = build_core(spec, ManualClock(), hooks=tuple(hooks))
    views = [WorkerView(w, "short", 8192, role="prefill") for w in ("p0", "p1")] + [
        WorkerView(w, "short", 8192, role="decode") for w in ("d0", "d1")
    ]
    by_id = {v.id: v for v in views}
    core.views = lambda pool: views if pool == "short" else []
    core.load_of = by_id.__getitem__
    return core


def _start(core: Core, rid: str, now: float, chain: tuple[int, ...] = CHAIN) -> SendPair:
    prompt = Prompt(CHAT, "m", ChatSize(512, 1), 64, exact_tokens=128)
    send = core.start(Request(prompt, rid, POOLS, prefix_hashes=chain), now)
    assert isinstance(send, SendPair)
    return send


def test_pair_hooks_hear_the_pair_and_the_handoff_after_dispatch():
    rec = Recorder()
    core = _core("round_robin", None, rec)
    send = _start(core, "a", 0.0)
    assert isinstance(core.on(send.ticket, HANDED_OFF, 0.1), SendDecode)
    core.on(send.ticket, FIRST_TOKEN, 0.2)
    core.on(send.ticket, Finished(Outcome(Status.OK)), 0.5)
    assert rec.heard == [
        ("arrival", "a"),
        ("dispatch", "a", "p0"),
        ("pair", "a", "p0", "d0"),
        ("handoff", "a", "p0", "d0"),
        ("first_token", "a"),
        ("complete", "a"),
    ]


def test_a_retry_is_a_second_pair():
    rec = Recorder()
    core = _core("round_robin", None, rec)
    send = _start(core, "a", 0.0)
    again = core.on(send.ticket, UpstreamFailed("connect", retryable=True, side="prefill"), 0.1)
    assert isinstance(again, SendPair) and again.prefill == "p1"
    pairs = [h for h in rec.heard if h[0] == "pair"]
    assert pairs == [("pair", "a", "p0", "d0"), ("pair", "a", "p1", "d1")]


def test_default_selector_prefill_state_active_until_handoff_cached_after():
    core = _core("kv_cost_decode_load")
    sel = core.pd_pools["short"].selector
    assert isinstance(sel, KvCostDecodeLoad)
    state = sel.prefill_router.state
    send = _start(core, "a", 0.0)
    p = send.prefill
    assert state.fed and state.active_blocks(p) == 8  # the prompt's blocks, until the hand-off
    assert state.index.overlap(p, CHAIN, 0.0) == 0  # not computed yet
    core.on(send.ticket, HANDED_OFF, 0.1)
    assert state.active_blocks(p) == 0  # the decode holds the answer, not the prefill
    assert state.index.overlap(p, CHAIN, 0.1) == 8  # the prefill's cache holds the prompt
    core.on(send.ticket, FIRST_TOKEN, 0.2)
    # the same prefix goes back to the prefill worker that cached it, the other is idle
    nxt = _start(core, "b", 0.3)
    assert nxt.prefill == p
    other = _start(core, "c", 0.3, tuple(range(900, 908)))
    assert other.prefill != p  # p holds b's blocks now: c's cost is lower elsewhere
    for s in (send, nxt, other):
        core.on(s.ticket, Finished(Outcome(Status.OK)), 1.0)
    assert state.active_blocks("p0") == state.active_blocks("p1") == 0


def test_default_selector_prefill_failure_before_handoff_releases_and_caches_nothing():
    core = _core("kv_cost_decode_load")
    sel = core.pd_pools["short"].selector
    assert isinstance(sel, KvCostDecodeLoad)
    state = sel.prefill_router.state
    send = _start(core, "a", 0.0)
    p = send.prefill
    core.on(send.ticket, Finished(Outcome(Status.ERROR)), 0.1)
    assert state.active_blocks(p) == 0
    assert state.index.overlap(p, CHAIN, 0.1) == 0


def test_kv_cost_decode_holds_the_prompt_on_the_decode_until_the_answer_ends():
    core = _core("kv_cost_decode", {"output_blocks": False})
    sel = core.pd_pools["short"].selector
    assert isinstance(sel, KvCostDecode)
    state = sel.decode_router.state
    send = _start(core, "a", 0.0)
    d = send.decode
    assert state.active_blocks(d) == 8
    core.on(send.ticket, HANDED_OFF, 0.1)
    assert state.active_blocks(d) == 8 and state.index.overlap(d, CHAIN, 0.1) == 8
    core.on(send.ticket, Finished(Outcome(Status.OK)), 0.5)
    assert state.active_blocks(d) == 0


OUTPUT_BLOCKS = 4  # max_tokens 64 in blocks of 16 (_start's prompt)


def test_kv_cost_decode_charges_each_requests_output_blocks_on_its_decode():
    """Two requests of one template on one decode: the shared prompt counts once, each
    request's output blocks count apiece, from the pair to the answer's end — also for
    a retry's new pair (the blocks move with it)."""
    core = _core("kv_cost_decode")  # output_blocks: the default
    sel = core.pd_pools["short"].selector
    assert isinstance(sel, KvCostDecode) and sel.config.output_blocks
    state = sel.decode_router.state
    a = _start(core, "a", 0.0)
    assert state.active_blocks(a.decode) == 8 + OUTPUT_BLOCKS
    b = _start(core, "b", 0.0)
    # a's decode is the costlier now (12 active blocks against none): b goes to the other
    assert b.decode != a.decode
    assert state.active_blocks(b.decode) == 8 + OUTPUT_BLOCKS
    core.on(a.ticket, HANDED_OFF, 0.1)
    assert state.active_blocks(a.decode) == 8 + OUTPUT_BLOCKS  # until the answer ends
    core.on(a.ticket, Finished(Outcome(Status.OK)), 0.5)
    assert state.active_blocks(a.decode) == 0
    # b's decode fails before any byte: the pair goes again elsewhere, the blocks with it
    again = core.on(b.ticket, UpstreamFailed("connect", retryable=True, side="decode"), 0.6)
    assert isinstance(again, SendPair) and again.decode != b.decode
    assert state.active_blocks(b.decode) == 0
    assert state.active_blocks(again.decode) == 8 + OUTPUT_BLOCKS
    core.on(again.ticket, Finished(Outcome(Status.OK)), 0.9)
    assert state.active_blocks("d0") == state.active_blocks("d1") == 0


def test_output_blocks_count_the_requests_a_shared_template_hides():
    """The τ = 0 lock-in's blind spot (docs/PD.md): requests of one template on a decode
    worker. Prompt blocks alone count the template once however many share it; with
    output blocks the count grows with each request (per sequence), so the cost sees it."""
    for output_blocks, expected in ((False, [8, 8, 8]), (True, [12, 16, 28])):
        state = KvState()
        state.seen([WorkerView("d0", "short", 8192, role="decode")])
        side = PairKvState(state, "decode", output_blocks)
        got = []
        for k, choices in enumerate((1, 1, 3)):
            info = RequestInfo(f"r{k}", "m", 0.0, 128, 64, prefix_hashes=CHAIN, choices=choices)
            side.on_pair(info, "p0", "d0", 0.0)
            got.append(state.active_blocks("d0"))
        assert got == expected
        for k in range(3):
            side.on_complete(RequestInfo(f"r{k}", "m", 0.0, 128, 64), Outcome(Status.OK), 1.0)
        assert state.active_blocks("d0") == 0
    with pytest.raises(ValueError, match="output_blocks"):
        PairKvState(KvState(), "prefill", True)


def _serve(core: Core, rid: str, t: float, ttft: float) -> None:
    send = _start(core, rid, t)
    core.on(send.ticket, HANDED_OFF, t + ttft / 2)
    core.on(send.ticket, FIRST_TOKEN, t + ttft)
    core.on(send.ticket, Finished(Outcome(Status.OK)), t + ttft + 0.01)


def test_regime_adaptive_pairs_hear_their_pools_ttft_and_switch_the_decode_table():
    detector = {"theta1_s": 0.3, "theta2_s": 2.0, "interval_s": 5.0, "window_s": 10.0}
    core = _core("regime_adaptive", {"detector": detector})
    sel = core.pd_pools["short"].selector
    assert isinstance(sel, RegimeAdaptivePairs)
    t = 0.0
    while t < 30.0:  # TTFT 0.1 s: Below
        _serve(core, f"b{t}", t, 0.1)
        t += 0.5
    assert sel.detector.last_p99 is not None and abs(sel.detector.last_p99 - 0.1) < 1e-9
    assert sel.regime is Regime.BELOW and (sel.temperature, sel.overlap_weight) == (0.0, 1.0)
    while t < 60.0:  # TTFT 1 s: between the thresholds
        _serve(core, f"s{t}", t, 1.0)
        t += 0.5
    _serve(core, "last", t, 1.0)  # the next decision applies the new row
    assert sel.detector.regime is Regime.TRANSITION
    assert sel.regime is Regime.TRANSITION and (sel.temperature, sel.overlap_weight) == (0.7, 1.0)
