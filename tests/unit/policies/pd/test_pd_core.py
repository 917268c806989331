"""A `pd` pool in the core (policies/core.py, policies/pd/): one request, two workers, two
leases — the prefill slot back at the hand-off, the decode slot back when the answer ends —
and every failure before and after the hand-off, with every count back at zero."""

from __future__ import annotations

import pytest

from policies.actions import PROCEED, Action, ActionLog, Fail, Refuse, SendDecode, SendPair, Wait
from policies.budget import BudgetConfig, BudgetEstimator, ChatSize
from policies.core import Core
from policies.dispatch import FifoDispatcher
from policies.events import (
    ANSWERED,
    FIRST_TOKEN,
    HANDED_OFF,
    Finished,
    Request,
    UpstreamFailed,
)
from policies.intake import CHAT, Intake, Prompt
from policies.pd import PdPool, make_pair_selector
from policies.pools import make_placement
from policies.routing import make_router
from policies.types import Outcome, PoolSpec, Status, WorkerView

POOLS = [PoolSpec("short", 8192, frozenset({"m"}))]
PREFILL = ("p0", "p1")
DECODE = ("d0", "d1")


def _core(protocol: str = "vllm", selector: str = "round_robin", **kw: object) -> Core:
    core = Core(
        Intake(make_placement("short_long", "short", 8192), BudgetEstimator(BudgetConfig())),
        lambda pool: make_router("round_robin"),
        **kw,  # type: ignore[arg-type]
    )
    core.pd_pools["short"] = PdPool("short", protocol, make_pair_selector(selector))
    return core


def _bind(core: Core, capacity: int | None = None) -> tuple[list[WorkerView], list[Action]]:
    views = [
        WorkerView(
            w, "short", 8192, capacity=capacity, role="prefill" if w in PREFILL else "decode"
        )
        for w in (*PREFILL, *DECODE)
    ]
    by_id = {v.id: v for v in views}
    core.views = lambda pool: views if pool == "short" else []
    core.load_of = by_id.__getitem__
    woken: list[Action] = []
    core.on_action = woken.append
    core.log = ActionLog()
    return views, woken


def _request(rid: str, tokens: int = 100, max_tokens: int = 50) -> Request:
    return Request(
        Prompt(CHAT, "m", ChatSize(tokens * 4, 1), max_tokens, exact_tokens=tokens), rid, POOLS
    )


def _counts(views: list[WorkerView]) -> dict[str, tuple[int, int]]:
    return {v.id: (v.in_flight, v.outstanding_tokens) for v in views}


def _zero(views: list[WorkerView]) -> bool:
    return all(v.in_flight == 0 and v.outstanding_tokens == 0 for v in views)


def _done(core: Core, action: SendPair | SendDecode, status: Status = Status.OK) -> None:
    core.on(action.ticket, Finished(Outcome(status, prompt_tokens=100)), 9.0)


def test_vllm_pair_prefill_then_decode_two_leases():
    core = _core("vllm")
    views, _ = _bind(core)
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, SendPair) and (send.prefill, send.decode) == ("p0", "d0")
    assert send.protocol == "vllm" and send.pool == "short"
    # prefill: prompt + its one sampled token; decode: prompt + max_tokens
    assert _counts(views)["p0"] == (1, 101) and _counts(views)["d0"] == (1, 150)
    decode = core.on(send.ticket, HANDED_OFF, 1.0)
    assert isinstance(decode, SendDecode) and decode.worker == "d0"
    assert _counts(views)["p0"] == (0, 0) and _counts(views)["d0"] == (1, 150)
    assert core.on(send.ticket, HANDED_OFF, 1.1) is PROCEED  # reported twice: no second release
    core.on(send.ticket, FIRST_TOKEN, 1.5)
    core.on(send.ticket, ANSWERED, 2.0)
    _done(core, send)
    assert _zero(views)
    assert core.log is not None
    assert core.log.of("a") == ["send_pair short/p0+d0", "handoff p0", "done ok"]  # type: ignore[attr-defined]


