"""The gateway end to end: the official openai SDK → gateway process → emulator processes."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.fleet import MODEL, metric, wait_until

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "Say hello."}]


def client(fleet, **kw) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=fleet.url + "/v1", api_key="unused", max_retries=0, timeout=30, **kw
    )


def long_prompt(words: int) -> str:
    return " ".join(f"word{i % 97}" for i in range(words))


def test_chat_non_streaming_usage_and_headers(fleet):
    raw = client(fleet).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=7,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": "req-123"},
    )
    r = raw.parse()
    assert r.choices[0].message.content
    assert r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7
    assert raw.headers["x-request-id"] == "req-123"
    assert raw.headers["x-fleetgate-pool"] == "short"
    assert raw.headers["x-fleetgate-worker"] in {p.url.split("://")[1] for p in fleet.short}


def test_usage_matches_a_direct_call(fleet):
    direct = openai.OpenAI(base_url=fleet.short[0].url + "/v1", api_key="x", max_retries=0)
    kw = {"model": MODEL, "messages": HELLO, "max_tokens": 5, "extra_body": {"ignore_eos": True}}
    via = client(fleet).chat.completions.create(**kw)
    assert direct.chat.completions.create(**kw).usage == via.usage


def test_chat_streaming_without_usage_request_hides_usage(fleet):
    before = metric(fleet.metrics(), "fleetgate_completion_tokens_total", pool="short")
    chunks = list(
        client(fleet).chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=6, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert chunks, "no chunks"
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)  # the usage-only chunk we asked for was stripped
    assert chunks[-1].choices[0].finish_reason == "length"
    # ... but the gateway still learned the engine's count
    assert wait_until(
        lambda: (
            metric(fleet.metrics(), "fleetgate_completion_tokens_total", pool="short") == before + 6
        )
    )


def test_chat_streaming_with_usage(fleet):
    chunks = list(
        client(fleet).chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].choices == []
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text


def test_completions_both_ways(fleet):
    c = client(fleet)
    r = c.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert r.usage.completion_tokens == 3 and r.choices[0].text
    chunks = list(
        c.completions.create(
            model=MODEL,
            prompt="Once upon a time",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 3
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices)


def test_long_prompt_goes_to_the_long_pool(fleet):
    raw = client(fleet).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": long_prompt(9000)}], max_tokens=4
    )
    assert raw.headers["x-fleetgate-pool"] == "long"
    assert raw.parse().usage.prompt_tokens > 8192


def test_400_404(fleet):
    c = client(fleet)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[])
    assert e.value.body["code"] == "invalid_request"
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=0)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="no-such-model", messages=HELLO)
    assert e.value.body["code"] == "model_not_found"
    r = httpx.post(fleet.url + "/v1/chat/completions", content=b"{not json", timeout=5)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_too_long_for_every_pool_is_openai_context_length_exceeded(fleet):
    """Was: 413, which the SDK raises as a bare APIStatusError (and LiteLLM does not see as
    a context-window error). OpenAI, vLLM and SGLang answer 400 context_length_exceeded."""
    c = client(fleet)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": long_prompt(80000)}]
        )
    assert e.value.status_code == 400
    err = e.value.response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == "messages"
    assert "connection" not in e.value.response.headers or (
        e.value.response.headers["connection"] != "close"
    )  # the body was read whole: the connection goes on
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt=long_prompt(80000), max_tokens=4)
    err = e.value.response.json()["error"]
    assert (err["code"], err["param"]) == ("context_length_exceeded", "prompt")


def test_engine_4xx_passes_through_unchanged(fleet):
    body = {"model": MODEL, "messages": HELLO, "temperature": 3.0}
    direct = httpx.post(fleet.short[0].url + "/v1/chat/completions", json=body, timeout=5)
    via = httpx.post(fleet.url + "/v1/chat/completions", json=body, timeout=5)
    assert direct.status_code == via.status_code == 400
    assert via.content == direct.content


def test_models_is_the_union(fleet):
    models = client(fleet).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].model_extra["max_model_len"] == 65536


def test_health_ready_metrics(fleet):
    assert httpx.get(fleet.url + "/healthz").status_code == 200
    assert httpx.get(fleet.url + "/readyz").status_code == 200
    text = fleet.metrics()
    for name in (
        "fleetgate_requests_total",
        "fleetgate_request_duration_seconds_bucket",
        "fleetgate_worker_in_flight",
        "fleetgate_worker_healthy",
        "fleetgate_worker_telemetry_stale",
    ):
        assert name in text, name
    assert metric(text, "fleetgate_worker_healthy") == 3
    assert httpx.get(fleet.url + "/nope").status_code == 404
    assert httpx.post(fleet.url + "/v1/models").status_code == 405


def test_client_hanging_up_right_after_done_is_a_success(fleet):
    """The openai SDK may close as soon as it reads [DONE], before the engine's final empty
    chunk has crossed the gateway: that is a complete answer, not a disconnect."""
    before = fleet.metrics()
    c = client(fleet)
    for _ in range(60):
        for _chunk in c.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=3, stream=True
        ):
            pass
    assert wait_until(
        lambda: (
            metric(fleet.metrics(), "fleetgate_requests_total", status="200")
            == metric(before, "fleetgate_requests_total", status="200") + 60
        )
    )
    after = fleet.metrics()
    assert metric(after, "fleetgate_client_disconnects_total") == metric(
        before, "fleetgate_client_disconnects_total"
    )


def _engine_id(answer_id: str) -> str:
    """The request id the engine used: vLLM's answer id is `chatcmpl-` + the id it was sent
    (X-Request-Id; WIRE_SPEC §3), the emulator's too."""
    assert answer_id.startswith("chatcmpl-"), answer_id
    return answer_id.removeprefix("chatcmpl-")


