"""A `kind: pd` pool through a gateway process, against emulated prefill and decode
servers of each personality (docs/PD.md): the openai SDK's answers, streamed and not; the
exact requests the gateway sends to each side (the emulators record them); a prefill
failure, a decode failure after the hand-off, a client that leaves mid-transfer; every
lease back to zero (the gateway's own in-flight counts), hand-offs in the metrics; a
`regime_adaptive` pair selector driven past θ1 into Transition by a burst."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, gateway_config, metric, start_gateway, wait_until
from tests.procs import Proc, procs

pytestmark = pytest.mark.e2e

PROMPT = "Tell me about disaggregated serving. " * 20
MAX_TOKENS = 12


@dataclass
class PdFleet:
    """One `pd` pool of a gateway (its own model name), and its emulators."""

    model: str
    personality: str
    prefill: list[Proc]
    decode: list[Proc]
    gateway: Proc
    pool: str

    @property
    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.url + "/v1", api_key="x", max_retries=0)

    def metrics(self) -> str:
        return httpx.get(self.gateway.url + "/metrics", timeout=5).text

    def seen(self, proc: Proc) -> list[dict[str, Any]]:
        return httpx.get(proc.url + "/_fleetgate/pd/seen", timeout=5).json()  # type: ignore[no-any-return]

    def idle(self) -> bool:
        """Every lease back: no worker holds a slot in the gateway's own counts."""
        text = self.metrics()
        return (
            metric(text, "fleetgate_worker_in_flight") == 0
            and metric(text, "fleetgate_pd_role_in_flight") == 0
        )


# pools of one gateway per personality, each with its own model name and emulators:
# (prefill emulators' extra flags, decode emulators' extra flags)
POOLS: dict[str, dict[str, tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]]] = {
    "vllm": {
        MODEL: (((),), ((), ())),
        # every prefill answers 500: the engine's 500 goes to the client, no decode call
        "m-p500": ((("--error-rate", "1.0"),), ((),)),
        # the decode's stream dies after 3 events, after the hand-off
        "m-dies": (((),), (("--die-mid-stream-after", "3"),)),
        # a slow prefill (2 s before its engine): the client leaves mid-transfer
        "m-slow": ((("--added-latency-ms", "2000"),), ((),)),
        # a prefill in real time computing one prompt at a time (steps of W ≥ 8 ms): a
        # burst of B requests queues, its last TTFT ≥ B × 8 ms (REGIME_PAIR's selector)
        "m-regime": ((("--time-scale", "1", "--max-num-seqs", "1"),), ((), ())),
    },
    "sglang": {
        MODEL: (((),), ((), ())),
        "m-slow": ((("--added-latency-ms", "2000"),), ((),)),
    },
}


# the regime pool's pair selector: Table 2's decode choice by the pair sampler's TTFT P99,
# thresholds small enough that a burst of REGIME_BURST crosses θ1 (its P99 ≥ 40 × 8 ms =
# 0.32 s > 0.15 s, by the emulator's engine model) and large enough that requests one at
# a time (a step or two, ~30 ms) fall back under θ1 (1 − ε) = 0.135 s; θ2 far above
# (Saturated never); short control intervals and window so either takes seconds
REGIME_BURST = 40
REGIME_PAIR = {
    "policy": "regime_adaptive",
    "params": {
        "detector": {"theta1_s": 0.15, "theta2_s": 60.0, "interval_s": 0.2, "window_s": 2.0}
    },
}
PAIRS = {"m-regime": REGIME_PAIR}


def _pool(k: int) -> str:
    return "short" if k == 0 else f"pool{k}"


def _start(ps: Any, personality: str) -> dict[str, PdFleet]:
    """One gateway with a `pd` pool per entry of POOLS[personality] (one gateway: each
    takes seconds to start on a loaded runner; emulators far less)."""
    emus: dict[str, tuple[list[Proc], list[Proc]]] = {}
    for k, (model, (p_args, d_args)) in enumerate(POOLS[personality].items()):
        common = ("--personality", personality, "--model", model, "--time-scale", "0.02")
        emus[model] = (
            [
                ps.emulator(f"{personality}{k}-p{i}", *common, "--role", "prefill", *a)
                for i, a in enumerate(p_args)
            ],
            [
                ps.emulator(f"{personality}{k}-d{i}", *common, "--role", "decode", *a)
                for i, a in enumerate(d_args)
            ],
        )
    for prefill, decode in emus.values():
        for p in prefill + decode:
            p.wait_ready("/health")
    cfg = gateway_config([], [])
    cfg["pools"] = {
        _pool(k): {
            "kind": "pd",
            "max_model_len": 8192,
            "models": [model],
            "pd": {"protocol": personality, **({"pair": PAIRS[model]} if model in PAIRS else {})},
            "workers": [
                *({"url": p.url, "engine": personality, "role": "prefill"} for p in prefill),
                *({"url": p.url, "engine": personality, "role": "decode"} for p in decode),
            ],
        }
        for k, (model, (prefill, decode)) in enumerate(emus.items())
    }
    gateway = start_gateway(ps, cfg, f"gateway-{personality}")
    return {
        m: PdFleet(m, personality, p, d, gateway, _pool(k))
        for k, (m, (p, d)) in enumerate(emus.items())
    }


