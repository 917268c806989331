"""Engine KV-cache events on loopback (issue 27): emulators publish vLLM's ZMQ stream
(`--kv-events-config`, over ipc:// sockets in the test's directory), the gateway's
consumer keeps a prefix index from it. Oracles: the engine's own /tokenize ids, chained by
the engine model's hashing (emulator/prefix.py), and the engine's reported cached tokens."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from emulator.prefix import block_hashes
from gateway import cache_routing
from gateway.kv_events import KvEventConsumer, Stream
from gateway.openai_request import parse
from policies.prefix_index import PrefixIndex
from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway, wait_until

pytestmark = pytest.mark.e2e
pytest.importorskip("zmq")  # the optional extra fleetgate[kv-events]
pytest.importorskip("msgpack")

BS = 16


def events_flag(endpoint: str) -> str:
    doc = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv"}
    return json.dumps(doc)


def messages(i: int, repeat: int = 60) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"Document {i}: " + f"fact {i} is recorded here. " * repeat},
        {"role": "user", "content": "summarise"},
    ]


def test_the_consumer_follows_an_emulators_stored_and_evicted_blocks(fresh_procs):
    endpoint = f"ipc://{fresh_procs.dir}/kv0"
    # a small cache: 48 blocks of 16 tokens (~770 tokens), so later prompts evict earlier
    emu = emulator(
        fresh_procs, "kv0", 768, "--num-kv-blocks", "48", "--kv-events-config",
        events_flag(endpoint),
    ).wait_ready()  # fmt: skip
    index = PrefixIndex(block_tokens=BS, ttl_s=1e9)

    async def main() -> None:
        consumer = KvEventConsumer(
            [Stream("short", "w0", endpoint, "kv", 1 << 20)], lambda p: index
        )
        loop = asyncio.get_running_loop()
        consumer.start(loop)
        http = httpx.AsyncClient(base_url=emu.url, timeout=10)

        async def chat(i: int) -> None:
            body = {"model": MODEL, "messages": messages(i), "max_tokens": 2}
            r = await http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text

        async def chain(i: int) -> tuple[int, ...]:
            r = await http.post("/tokenize", json={"model": MODEL, "messages": messages(i)})
            return block_hashes(r.json()["tokens"], BS)

        try:
            # a subscriber hears only what is published after it joined: send until it hears
            warm = 100
            while not index.blocks_of("w0"):
                await chat(warm)
                warm += 1
                assert warm < 200, "no KV event arrived"
                await asyncio.sleep(0.05)
            first = await chain(0)
            await chat(0)
            deadline = loop.time() + 10
            while index.overlap("w0", first) < len(first) and loop.time() < deadline:
                await asyncio.sleep(0.02)
            # every full block of the prompt, in the engine's chain as rebuilt from token ids
            assert len(first) >= 20 and index.overlap("w0", first) == len(first)
            # the gateway renders and hashes the same request to the same chain
            parsed = parse(json.dumps({"model": MODEL, "messages": messages(0)}).encode(), "chat")
            assert cache_routing.token_hasher(None, BS)(parsed) == first
            # other documents fill the cache: the engine evicts the first one's blocks
            for i in range(1, 4):
                await chat(i)
            applier = consumer.appliers["short"]
            deadline = loop.time() + 10
            while index.overlap("w0", first) == len(first) and loop.time() < deadline:
                await asyncio.sleep(0.02)
            assert index.overlap("w0", first) < len(first) and applier.removed > 0
            assert index.overlap("w0", await chain(3)) == len(await chain(3))
            assert consumer.gaps.get("short", 0) == 0
        finally:
            await http.aclose()
            await consumer.stop()

    asyncio.run(main())


def test_a_gateway_routes_by_the_engines_events(fresh_procs):
    endpoints = [f"ipc://{fresh_procs.dir}/kv-{i}" for i in range(2)]
    emus = [
        emulator(
            fresh_procs, f"kv-{i}", 8192, "--enable-prompt-tokens-details",
            "--kv-events-config", events_flag(endpoints[i]),
        )
        for i in range(2)
    ]  # fmt: skip
    for e in emus:
        e.wait_ready()
    cfg = gateway_config([e.url for e in emus], [])
    short = cfg["pools"]["short"]  # type: ignore[index]
    short["routing"] = {"policy": "kv_cost"}
    short["kv_events"] = {"topic": "kv", "block_size": BS}
    for w, endpoint in zip(short["workers"], endpoints, strict=True):
        w["kv_events_endpoint"] = endpoint
    gw = start_gateway(fresh_procs, cfg)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)

    def stored() -> float:
        text = httpx.get(gw.url + "/metrics", timeout=5).text
        return metric(text, "fleetgate_kv_events_total", pool="short", event="stored")

    # the subscriptions join asynchronously: warm up until the gateway hears events
    for i in range(100):
        client.chat.completions.create(model=MODEL, messages=messages(1000 + i), max_tokens=2)
        if wait_until(lambda: stored() > 0, timeout=0.3):
            break
    assert stored() > 0
    workers: dict[int, set[str]] = {}
    cached: list[int] = []
    long_cached: list[int] = []
    for conv in range(4):
        # the last one's ~12 KiB body is token-hashed on a thread (OFF_LOOP_BYTES)
        history = messages(conv, 500 if conv == 3 else 60)
        for turn in range(3):
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=history, max_tokens=4
            )
            reply = raw.parse()
            workers.setdefault(conv, set()).add(raw.headers["x-fleetgate-worker"])
            details = reply.usage.prompt_tokens_details
            assert details is not None
            if turn:
                cached.append(details.cached_tokens or 0)
                if conv == 3:
                    long_cached.append(details.cached_tokens or 0)
            history = [
                *history,
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": f"and turn {turn}?"},
            ]
    # each conversation stayed where its prefix is cached, and the engine served it from there
    assert all(len(w) == 1 for w in workers.values()), workers
    assert all(c >= 320 for c in cached), cached
    assert len(long_cached) == 2 and min(long_cached) >= 2500, long_cached  # ~2.8k tokens
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    assert metric(text, "fleetgate_kv_event_gaps_total", pool="short") == 0
    hits = metric(text, "fleetgate_prefix_index_hit_blocks_total", pool="short")
    assert hits > 0


def test_an_engine_restarted_without_a_clear_is_forgotten_at_its_first_batch(fresh_procs):
    """vLLM numbers a publisher's batches from 0: a restarted engine (a new PUB socket on
    the same endpoint, no AllBlocksCleared) breaks the consumer's sequence, and the
    blocks it held before the restart — gone from its cache — leave the index."""
    import msgpack
    import zmq

    endpoint = f"ipc://{fresh_procs.dir}/kv-restart"
    index = PrefixIndex(block_tokens=BS, ttl_s=1e9)
    before, after = list(range(1, 3 * BS + 1)), list(range(500, 500 + 2 * BS))
    old_chain, new_chain = block_hashes(before, BS), block_hashes(after, BS)

    def batch(pub: zmq.Socket[bytes], seq: int, hashes: list[int], ids: list[int]) -> None:
        events = [["BlockStored", hashes, None, ids, BS, None, "GPU"]]
        pub.send_multipart([b"kv", seq.to_bytes(8, "big"), msgpack.packb([0.0, events])])

    async def main() -> None:
        consumer = KvEventConsumer(
            [Stream("short", "w0", endpoint, "kv", 1 << 20)], lambda p: index
        )
        loop = asyncio.get_running_loop()
        consumer.start(loop)
        ctx = zmq.Context()
        try:
            pub = ctx.socket(zmq.PUB)
            pub.bind(endpoint)
            seq = 1000  # an engine that has been publishing a while
            # a subscriber hears only what is published after it joined: send until it hears
            deadline = loop.time() + 10
            while index.overlap("w0", old_chain) < len(old_chain):
                assert loop.time() < deadline, "no KV event arrived"
                batch(pub, seq, [7001, 7002, 7003], before)
                seq += 1
                await asyncio.sleep(0.05)
            assert consumer.gaps.get("short", 0) == 0
            pub.close(linger=0)
            # the engine restarts: a new publisher, numbering from 0, no AllBlocksCleared
            pub = ctx.socket(zmq.PUB)
            pub.bind(endpoint)
            seq = 0
            deadline = loop.time() + 10
            while index.overlap("w0", new_chain) < len(new_chain):
                assert loop.time() < deadline, "the consumer did not reconnect"
                batch(pub, seq, [9001, 9002], after)
                seq += 1
                await asyncio.sleep(0.05)
            pub.close(linger=0)
            assert index.overlap("w0", old_chain) == 0  # the stale blocks are gone
            assert consumer.gaps["short"] == 1 and consumer.appliers["short"].cleared == 1
        finally:
            await consumer.stop()
            ctx.destroy(linger=0)

    asyncio.run(main())
