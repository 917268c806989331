"""Cache-aware routing end to end (issue 27): a gateway routing `kv_cost` over three
emulators with prefix caching, multi-turn chats through the official openai SDK. The
core's dispatch events keep the prefix index current, so a conversation's later turns go
where its earlier ones went and the engine serves their shared prefix from its cache
(usage.prompt_tokens_details.cached_tokens, as vLLM reports it)."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, metric, start_gateway, wait_until

pytestmark = pytest.mark.e2e


def test_kv_cost_keeps_each_conversation_on_its_cached_prefix(fresh_procs):
    emus = [
        emulator(fresh_procs, f"kv-{i}", 8192, "--enable-prompt-tokens-details") for i in range(3)
    ]
    for e in emus:
        e.wait_ready()
    cfg = gateway_config([e.url for e in emus], [])
    cfg["pools"]["short"]["routing"] = {"policy": "kv_cost"}  # type: ignore[index]
    cfg.setdefault("telemetry", {})["poa_interval_s"] = 0.2  # type: ignore[index]
    gw = start_gateway(fresh_procs, cfg)
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    workers: dict[int, set[str]] = {}
    cached_later: list[int] = []
    requests = 0
    for conv in range(4):
        messages = [
            {"role": "system", "content": f"Conversation {conv}. " + "Answer briefly. " * 150}
        ]
        for turn in range(3):
            messages.append({"role": "user", "content": f"question {turn} of {conv}"})
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=8
            )
            requests += 1
            reply = raw.parse()
            workers.setdefault(conv, set()).add(raw.headers["x-fleetgate-worker"])
            details = reply.usage.prompt_tokens_details
            assert details is not None
            if turn:
                cached_later.append(details.cached_tokens or 0)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    # each conversation stayed on one worker, and its later turns hit that engine's cache
    assert all(len(w) == 1 for w in workers.values()), workers
    assert len(set().union(*workers.values())) >= 2  # different prefixes spread (tie-break)
    # the ~460-token system prompt and then the earlier turns come from the cache
    assert all(c >= 400 for c in cached_later), cached_later
    pairs = zip(cached_later[::2], cached_later[1::2], strict=True)
    assert all(b > a for a, b in pairs), cached_later
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    assert metric(text, "fleetgate_routing_decision_seconds_count", pool="short") == requests
    assert metric(text, "fleetgate_routing_temperature", pool="short") == 0.0
    assert metric(text, "fleetgate_routing_overlap_weight", pool="short") == 1.0
    queried = metric(text, "fleetgate_prefix_index_queried_blocks_total", pool="short")
    hits = metric(text, "fleetgate_prefix_index_hit_blocks_total", pool="short")
    assert 0 < hits < queried and metric(text, "fleetgate_prefix_index_blocks") > 0

    # the PoA diagnostics, estimated off the loop every 0.2 s, cover the 12 completions
    def poa_window() -> float:
        text = httpx.get(gw.url + "/metrics", timeout=5).text
        return metric(text, "fleetgate_routing_poa_window_requests", pool="short")

    assert wait_until(lambda: poa_window() == requests, timeout=20.0)
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    for estimator in ("paper", "calibrated"):
        assert metric(text, "fleetgate_routing_poa_ratio", pool="short", estimator=estimator) > 0
    # a per-request override is bounded: a bad value is a 400 naming the header
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_headers={"x-fleetgate-overlap-weight": "-1"},
        )
    assert err.value.body["param"] == "x-fleetgate-overlap-weight"  # type: ignore[index]