@pytest.fixture(scope="module")
def fleets() -> Iterator[dict[str, dict[str, PdFleet]]]:
    with procs() as ps:
        yield {"vllm": _start(ps, "vllm"), "sglang": _start(ps, "sglang")}


@pytest.fixture(params=["vllm", "sglang"])
def pd(fleets: dict[str, dict[str, PdFleet]], request: pytest.FixtureRequest) -> PdFleet:
    return fleets[request.param][MODEL]


def _chat(fleet: PdFleet, stream: bool) -> str:
    kw: dict[str, Any] = {
        "model": fleet.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "extra_body": {"ignore_eos": True},
    }
    if not stream:
        r = fleet.client.chat.completions.create(**kw)
        assert r.usage is not None and r.usage.completion_tokens == MAX_TOKENS
        return r.choices[0].message.content or ""
    chunks = fleet.client.chat.completions.create(stream=True, **kw)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_answers_through_a_pair_and_the_exact_requests_sent(pd: PdFleet, stream: bool):
    personality = pd.personality
    before = [len(pd.seen(p)) for p in (*pd.prefill, *pd.decode)]
    text = _chat(pd, stream)
    assert text
    after = [pd.seen(p) for p in (*pd.prefill, *pd.decode)]
    new = [a[n:] for a, n in zip(after, before, strict=True)]
    (p_seen,) = new[: len(pd.prefill)]
    d_seen = [x for d in new[len(pd.prefill) :] for x in d]
    assert len(p_seen) == 1 and len(d_seen) == 1  # one call to each side
    p_req, d_req = p_seen[0], d_seen[0]
    assert p_req["path"] == d_req["path"] == "/v1/chat/completions"
    assert p_req["x-request-id"] == d_req["x-request-id"]  # one request id on both calls
    pb, db = p_req["body"], d_req["body"]
    assert pb["messages"] == db["messages"] == [{"role": "user", "content": PROMPT}]
    if personality == "vllm":
        # vLLM's proxy: the prefill asks for remote decode, one token, not streamed
        assert pb["kv_transfer_params"] == {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        }
        assert pb["stream"] is False and pb["max_tokens"] == 1 and "stream_options" not in pb
        # the decode carries what the prefill issued (the decode read it: it answered)
        kv = db["kv_transfer_params"]
        assert kv["do_remote_prefill"] is True and kv["remote_port"] == pd.prefill[0].port
        assert db["max_tokens"] == MAX_TOKENS and db.get("stream", False) is stream
    else:
        # SGLang's router: the same body to both, with one bootstrap room
        assert pb == db
        assert pb["bootstrap_host"] == "127.0.0.1"
        assert pb["bootstrap_port"] == pd.prefill[0].port
        assert isinstance(pb["bootstrap_room"], int) and 0 <= pb["bootstrap_room"] < 2**63
    assert wait_until(pd.idle)
    text_m = pd.metrics()
    assert metric(text_m, "fleetgate_pd_handoffs_total", outcome="ok") >= 1
    if stream:
        assert metric(text_m, "fleetgate_pd_transfer_seconds_count") >= 1


def test_decodes_share_the_load(pd: PdFleet):
    before = [len(pd.seen(d)) for d in pd.decode]
    for _ in range(6):
        assert _chat(pd, False)
    got = [len(pd.seen(d)) - n for d, n in zip(pd.decode, before, strict=True)]
    assert sum(got) == 6 and min(got) >= 1  # least decode load: one after the other
    assert wait_until(pd.idle)