def test_engines_get_the_gateways_request_id_never_the_clients(fleet):
    """Was: the client's X-Request-Id forwarded as the engine's request id, and the ids the
    gateway made up predictable (a per-process prefix + a counter): one tenant could claim
    the id another tenant's request was then given (vLLM refuses duplicate ids)."""
    alice, mallory = client(fleet), client(fleet)
    # a request without an id: the gateway's id, in the answer's header
    raw = alice.chat.completions.with_raw_response.create(model=MODEL, messages=HELLO, max_tokens=2)
    given = raw.headers["x-request-id"]
    first = _engine_id(raw.parse().id)
    # another tenant sends that id, and the ones a counter would give next
    guesses = [given, *(given[:-1] + c for c in "0123456789abcdef"), "victim-1"]
    seen = {first}
    for guess in guesses:
        raw = mallory.chat.completions.with_raw_response.create(
            model=MODEL, messages=HELLO, max_tokens=2, extra_headers={"x-request-id": guess}
        )
        assert raw.headers["x-request-id"] == guess  # the client's id comes back to it
        engine = _engine_id(raw.parse().id)
        assert engine not in seen and engine not in guesses
        assert len(engine) >= 32  # 128 bits: not guessable
        seen.add(engine)
    # the same client id on two concurrent requests: two engine ids, both answered
    import concurrent.futures

    def stream_once() -> str:
        with alice.chat.completions.with_streaming_response.create(
            model=MODEL, messages=HELLO, max_tokens=20, stream=True,
            extra_body={"ignore_eos": True}, extra_headers={"x-request-id": "same"},
        ) as r:  # fmt: skip
            assert r.headers["x-request-id"] == "same"
            ids = {c.id for c in r.parse()}
        assert len(ids) == 1
        return _engine_id(ids.pop())

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda _: stream_once(), range(2))
    assert a != b and "same" not in (a, b)


def test_a_body_request_id_does_not_reach_the_engine(fresh_procs):
    """SGLang takes its request id from the body's `rid` (vLLM from the header, else the
    body's `request_id`): a client's own goes no further than the gateway."""
    from tests.e2e.fleet import emulator, gateway_config, start_gateway

    emu = emulator(fresh_procs, "rid-sglang", 8192, "--personality", "sglang").wait_ready("/health")
    cfg = gateway_config([emu.url], [])
    cfg["pools"]["short"]["workers"][0]["engine"] = "sglang"
    gw = start_gateway(fresh_procs, cfg)
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    ids = set()
    for _ in range(2):
        r = c.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=2,
            extra_body={"rid": "victim-rid", "request_id": "victim-rid"},
        )  # fmt: skip
        assert r.id != "victim-rid"  # SGLang's answer id is its rid
        ids.add(r.id)
    assert len(ids) == 2


def test_tool_calls_pass_through_the_gateway(fleet):
    """The emulator answers a named tool_choice with a call (as vLLM): through the gateway
    the SDK reads the same call, whole and streamed."""
    import json

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}]  # fmt: skip
    choice = {"type": "function", "function": {"name": "get_time"}}
    c = client(fleet)
    r = c.chat.completions.create(
        model=MODEL, messages=HELLO, tools=tools, tool_choice=choice, max_tokens=32
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and "tz" in json.loads(call.function.arguments)
    parts, names = [], set()
    for chunk in c.chat.completions.create(
        model=MODEL, messages=HELLO, tools=tools, tool_choice=choice, max_tokens=32, stream=True
    ):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.function.name:
                    names.add(tc.function.name)
                parts.append(tc.function.arguments or "")
    assert names == {"get_time"} and "tz" in json.loads("".join(parts))
