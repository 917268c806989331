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