def test_sglang_pair_both_at_once_handoff_only_releases_the_prefill():
    core = _core("sglang")
    views, _ = _bind(core)
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, SendPair) and send.protocol == "sglang"
    core.on(send.ticket, FIRST_TOKEN, 0.5)  # the decode's first token may come before
    assert core.on(send.ticket, HANDED_OFF, 0.6) is PROCEED  # the prefill call's answer
    assert _counts(views)["p0"] == (0, 0) and _counts(views)["d0"] == (1, 150)
    _done(core, send)
    assert _zero(views)


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_prefill_failure_before_the_handoff_retries_the_whole_pair_once(protocol: str):
    core = _core(protocol)
    views, _ = _bind(core)
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, SendPair) and send.prefill == "p0"
    again = core.on(send.ticket, UpstreamFailed("connect", retryable=True, side="prefill"), 0.1)
    assert isinstance(again, SendPair) and again.prefill == "p1" and again.attempt == 1
    # the failed attempt's two slots went back before the new pair took its own
    assert sum(v.in_flight for v in views) == 2 and _counts(views)["p0"] == (0, 0)
    last = core.on(again.ticket, UpstreamFailed("connect", retryable=True, side="prefill"), 0.2)
    assert isinstance(last, Fail)  # one retry: a request that failed twice fails
    _done(core, again, Status.ERROR)
    assert _zero(views)


def test_a_prefill_http_error_is_not_retried():
    core = _core("vllm")
    views, _ = _bind(core)
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, SendPair)
    fail = core.on(send.ticket, UpstreamFailed("http_500", retryable=False, side="prefill"), 0.1)
    assert isinstance(fail, Fail)
    _done(core, send, Status.ERROR)
    assert _zero(views)


def test_decode_failure_after_the_handoff_mid_answer_fails_and_releases_the_decode():
    core = _core("vllm")
    views, _ = _bind(core)
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, SendPair)
    assert isinstance(core.on(send.ticket, HANDED_OFF, 1.0), SendDecode)
    core.on(send.ticket, FIRST_TOKEN, 1.2)
    event = UpstreamFailed("reset", retryable=False, before_response=False, side="decode")
    assert isinstance(core.on(send.ticket, event, 1.5), Fail)
    assert _counts(views)["p0"] == (0, 0) and _counts(views)["d0"] == (1, 150)
    _done(core, send, Status.ERROR)
    assert _zero(views)


def test_decode_refused_before_any_byte_retries_with_a_new_pair_without_that_decode():
    core = _core("vllm")
    views, _ = _bind(core)
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, SendPair)
    core.on(send.ticket, HANDED_OFF, 1.0)
    event = UpstreamFailed("connect", retryable=True, before_response=True, side="decode")
    again = core.on(send.ticket, event, 1.1)
    assert isinstance(again, SendPair) and again.decode == "d1"  # the prefill runs again
    assert again.ticket.tried == ("d0",)
    assert _counts(views)["d0"] == (0, 0)
    _done(core, again)
    assert _zero(views)


def test_a_prefill_failure_after_the_handoff_leaves_the_decode_answer_alone():
    core = _core("sglang")
    views, _ = _bind(core)
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, SendPair)
    core.on(send.ticket, HANDED_OFF, 1.0)
    late = UpstreamFailed("reset", retryable=False, side="prefill")
    assert core.on(send.ticket, late, 1.1) is PROCEED
    _done(core, send)
    assert _zero(views)


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
def test_a_client_gone_mid_transfer_releases_both_and_a_late_handoff_changes_nothing(
    protocol: str,
):
    core = _core(protocol)
    views, _ = _bind(core)
    send = core.start(_request("a"), 0.0)
    assert isinstance(send, SendPair)
    _done(core, send, Status.DISCONNECT)  # gone before the KV left the prefill
    assert _zero(views)
    assert core.on(send.ticket, HANDED_OFF, 1.0) is PROCEED  # the prefill answered late
    assert _zero(views)


def test_no_pair_with_room_waits_and_a_released_prefill_slot_wakes_it():
    core = _core("vllm", dispatcher=FifoDispatcher(8, 10.0))
    views, woken = _bind(core, capacity=1)
    first = core.start(_request("a"), 0.0)
    second = core.start(_request("b"), 0.0)
    assert isinstance(first, SendPair) and isinstance(second, SendPair)
    assert isinstance(core.start(_request("c"), 0.0), Wait)  # both prefills are busy
    core.on(first.ticket, HANDED_OFF, 1.0)  # p0 free again, but both decodes are full
    assert woken and isinstance(woken[-1], Wait)
    _done(core, second)  # p1 and d1 free: c goes
    assert isinstance(woken[-1], SendPair) and woken[-1].ticket.info.id == "c"
    core.on(woken[-1].ticket, HANDED_OFF, 2.0)
    _done(core, first)
    _done(core, woken[-1])  # type: ignore[arg-type]
    assert _zero(views)


def test_no_healthy_prefill_is_refused_not_queued():
    core = _core("vllm", dispatcher=FifoDispatcher(8, 10.0))
    views, _ = _bind(core)
    for v in views:
        if v.id in PREFILL:
            v.healthy = False
    refused = core.start(_request("a"), 0.0)
    assert isinstance(refused, Refuse) and refused.code == "no_healthy_worker"
