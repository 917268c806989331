"""What the gateway fills for the cache-aware routers before the core starts a request
(gateway/cache_routing.py), and how its composition root wires them (gateway/cache_wiring.py
`gateway_core_spec`, policies/build.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compressor.chat_ids import chat_ids
from emulator.prefix import block_hashes
from gateway import cache_routing
from gateway.cache_wiring import gateway_core_spec, kv_event_streams
from gateway.config import ConfigError, load_config
from gateway.errors import InvalidRequest
from gateway.openai_request import parse
from gateway.workers import Fleet
from policies.build import build_core, request_fields
from policies.clock import ManualClock
from policies.events import Request
from policies.intake import CHAT, ChatSize, Prompt
from policies.types import PoolSpec
from tests.e2e.fleet import gateway_config

HISTORY = [{"role": "system", "content": "You are terse. " * 200}]


def chat(*turns: str, **extra: object):
    messages = [*HISTORY, *({"role": "user", "content": t} for t in turns)]
    return parse(json.dumps({"model": "m", "messages": messages, **extra}).encode(), "chat")


def request() -> Request:
    return Request(Prompt(CHAT, "m", ChatSize(10, 1), 10), "r", [PoolSpec("short", 8192)])


ALL = frozenset({"prefix_hashes", "session", "router_temperature", "overlap_weight"})


def test_a_later_turn_shares_the_earlier_turns_chunks():
    one = cache_routing.prompt_hashes(chat("first question"))
    two = cache_routing.prompt_hashes(chat("first question", "second, longer question " * 30))
    shared = len(json.dumps(HISTORY, separators=(",", ":"))) // cache_routing.PREFIX_BLOCK_BYTES
    assert shared >= 5 and one[:shared] == two[:shared] and len(two) > len(one)


def test_prompt_hashes_agree_across_processes_with_different_hash_seeds():
    """Replicas must agree: Python's hash() of bytes is salted per process."""
    code = (
        "import json,sys; from gateway.cache_routing import prompt_hashes;"
        "from gateway.openai_request import parse;"
        "print(prompt_hashes(parse(sys.stdin.buffer.read(), 'chat')))"
    )
    body = json.dumps({"model": "m", "messages": HISTORY}).encode()
    outs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.getcwd()}
        run = subprocess.run(
            [sys.executable, "-c", code], input=body, capture_output=True, env=env, check=True
        )
        outs.add(run.stdout)
    assert len(outs) == 1 and outs.pop().startswith(b"(")


def test_describe_fills_only_what_the_routers_read():
    parsed = chat("q", user="alice")
    r = request()
    cache_routing.describe(r, parsed, frozenset(), b"s1", b"0.5", b"2")
    assert r.prefix_hashes == () and r.session == "" and r.router_temperature is None
    r = request()
    cache_routing.describe(r, parsed, ALL, None, b"0.7", b"4")
    assert r.prefix_hashes == cache_routing.prompt_hashes(parsed)
    assert r.session == "alice"  # the body's `user` without the header
    assert (r.router_temperature, r.overlap_weight) == (0.7, 4.0)
    r = request()
    cache_routing.describe(r, parsed, ALL, b"conv-9" + b"x" * 1000, None, None)
    assert r.session.startswith("conv-9") and len(r.session) == cache_routing.MAX_SESSION_BYTES
    assert r.router_temperature is None and r.overlap_weight is None


@pytest.mark.parametrize("bad", [b"-1", b"nan", b"inf", b"fast", b"\xff"])
def test_a_bad_override_header_is_a_400_naming_it(bad):
    with pytest.raises(InvalidRequest) as err:
        cache_routing.describe(request(), chat("q"), ALL, None, None, bad)
    assert err.value.param == cache_routing.OVERLAP_HEADER


def test_the_gateway_wires_a_pools_cache_router_and_its_hooks():
    cfg = gateway_config(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    cfg["pools"]["short"]["routing"] = {"policy": "kv_cost", "params": {"temperature": 0.3}}  # type: ignore[index]
    cfg["pools"]["long"]["routing"] = {"policy": "session_affinity"}  # type: ignore[index]
    spec = gateway_core_spec(load_config(data=cfg, environ={}))
    # the gateway's hashes are byte chunks: a hashed block stands for ~128 tokens
    assert spec.pool_routing["short"].params == {"temperature": 0.3, "hash_block_tokens": 128}
    assert spec.pool_routing["long"].params == {}
    assert request_fields(spec) == ALL
    core, _ = build_core(spec, ManualClock())
    assert core.hooks == ()
    router = core.routers["short"] = core.router_for("short")
    state = router.state  # type: ignore[attr-defined]
    assert core.hooks == (state,) and state.index.block_tokens == 128


def test_default_routing_reads_nothing_more():
    cfg = gateway_config(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    spec = gateway_core_spec(load_config(data=cfg, environ={}))
    assert request_fields(spec) == frozenset()


def test_kv_events_make_the_hashes_token_blocks_of_the_engines_size():
    cfg = gateway_config(["http://10.0.0.5:8000", "http://127.0.0.1:2"], [])
    short = cfg["pools"]["short"]  # type: ignore[index]
    short["routing"] = {"policy": "kv_cost"}
    short["kv_events"] = {"block_size": 32}
    short["workers"][1]["kv_events_endpoint"] = "ipc:///tmp/kv-1"
    config = load_config(data=cfg, environ={})
    spec = gateway_core_spec(config)
    assert spec.pool_routing["short"].params == {"hash_block_tokens": 32}
    fleet = Fleet(config)
    streams = kv_event_streams(config, fleet)
    assert [s.endpoint for s in streams] == ["tcp://10.0.0.5:5557", "ipc:///tmp/kv-1"]
    assert {s.pool for s in streams} == {"short"} and len({s.worker for s in streams}) == 2
    # the gateway's token chain of a chat is its rendered ids' blocks: the emulator's
    # /tokenize ids (the same renderer, compressor/chat_ids.py) chained per 32 tokens
    parsed = chat("q")
    ids = chat_ids(parsed.body["messages"])
    assert cache_routing.token_hasher(None, 32)(parsed) == block_hashes(ids, 32)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"long": {"kv_events": {"block_size": 32}}}, "kv_events.block_size"),
        ({"short": {"kv_events": {"endpoint": "http://x"}}}, "endpoint"),
        ({"short": {"kv_events": {"block_size": 0}}}, "block_size"),
        ({"short": {"routing": {"policy": "least_loaded"}}}, "reads no prefix index"),
    ],
)
def test_kv_events_settings_are_checked(change: dict[str, dict[str, object]], key: str):
    cfg = gateway_config(["http://127.0.0.1:1"], ["http://127.0.0.1:2"])
    cfg["pools"]["short"]["kv_events"] = {"block_size": 16}  # type: ignore[index]
    cfg["routing"] = {"policy": "kv_cost"}
    for pool, extra in change.items():
        cfg["pools"][pool].update(extra)  # type: ignore[index]
    with pytest.raises(ConfigError) as err:
        load_config(data=cfg, environ={})
    assert key in str(err.value)
