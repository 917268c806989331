"""`fleetgate emulate --personality sglang` against WIRE_SPEC §1–§6 (SGLang 0.5.23)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from compressor.tokenizer import cl100k
from tests.contract import emu_fidelity as fid
from tests.contract.emu_wire import compact, metrics, post, sample, sse_events, stream_raw
from tests.procs import Proc, procs

pytestmark = pytest.mark.e2e

L = 2048
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "Say hello"}]
USAGE6 = ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
          "reasoning_tokens", "completion_tokens_details"]  # fmt: skip


@pytest.fixture(scope="module")
def emu() -> Iterator[Proc]:
    with procs() as ps:
        p = ps.emulator("sglang", "--personality", "sglang", "--model", "qwen-7b",
                        "--context-length", str(L), "--time-scale", "0.01",
                        "--mean-output-tokens", "6")  # fmt: skip
        yield p.wait_ready()


def _flat_err(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert r.content == compact(body)
    assert list(body) == ["object", "message", "type", "param", "code"]
    assert body["object"] == "error" and body["param"] is None and body["code"] == status
    return dict(body)


def test_chat_body(emu: Proc) -> None:
    r = post(
        emu.url,
        CHAT,
        {"model": "anything-goes", "messages": MSG, "max_tokens": 3, "ignore_eos": True},
    )
    body = r.json()
    assert r.status_code == 200 and r.content == compact(body)
    assert list(body) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    assert re.fullmatch(r"[0-9a-f]{32}", body["id"])
    assert body["model"] == "anything-goes"  # not validated, echoed
    (c,) = body["choices"]
    assert list(c) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    assert list(c["message"]) == ["role", "content", "reasoning_content"]
    assert c["finish_reason"] == "length" and c["matched_stop"] is None
    assert list(body["usage"]) == USAGE6
    assert body["usage"]["completion_tokens"] == 3
    assert body["metadata"] == {"weight_version": "default"}
    body = post(emu.url, CHAT, {"messages": MSG, "max_tokens": 1}).json()
    assert body["model"] == "default"


def test_completion_body_and_eos(emu: Proc) -> None:
    body = post(emu.url, COMP, {"prompt": "Hi", "ignore_eos": True}).json()
    assert list(body["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "matched_stop",
    ]
    assert body["usage"]["completion_tokens"] == 16
    stops = []
    for i in range(12):
        b = post(emu.url, COMP, {"prompt": f"Question {i}", "max_tokens": 100}).json()
        c = b["choices"][0]
        if c["finish_reason"] == "stop":
            stops.append(c["matched_stop"])
            assert len(cl100k().encode(c["text"])) == b["usage"]["completion_tokens"] - 1
    assert stops and len(set(stops)) == 1 and isinstance(stops[0], int)


def test_absent_max_tokens_is_context_minus_one(emu: Proc) -> None:
    p = post(emu.url, "/tokenize", {"prompt": "x"}).json()
    assert list(p) == ["tokens", "count", "max_model_len"] and p["max_model_len"] == L
    body = post(emu.url, CHAT, {"messages": MSG, "ignore_eos": True}).json()
    prompt = body["usage"]["prompt_tokens"]
    assert body["usage"]["completion_tokens"] == L - 1 - prompt


def test_chat_stream(emu: Proc) -> None:
    r, raw = stream_raw(emu.url, CHAT, {"messages": MSG, "max_tokens": 3, "ignore_eos": True, "stream": True,
                                        "stream_options": {"include_usage": True}})  # fmt: skip
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    ev = sse_events(raw)
    role, *content, finish, usage = ev
    assert list(role) == ["id", "object", "created", "model", "choices"]
    assert role["choices"][0]["delta"] == {
        "reasoning_content": None,
        "role": "assistant",
        "content": "",
    }
    assert len(content) == 3
    for c in content:
        ch = c["choices"][0]
        assert list(ch) == ["index", "delta", "logprobs", "finish_reason", "matched_stop"]
        assert list(ch["delta"]) == ["reasoning_content", "content"]
        assert ch["finish_reason"] is None and "usage" not in c
        assert len(cl100k().encode(ch["delta"]["content"])) == 1
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}  # its own chunk
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and list(usage["usage"]) == USAGE6
    assert usage["usage"]["completion_tokens"] == 3


def test_completion_stream(emu: Proc) -> None:
    _, raw = stream_raw(emu.url, COMP, {"prompt": "Paris", "max_tokens": 2, "ignore_eos": True, "stream": True,
                                        "stream_options": {"include_usage": True}})  # fmt: skip
    ev = sse_events(raw)
    assert len(ev) == 3
    for e in ev[:2]:
        assert (
            list(e) == ["id", "object", "created", "model", "choices", "usage"]
            and e["usage"] is None
        )
    assert [e["choices"][0]["finish_reason"] for e in ev[:2]] == [None, "length"]
    assert ev[2]["choices"] == []
    assert list(ev[2]["usage"]) == [
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "reasoning_tokens",
    ]


def test_openai_sdk(emu: Proc) -> None:
    client = openai.OpenAI(base_url=emu.url + "/v1", api_key="none", max_retries=0)
    text = "".join(
        (c.choices[0].delta.content or "") if c.choices else ""
        for c in client.chat.completions.create(
            model="default",
            messages=MSG,
            max_tokens=4,
            stream=True,
            extra_body={"ignore_eos": True},  # type: ignore[arg-type]
        )
    )
    assert len(cl100k().encode(text)) == 4
    assert [m.id for m in client.models.list().data] == ["qwen-7b"]


def test_errors(emu: Proc) -> None:
    e = _flat_err(post(emu.url, CHAT, {"messages": MSG, "max_tokens": L}), 400)
    p = post(emu.url, CHAT, {"messages": MSG, "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert e["type"] == "BadRequestError"
    assert e["message"] == (
        f"Requested token count exceeds the model's maximum context length of {L} tokens. You"
        f" requested a total of {p + L} tokens: {p} tokens from the input messages and {L} tokens"
        " for the completion. Please reduce the number of tokens in the input messages or the"
        " completion to fit within the limit."
    )
    long = [{"role": "user", "content": "word " * L}]
    e = _flat_err(post(emu.url, CHAT, {"messages": long}), 400)
    assert re.fullmatch(
        rf"The input \(\d+ tokens\) is longer than the model's context length \({L} tokens\)\.",
        e["message"],
    )
    e = _flat_err(post(emu.url, CHAT, {"messages": []}), 400)
    assert e["message"] == "Messages cannot be empty."
    e = _flat_err(post(emu.url, COMP, {"prompt": "x", "max_tokens": 0}), 400)
    assert e["type"] == "Bad Request" and "max_tokens must be positive" in e["message"]
    r = httpx.post(
        emu.url + CHAT, content=b'{"messages": ', headers={"Content-Type": "application/json"}
    )
    e = _flat_err(r, 400)
    assert "json_invalid" in e["message"] and "('body', 13)" in e["message"]
    r = httpx.post(emu.url + CHAT, content=b"{}", headers={"Content-Type": "text/plain"})
    assert "Unsupported Media Type" in _flat_err(r, 400)["message"]
    r = httpx.get(emu.url + "/nope")
    assert r.status_code == 404 and r.content == b'{"detail":"Not Found"}'


def test_endpoints(emu: Proc) -> None:
    h = httpx.get(emu.url + "/health")
    assert h.status_code == 200 and h.content == b""
    assert httpx.get(emu.url + "/version").status_code == 404  # how routers tell SGLang apart
    card = httpx.get(emu.url + "/v1/models").json()["data"][0]
    assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len"]
    assert card["owned_by"] == "sglang" and card["max_model_len"] == L
    assert httpx.get(emu.url + "/v1/models/qwen-7b").json()["id"] == "qwen-7b"
    r = httpx.get(emu.url + "/v1/models/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    info = httpx.get(emu.url + "/server_info").json()
    assert info["version"] == "0.5.23" and info["context_length"] == L
    assert httpx.get(emu.url + "/model_info").json()["is_generation"] is True
    t = post(emu.url, "/v1/tokenize", {"prompt": "Hello world"}).json()
    assert post(emu.url, "/detokenize", {"tokens": t["tokens"][1:]}).json() == {
        "text": "Hello world"
    }


def test_metrics(emu: Proc) -> None:
    post(emu.url, CHAT, {"messages": MSG, "max_tokens": 2})
    r = httpx.get(emu.url + "/metrics")
    assert r.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "_created" not in r.text
    fams = metrics(emu.url)
    for name, kind in {
        "sglang:num_running_reqs": "gauge",
        "sglang:num_queue_reqs": "gauge",
        "sglang:token_usage": "gauge",
        "sglang:cache_hit_rate": "gauge",
        "sglang:gen_throughput": "gauge",
        "sglang:prompt_tokens": "counter",
        "sglang:generation_tokens": "counter",
        "sglang:num_requests": "counter",
        "sglang:time_to_first_token_seconds": "histogram",
        "sglang:e2e_request_latency_seconds": "histogram",
        "sglang:queue_time_seconds": "histogram",
    }.items():
        assert fams[name].type == kind, name
    sched = {"engine_type": "unified", "model_name": "qwen-7b", "tp_rank": "0"}
    assert sample(fams, "sglang:num_running_reqs", **sched) == 0
    assert sample(fams, "sglang:num_requests_total", is_streaming="false") >= 1
    om = httpx.get(
        emu.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")


# -- fidelity: stop, logprobs, no empty answers (checks in tests/contract/emu_fidelity.py) ----


def test_stop_strings(emu: Proc) -> None:
    fid.check_stop_strings(emu.url, vllm=False)
    fid.check_stop_on_last_allowed_token(emu.url, vllm=False)


def test_stop_token_ids(emu: Proc) -> None:
    fid.check_stop_token_ids(emu.url, vllm=False)


def test_stream_never_shows_the_stop_string(emu: Proc) -> None:
    fid.check_stream_hides_stop_string(emu.url, vllm=False)


def test_chat_logprobs(emu: Proc) -> None:
    fid.check_chat_logprobs(emu.url, vllm=False)


def test_completion_logprobs(emu: Proc) -> None:
    fid.check_completion_logprobs(emu.url, vllm=False)


def test_no_empty_answers(emu: Proc) -> None:
    fid.check_eos_never_first(emu.url, CHAT, "default")


def test_stop_and_logprobs_are_not_capped(emu: Proc) -> None:
    """SGLang has no VLLM_MAX_STOP_STRINGS, no --max-logprobs check, and ignores
    top_logprobs unless logprobs is true."""
    body = {"messages": MSG, "max_tokens": 2, "ignore_eos": True}
    r = post(emu.url, CHAT, {**body, "stop": ["a1", "b1", "c1", "d1", "e1"]})
    assert r.status_code == 200
    r = post(emu.url, CHAT, {**body, "top_logprobs": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None
    r = post(emu.url, CHAT, {**body, "logprobs": True, "top_logprobs": 25})
    assert r.status_code == 200
    assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 25


# -- tool calls (SGLang serving_chat.py _process_tool_calls / _process_tool_call_stream) ----
# the tools and the schema check (jsonschema, independent of the emulator's generator) are
# the vLLM personality's
from tests.contract.test_emulator_wire_vllm import (  # noqa: E402
    CLOCK,
    NAMED,
    TOOL_MSG,
    WEATHER,
    _valid_arguments,
)

CALL_ID = r"call_[0-9a-f]{24}"
ASKS = [{"role": "user", "content": "Please use get_weather for Paris."}]


def _tools(choice: Any, stream: bool = False, **kw: Any) -> dict[str, Any]:
    return {"messages": ASKS, "tools": [CLOCK, WEATHER], "tool_choice": choice,
            "max_tokens": 64, "stream": stream} | kw  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "name"),
    [(NAMED, "get_weather"), ("required", "get_time"), ("auto", "get_weather")],
    ids=["named", "required", "auto"],
)
def test_tool_choice_answers_a_tool_call(emu: Proc, choice: Any, name: str) -> None:
    """Was: SGLang answered text whatever `tool_choice` said. Now as SGLang with a tool-call
    parser: content "", one `ToolCall` (id, index, type, function) after reasoning_content,
    finish_reason "tool_calls" for every call (a named one too), matched_stop null."""
    r = post(emu.url, CHAT, _tools(choice))
    assert r.status_code == 200, r.text
    body = r.json()
    assert r.content == compact(body)
    (c,) = body["choices"]
    assert list(c) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
    assert list(c["message"]) == ["role", "content", "reasoning_content", "tool_calls"]
    assert c["message"]["content"] == "" and c["message"]["reasoning_content"] is None
    (call,) = c["message"]["tool_calls"]
    assert list(call) == ["id", "index", "type", "function"]
    assert re.fullmatch(CALL_ID, call["id"]) and call["index"] == 0
    assert call["type"] == "function" and list(call["function"]) == ["name", "arguments"]
    assert call["function"]["name"] == name
    _valid_arguments(name, call["function"]["arguments"])
    assert (c["finish_reason"], c["matched_stop"]) == ("tool_calls", None)


def test_no_tool_call_without_one_asked_and_sglang_s_refusals(emu: Proc) -> None:
    for choice, messages in (("none", ASKS), ("auto", MSG)):
        (c,) = post(emu.url, CHAT, _tools(choice, messages=messages)).json()["choices"]
        assert list(c["message"]) == ["role", "content", "reasoning_content"]
        assert c["message"]["content"] and c["finish_reason"] in ("stop", "length")
    e = _flat_err(post(emu.url, CHAT, _tools({"type": "function", "function": {"name": "x"}})), 400)
    assert e["message"] == "Tool 'x' not found in tools list."
    e = _flat_err(post(emu.url, CHAT, {"messages": MSG, "tool_choice": "required"}), 400)
    assert e["message"] == "Tools cannot be empty if tool choice is set to required."


@pytest.mark.parametrize("choice", [NAMED, "required"], ids=["named", "required"])
def test_tool_call_stream_chunks(emu: Proc, choice: Any) -> None:
    """The role chunk (msgspec); the call's opening — id, index, type, name, arguments ""
    — then argument parts (id and name null), pydantic chunks with every delta key and
    "usage":null; the finish chunk (msgspec) says tool_calls."""
    r, raw = stream_raw(emu.url, CHAT, _tools(choice, True))
    assert r.status_code == 200
    events = sse_events(raw)
    assert events[0]["choices"][0]["delta"] == {
        "reasoning_content": None,
        "role": "assistant",
        "content": "",
    }
    calls = [e for e in events[1:-1] if e["choices"] and "tool_calls" in e["choices"][0]["delta"]]
    for e in calls:
        assert list(e) == ["id", "object", "created", "model", "choices", "usage"]
        assert e["usage"] is None
        (ch,) = e["choices"]
        assert list(ch) == ["index", "delta", "logprobs", "finish_reason", "matched_stop"]
        assert list(ch["delta"]) == ["role", "content", "reasoning_content", "tool_calls"]
        assert ch["delta"]["content"] is None and ch["finish_reason"] is None
    opening = calls[0]["choices"][0]["delta"]["tool_calls"][0]
    assert re.fullmatch(CALL_ID, opening["id"]) and opening["index"] == 0
    assert opening["function"] == {"name": opening["function"]["name"], "arguments": ""}
    parts = [e["choices"][0]["delta"]["tool_calls"][0] for e in calls[1:]]
    assert parts and all(p["id"] is None and p["function"]["name"] is None for p in parts)
    _valid_arguments(
        opening["function"]["name"], "".join(p["function"]["arguments"] for p in parts)
    )
    last = events[-1]["choices"][0]
    assert last["delta"] == {"reasoning_content": None} and last["finish_reason"] == "tool_calls"
    assert raw.endswith(b"data: [DONE]\n\n")


def test_tool_calls_through_the_openai_sdk(emu: Proc) -> None:
    c = openai.OpenAI(base_url=emu.url + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(model="default", messages=TOOL_MSG,  # type: ignore[arg-type]
                                  tools=[WEATHER], tool_choice=NAMED, max_tokens=64)  # type: ignore[list-item]  # fmt: skip
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    _valid_arguments("get_weather", call.function.arguments)
    # streamed: the SDK's chunks put together give one call with valid arguments
    ids, names, parts, finish = set(), set(), [], None
    with c.chat.completions.create(model="default", messages=TOOL_MSG, tools=[WEATHER],  # type: ignore[arg-type,list-item]
                                   tool_choice="required", max_tokens=64, stream=True) as s:  # fmt: skip
        for chunk in s:
            for ch in chunk.choices:
                for tc in ch.delta.tool_calls or []:
                    assert tc.index == 0
                    if tc.id:
                        ids.add(tc.id)
                    if tc.function and tc.function.name:
                        names.add(tc.function.name)
                    if tc.function and tc.function.arguments:
                        parts.append(tc.function.arguments)
                finish = ch.finish_reason or finish
    assert len(ids) == 1 and names == {"get_weather"} and finish == "tool_calls"
    _valid_arguments("get_weather", "".join(parts))