def test_the_prefill_prefix_index_follows_the_handoffs(pd: PdFleet):
    """The default selector reads the prompt's chain, so the gateway hashes it; its prefill
    index hears the pairs' hand-offs (policies/pd/pair_state.py): the prefill worker holds
    the prompt once handed off, and the same prompt's blocks are hits the next time."""
    text = pd.metrics()
    q0 = metric(text, "fleetgate_prefix_index_queried_blocks_total", pool="short")
    h0 = metric(text, "fleetgate_prefix_index_hit_blocks_total", pool="short")
    for _ in range(2):
        assert _chat(pd, False)
    assert wait_until(pd.idle)
    text = pd.metrics()
    queried = metric(text, "fleetgate_prefix_index_queried_blocks_total", pool="short") - q0
    hits = metric(text, "fleetgate_prefix_index_hit_blocks_total", pool="short") - h0
    assert queried >= 2 and hits >= queried / 2  # the second prompt's blocks, at least
    assert metric(text, "fleetgate_prefix_index_blocks", pool="short") >= 1


# -- failures ---------------------------------------------------------------------------


def test_a_prefill_failure_is_the_clients_and_no_decode_is_called(fleets: Any):
    f = fleets["vllm"]["m-p500"]
    with pytest.raises(openai.InternalServerError):
        _chat(f, False)
    assert f.seen(f.decode[0]) == []
    assert wait_until(f.idle)
    assert metric(f.metrics(), "fleetgate_pd_handoffs_total", outcome="prefill_failed") >= 1


def test_a_decode_failure_after_the_handoff_ends_the_stream_with_an_error(fleets: Any):
    f = fleets["vllm"]["m-dies"]
    body = {
        "model": f.model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 50,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f.gateway.url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert lines[-2].startswith('data: {"error"')
    assert wait_until(f.idle)


@pytest.mark.parametrize("personality", ["vllm", "sglang"])
def test_a_client_gone_mid_transfer_gives_both_slots_back(fleets: Any, personality: str):
    f = fleets[personality]["m-slow"]
    body = {"model": f.model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 20}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f.gateway.url + "/v1/chat/completions", json=body, timeout=0.5)
    assert wait_until(f.idle)


# -- the pair-aware regime controller, live --------------------------------------------


def test_a_burst_drives_the_regime_adaptive_pairs_into_transition_and_back(fleets: Any):
    """The gateway's pair sampler hears the pool's streamed first tokens (TTFT at the
    gateway), its detector crosses θ1, and the next pair decision applies Table 2's
    Transition row (τ 0.7, ω 1): the exported gauges show it. Bursts go out until the
    regime gauge reads Transition, up to a deadline; then requests one at a time until it
    reads Below again (Table 2's Below row back: τ 0)."""
    f = fleets["vllm"]["m-regime"]
    pool = f.pool
    text = f.metrics()
    assert metric(text, "fleetgate_routing_regime", pool=pool) == 0  # no traffic yet: Below
    assert metric(text, "fleetgate_routing_temperature", pool=pool) == 0.0
    assert metric(text, "fleetgate_routing_overlap_weight", pool=pool) == 1.0

    def one(_: int) -> str:
        return _chat(f, True)

    def burst() -> None:
        with ThreadPoolExecutor(REGIME_BURST) as ex:
            assert all(ex.map(one, range(REGIME_BURST)))

    deadline = time.monotonic() + 60.0
    bursts = 0
    while time.monotonic() < deadline:
        burst()
        bursts += 1
        if metric(f.metrics(), "fleetgate_routing_regime", pool=pool) == 1:
            break
    text = f.metrics()
    assert metric(text, "fleetgate_routing_regime", pool=pool) == 1, bursts
    assert metric(text, "fleetgate_routing_temperature", pool=pool) == 0.7
    assert metric(text, "fleetgate_routing_overlap_weight", pool=pool) == 1.0
    assert metric(text, "fleetgate_routing_regime_changes_total", pool=pool) >= 1
    # the detector's L̄ (its value now may already be falling: the hysteresis keeps the regime)
    assert metric(text, "fleetgate_routing_ttft_p99_smoothed_seconds", pool=pool) > 0
    assert wait_until(f.idle)

    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        assert one(0)
        if metric(f.metrics(), "fleetgate_routing_regime", pool=pool) == 0:
            break
    text = f.metrics()
    assert metric(text, "fleetgate_routing_regime", pool=pool) == 0
    assert metric(text, "fleetgate_routing_temperature", pool=pool) == 0.0
    assert metric(text, "fleetgate_routing_regime_changes_total", pool=pool) >= 2
    assert wait_until(f.idle)
