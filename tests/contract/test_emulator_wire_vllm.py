"""`fleetgate emulate` (vLLM personality) against WIRE_SPEC §1–§6, over real HTTP.

One emulator process serves the module (time-scaled 100×); every assertion compares
what it sends with what vLLM 0.33 sends: key order, compact JSON, SSE framing, error
bodies, clamping, metric names. Counts are checked against the emulator's own
/tokenize and the cl100k tokenizer, never against hard-coded numbers.
"""

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
MSG = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]

CHAT_KEYS = ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
             "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
             "ec_transfer_params", "metrics"]  # fmt: skip
CHAT_CHOICE_KEYS = ["index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids",
                    "routed_experts", "weight_versions"]  # fmt: skip
MESSAGE_KEYS = ["role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"]
USAGE_KEYS = ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details",
              "completion_tokens_details"]  # fmt: skip
COMP_KEYS = ["id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
             "usage", "kv_transfer_params", "ec_transfer_params", "metrics"]  # fmt: skip
COMP_CHOICE_KEYS = ["index", "text", "logprobs", "finish_reason", "stop_reason", "token_ids",
                    "prompt_logprobs", "prompt_token_ids", "routed_experts", "weight_versions"]  # fmt: skip


@pytest.fixture(scope="module")
def emu() -> Iterator[Proc]:
    with procs() as ps:
        p = ps.emulator("vllm", "--model", "llama-8b", "--model", "llama-alias",
                        "--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", str(L),
                        "--time-scale", "0.01", "--mean-output-tokens", "6")  # fmt: skip
        yield p.wait_ready()


def _prompt_tokens(url: str, messages: list[dict[str, Any]]) -> int:
    r = post(url, "/tokenize", {"messages": messages})
    assert r.status_code == 200
    return int(r.json()["count"])


# -- non-streaming --------------------------------------------------------------------------


def test_chat_body_key_order_and_values(emu: Proc) -> None:
    r = post(
        emu.url,
        CHAT,
        {"model": "llama-alias", "messages": MSG, "max_tokens": 4, "ignore_eos": True},
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert r.content == compact(body)
    assert list(body) == CHAT_KEYS
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", body["id"])
    assert body["object"] == "chat.completion"
    assert body["model"] == "llama-8b"  # the first served name, whatever alias was asked
    assert re.fullmatch(r"vllm-0\.33\.0-[0-9a-f]{8}", body["system_fingerprint"])
    (choice,) = body["choices"]
    assert list(choice) == CHAT_CHOICE_KEYS
    assert list(choice["message"]) == MESSAGE_KEYS
    assert choice["finish_reason"] == "length"
    assert list(body["usage"]) == USAGE_KEYS
    u = body["usage"]
    assert u["prompt_tokens"] == _prompt_tokens(emu.url, MSG)
    assert u["completion_tokens"] == 4 == len(cl100k().encode(choice["message"]["content"]))
    assert u["total_tokens"] == u["prompt_tokens"] + 4


def test_completion_body_and_default_16(emu: Proc) -> None:
    r = post(emu.url, COMP, {"prompt": "The capital of France is", "ignore_eos": True})
    body = r.json()
    assert r.status_code == 200 and r.content == compact(body)
    assert list(body) == COMP_KEYS
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", body["id"])
    assert body["object"] == "text_completion"
    assert list(body["choices"][0]) == COMP_CHOICE_KEYS
    assert body["usage"]["completion_tokens"] == 16  # completions default max_tokens
    tok = post(emu.url, "/tokenize", {"prompt": "The capital of France is"}).json()
    assert body["usage"]["prompt_tokens"] == tok["count"]


def test_absent_max_tokens_means_rest_of_context(emu: Proc) -> None:
    p = _prompt_tokens(emu.url, MSG)
    body = post(emu.url, CHAT, {"messages": MSG, "ignore_eos": True}).json()
    assert body["usage"]["completion_tokens"] == L - p


def test_oversized_max_tokens_is_clamped_silently(emu: Proc) -> None:
    p = _prompt_tokens(emu.url, MSG)
    body = post(emu.url, CHAT, {"messages": MSG, "max_tokens": L, "ignore_eos": True}).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == L - p


def test_eos_model_stops_deterministically(emu: Proc) -> None:
    reasons, lengths = [], []
    for i in range(12):
        req = {"prompt": f"Question number {i}?", "max_tokens": 200}
        a = post(emu.url, COMP, req).json()
        b = post(emu.url, COMP, req).json()
        assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        reasons.append(a["choices"][0]["finish_reason"])
        n = a["usage"]["completion_tokens"]
        lengths.append(n)
        if reasons[-1] == "stop":  # the last token was EOS: it has no text
            assert len(cl100k().encode(a["choices"][0]["text"])) == n - 1
    assert "stop" in reasons
    assert len(set(lengths)) > 1


def test_n_and_prompt_lists_index_choices(emu: Proc) -> None:
    body = post(
        emu.url, CHAT, {"messages": MSG, "n": 3, "max_tokens": 2, "ignore_eos": True}
    ).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 6
    assert body["usage"]["prompt_tokens"] == _prompt_tokens(emu.url, MSG)
    body = post(emu.url, COMP, {"prompt": ["a b", "c d e"], "n": 2, "max_tokens": 1}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    one = post(emu.url, COMP, {"prompt": "a b", "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    two = post(emu.url, COMP, {"prompt": "c d e", "max_tokens": 1}).json()["usage"]["prompt_tokens"]
    assert body["usage"]["prompt_tokens"] == one + two


def test_prefix_cache_hits_are_counted(emu: Proc) -> None:
    lab = {"engine": "0", "model_name": "llama-8b"}
    system = {"role": "system", "content": "You are a careful assistant. " * 60}
    before = sample(metrics(emu.url), "vllm:prefix_cache_hits_total", **lab)
    post(
        emu.url, CHAT, {"messages": [system, {"role": "user", "content": "first"}], "max_tokens": 1}
    )
    mid = sample(metrics(emu.url), "vllm:prefix_cache_hits_total", **lab)
    post(
        emu.url,
        CHAT,
        {"messages": [system, {"role": "user", "content": "second"}], "max_tokens": 1},
    )
    after = sample(metrics(emu.url), "vllm:prefix_cache_hits_total", **lab)
    shared = _prompt_tokens(emu.url, [system])  # the system turn is a common prefix
    assert mid == before
    assert shared - 32 <= after - mid <= shared  # its full 16-token blocks, minus the boundary one


def test_x_request_id_names_the_response(emu: Proc) -> None:
    r = post(emu.url, CHAT, {"messages": MSG, "max_tokens": 1}, headers={"X-Request-Id": "abc-123"})
    assert r.json()["id"] == "chatcmpl-abc-123"
    assert "x-request-id" not in r.headers  # echoed only with --enable-request-id-headers


def test_openai_sdk_round_trip(emu: Proc) -> None:
    client = openai.OpenAI(base_url=emu.url + "/v1", api_key="none", max_retries=0)
    out = client.chat.completions.create(model="llama-8b", messages=MSG, max_tokens=3)  # type: ignore[arg-type]
    assert out.usage is not None and out.usage.completion_tokens <= 3
    text = ""
    usage = None
    for chunk in client.chat.completions.create(
        model="llama-8b",
        messages=MSG,  # type: ignore[arg-type]
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == 5
    assert len(cl100k().encode(text)) == 5
    models = client.models.list()
    assert [m.id for m in models.data] == ["llama-8b", "llama-alias"]


# -- streaming --------------------------------------------------------------------------------


def test_chat_stream_with_usage(emu: Proc) -> None:
    r, raw = stream_raw(emu.url, CHAT, {"messages": MSG, "max_tokens": 4, "ignore_eos": True,
                                        "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    ev = sse_events(raw)
    assert len({e["id"] for e in ev}) == 1 and len({e["created"] for e in ev}) == 1
    role, *content, finish, usage = ev
    head = ["id", "object", "created", "model", "choices"]
    assert list(role) == [*head, "prompt_token_ids", "prompt_text"]
    assert role["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                "logprobs": None, "finish_reason": None}]  # fmt: skip
    assert role["object"] == "chat.completion.chunk"
    for c in content:
        assert list(c) == [*head, "kv_transfer_params"]
        assert list(c["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        assert len(cl100k().encode(c["choices"][0]["delta"]["content"])) == 1
    assert len(content) == 3
    assert list(finish) == [*head, "kv_transfer_params"]  # fingerprint moves to the usage chunk
    assert list(finish["choices"][0]) == ["index", "delta", "logprobs", "finish_reason",
                                          "stop_reason", "token_ids", "weight_versions"]  # fmt: skip
    assert finish["choices"][0]["finish_reason"] == "length"
    assert list(usage) == [*head, "usage", "system_fingerprint"]
    assert usage["choices"] == []
    assert list(usage["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    assert usage["usage"]["completion_tokens"] == 4
    assert usage["usage"]["prompt_tokens"] == _prompt_tokens(emu.url, MSG)


def test_chat_stream_without_usage_puts_fingerprint_on_finish(emu: Proc) -> None:
    _, raw = stream_raw(
        emu.url, CHAT, {"messages": MSG, "max_tokens": 2, "stream": True, "ignore_eos": True}
    )
    ev = sse_events(raw)
    assert "usage" not in ev[-1]
    assert list(ev[-1])[-2:] == ["system_fingerprint", "kv_transfer_params"]
    assert ev[-1]["choices"][0]["finish_reason"] == "length"


def test_stream_stop_ends_with_empty_eos_delta(emu: Proc) -> None:
    for i in range(10):
        _, raw = stream_raw(emu.url, CHAT, {"messages": [{"role": "user", "content": f"q{i}"}],
                                            "max_tokens": 300, "stream": True})  # fmt: skip
        ev = sse_events(raw)
        if ev[-1]["choices"][0]["finish_reason"] == "stop":
            assert ev[-1]["choices"][0]["delta"] == {"content": ""}
            return
    pytest.fail("no request stopped on EOS with a mean output of 6 tokens")


def test_continuous_usage_stats(emu: Proc) -> None:
    _, raw = stream_raw(emu.url, CHAT, {"messages": MSG, "max_tokens": 3, "ignore_eos": True, "stream": True,
                                        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})  # fmt: skip
    ev = sse_events(raw)
    p = ev[0]["usage"]["prompt_tokens"]
    assert ev[0]["usage"] == {"prompt_tokens": p, "total_tokens": p, "completion_tokens": 0,
                              "completion_tokens_details": None}  # fmt: skip
    for k, e in enumerate(ev[1:-1], start=1):
        assert list(e)[5] == "usage"
        assert e["usage"]["completion_tokens"] == k
        assert e["usage"]["total_tokens"] == p + k
    assert ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 3


def test_completion_stream(emu: Proc) -> None:
    _, raw = stream_raw(
        emu.url, COMP, {"prompt": "Paris is", "max_tokens": 3, "ignore_eos": True, "stream": True}
    )
    ev = sse_events(raw)
    assert len(ev) == 3  # no role chunk, one chunk per token, no usage chunk
    keys = ["index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids",
            "token_ids", "weight_versions"]  # fmt: skip
    for e in ev:
        assert e["object"] == "text_completion"
        assert list(e["choices"][0]) == keys
    assert list(ev[0]) == ["id", "object", "created", "model", "choices", "kv_transfer_params"]
    assert list(ev[-1])[-2:] == ["system_fingerprint", "kv_transfer_params"]
    assert [e["choices"][0]["finish_reason"] for e in ev] == [None, None, "length"]
    _, raw = stream_raw(emu.url, COMP, {"prompt": "Paris is", "max_tokens": 2, "stream": True, "ignore_eos": True,
                                        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})  # fmt: skip
    ev = sse_events(raw)
    assert list(ev[0]["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]
    assert list(ev[-1]) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
    ]


# -- errors -----------------------------------------------------------------------------------


def _err(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert r.content == compact(body)
    assert list(body) == ["error"] and list(body["error"]) == ["message", "type", "param", "code"]
    assert body["error"]["code"] == status
    return dict(body["error"])


def test_context_errors_use_033_texts(emu: Proc) -> None:
    e = _err(post(emu.url, CHAT, {"messages": MSG, "max_tokens": L + 1}), 400)
    assert e["message"] == (
        f"max_tokens={L + 1} cannot be greater than max_model_len={L}. Please request fewer"
        f" output tokens. (parameter=max_tokens, value={L + 1})"
    )
    assert e["type"] == "BadRequestError" and e["param"] == "max_tokens"
    e = _err(post(emu.url, CHAT, {"messages": MSG, "max_completion_tokens": L + 5}), 400)
    assert e["message"].startswith(f"max_completion_tokens={L + 5} cannot be greater")
    assert e["param"] == "max_completion_tokens"
    long = [{"role": "user", "content": "word " * (L + 50)}]
    e = _err(post(emu.url, CHAT, {"messages": long}), 400)
    assert e["param"] == "input_tokens"
    assert e["message"].startswith(
        f"This model's maximum context length is {L} tokens. However, your prompt contains at least "
    )
    assert re.search(r"maximum context length|is too large|maximum model length", e["message"])
    ids = list(range(1000, 1000 + L + 3))
    e = _err(post(emu.url, COMP, {"prompt": ids}), 400)
    assert f"contains {L + 3} input tokens" in e["message"]


def test_unknown_model_404(emu: Proc) -> None:
    e = _err(post(emu.url, CHAT, {"model": "gpt-9", "messages": MSG}), 404)
    assert e == {"message": "The model `gpt-9` does not exist. Valid aliases: llama-8b, llama-alias.",
                 "type": "NotFoundError", "param": "model", "code": 404}  # fmt: skip


def test_validation_errors_are_400(emu: Proc) -> None:
    e = _err(post(emu.url, CHAT, {"messages": MSG, "stream_options": {"include_usage": True}}), 400)
    assert e["param"] == "stream_options"
    assert (
        e["message"]
        == "Stream options can only be defined when `stream=True`. (parameter=stream_options)"
    )
    e = _err(post(emu.url, CHAT, {"messages": MSG, "temperature": 3}), 400)
    assert (
        e["message"] == "temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)"
    )
    e = _err(post(emu.url, CHAT, {"model": "llama-8b"}), 400)
    assert e["type"] == "Bad Request" and e["param"] == "body.messages"
    assert e["message"] == ("1 validation error:\n  {'type': 'missing', 'loc': 'body.messages',"
                            " 'msg': 'Field required', 'input': '<dict of 1 items>'}")  # fmt: skip


def test_malformed_json_and_content_type(emu: Proc) -> None:
    raw = b'{"messages": [}'
    r = httpx.post(emu.url + CHAT, content=raw, headers={"Content-Type": "application/json"})
    e = _err(r, 400)
    assert e["param"] == f"body.{raw.index(b'}')}"
    assert "'type': 'json_invalid'" in e["message"] and "JSON decode error" in e["message"]
    r = httpx.post(
        emu.url + CHAT, content=b'{"messages": []}', headers={"Content-Type": "text/plain"}
    )
    e = _err(r, 400)
    assert (
        e["message"]
        == "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
    )
    assert e["param"] is None


def test_unknown_path_and_method(emu: Proc) -> None:
    r = httpx.get(emu.url + "/v1/nothing")
    assert r.status_code == 404 and r.content == b'{"detail":"Not Found"}'
    r = httpx.get(emu.url + CHAT)
    assert r.status_code == 405 and r.content == b'{"detail":"Method Not Allowed"}'


# -- other endpoints --------------------------------------------------------------------------


def test_models_health_version_tokenize(emu: Proc) -> None:
    a, b = httpx.get(emu.url + "/v1/models").json(), httpx.get(emu.url + "/v1/models").json()
    assert [m["id"] for m in a["data"]] == ["llama-8b", "llama-alias"]
    card = a["data"][0]
    assert list(card) == [
        "id",
        "object",
        "created",
        "owned_by",
        "root",
        "parent",
        "max_model_len",
        "permission",
    ]
    assert card["owned_by"] == "vllm" and card["max_model_len"] == L
    assert card["root"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert card["permission"][0]["id"] != b["data"][0]["permission"][0]["id"]
    h = httpx.get(emu.url + "/health")
    assert h.status_code == 200 and h.content == b""
    assert httpx.get(emu.url + "/version").content == b'{"version":"0.33.0"}'
    t = post(emu.url, "/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    assert list(t) == ["count", "max_model_len", "tokens", "token_strs"]
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] == L
    d = post(emu.url, "/detokenize", {"tokens": t["tokens"][1:]}).json()
    assert d == {"prompt": "Hello world"}


def test_metrics_names_and_types(emu: Proc) -> None:
    post(emu.url, CHAT, {"messages": MSG, "max_tokens": 2})
    r = httpx.get(emu.url + "/metrics")
    assert r.headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    fams = metrics(emu.url)
    want = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:iteration_tokens_total": "histogram",
        "vllm:cache_config_info": "gauge",
        "http_requests": "counter",
        "process_resident_memory_bytes": "gauge",
        "python_gc_objects_collected": "counter",
    }
    for name, kind in want.items():
        assert name in fams, name
        assert fams[name].type == kind, name
    names = {s.name for f in fams.values() for s in f.samples}
    assert (
        "vllm:prompt_tokens_created" in names
        and "vllm:time_to_first_token_seconds_created" in names
    )
    lab = {"engine": "0", "model_name": "llama-8b"}
    assert sample(fams, "vllm:request_success_total", finished_reason="stop", **lab) >= 0
    assert sample(fams, "vllm:num_requests_running", **lab) == 0
    assert sample(fams, "vllm:time_to_first_token_seconds_count", **lab) >= 1
    assert sample(fams, "http_requests_total", handler=CHAT, method="POST", status="2xx") >= 1
    assert sample(fams, "vllm:cache_config_info", block_size="16", engine="0") == 1
    text = r.text
    assert (
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama-8b"}'
        in text
    )
    assert "vllm:gpu_cache_usage_perc" not in text  # gone since 0.12


# -- fidelity: stop, logprobs, no empty answers (checks in tests/contract/emu_fidelity.py) ----


def test_stop_strings(emu: Proc) -> None:
    fid.check_stop_strings(emu.url, vllm=True)
    fid.check_stop_on_last_allowed_token(emu.url, vllm=True)


def test_stop_token_ids(emu: Proc) -> None:
    fid.check_stop_token_ids(emu.url, vllm=True)


def test_stream_never_shows_the_stop_string(emu: Proc) -> None:
    fid.check_stream_hides_stop_string(emu.url, vllm=True)


def test_chat_logprobs(emu: Proc) -> None:
    fid.check_chat_logprobs(emu.url, vllm=True)


def test_completion_logprobs(emu: Proc) -> None:
    fid.check_completion_logprobs(emu.url, vllm=True)


def test_no_empty_answers(emu: Proc) -> None:
    fid.check_eos_never_first(emu.url, CHAT, "llama-8b")


def test_stop_and_logprobs_validation_errors(emu: Proc) -> None:
    e = _err(post(emu.url, CHAT, {"messages": MSG, "top_logprobs": 2}), 400)
    assert e == {
        "message": "when using `top_logprobs`, `logprobs` must be set to true."
        " (parameter=top_logprobs)",
        "type": "BadRequestError",
        "param": "top_logprobs",
        "code": 400,
    }
    e = _err(post(emu.url, CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 30}), 400)
    assert e["message"] == (
        "Requested sample logprobs of 30, which is greater than max allowed: 20"
        " (parameter=logprobs, value=30)"
    )
    assert e["param"] == "logprobs" and e["type"] == "BadRequestError"
    e = _err(post(emu.url, COMP, {"prompt": "x", "logprobs": 21}), 400)
    assert e["message"].startswith("Requested sample logprobs of 21, which is greater")
    assert post(emu.url, CHAT, {"messages": MSG, "max_tokens": 1, "logprobs": True,
                                "top_logprobs": 20}).status_code == 200  # fmt: skip
    e = _err(post(emu.url, CHAT, {"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}), 400)
    assert e["type"] == "Bad Request" and e["param"] == "body.stop.str"
    assert e["message"].startswith("2 validation errors:\n")
    assert (
        "{'type': 'too_long', 'loc': 'body.stop.list[str]', 'msg': 'List should have at most"
        " 4 items after validation, not 5', 'input': '<list of 5 items>', 'ctx':"
        " {'field_type': 'List', 'max_length': 4, 'actual_length': 5}}" in e["message"]
    )
    e = _err(post(emu.url, CHAT, {"messages": MSG, "stop": ["a", ""]}), 400)
    assert e["message"] == "stop cannot contain an empty string." and e["param"] is None


# -- tool calls (vLLM 0.33 chat_completion/serving.py; WIRE_SPEC §3–§4) ---------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "hourly": {"type": "boolean"},
                "at": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 1},
            },
            "required": ["city", "unit"],
            "$defs": {
                "point": {
                    "type": "object",
                    "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90}},
                    "required": ["lat"],
                }
            },
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
         "properties": {"tz": {"type": "string"}}}}}  # fmt: skip
NAMED = {"type": "function", "function": {"name": "get_weather"}}
TOOL_MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOL_KEYS = ["role", "content", "refusal", "annotations", "audio", "function_call", "tool_calls",
             "reasoning"]  # fmt: skip


def _valid_arguments(name: str, arguments: str) -> dict[str, Any]:
    """The arguments parse as JSON and conform to the function's schema (jsonschema, an
    implementation independent of the emulator's generator)."""
    import json

    import jsonschema

    tool = {"get_weather": WEATHER, "get_time": CLOCK}[name]
    args = json.loads(arguments)
    jsonschema.validate(args, tool["function"]["parameters"])  # type: ignore[index]
    return args


def _tool_body(choice: Any, stream: bool = False, **kw: Any) -> dict[str, Any]:
    return {"model": "llama-8b", "messages": TOOL_MSG, "tools": [CLOCK, WEATHER],
            "tool_choice": choice, "max_tokens": 64, "stream": stream} | kw  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "name", "finish"),
    [
        (NAMED, "get_weather", "stop"),
        ("required", "get_time", "tool_calls"),
        ("auto", "get_weather", "tool_calls"),
    ],
    ids=["named", "required", "auto"],
)
def test_tool_choice_answers_a_tool_call(emu: Proc, choice: Any, name: str, finish: str) -> None:
    """Was: a text answer whatever `tool_choice` said. vLLM: a named call finishes "stop"
    (as OpenAI), a required or auto one "tool_calls"; auto calls the first tool named in
    the last user message (the emulator's documented rule)."""
    asks = [{"role": "user", "content": "Please use get_weather for Paris."}]
    r = post(emu.url, CHAT, _tool_body(choice, messages=asks))
    assert r.status_code == 200, r.text
    body = r.json()
    assert r.content == compact(body)
    (c,) = body["choices"]
    assert list(c) == CHAT_CHOICE_KEYS
    assert list(c["message"]) == TOOL_KEYS
    assert c["message"]["content"] == ""
    (call,) = c["message"]["tool_calls"]
    assert list(call) == ["id", "type", "function"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", call["id"])
    assert call["type"] == "function" and call["function"]["name"] == name
    _valid_arguments(name, call["function"]["arguments"])
    assert c["finish_reason"] == finish


def test_no_tool_call_for_none_or_no_match(emu: Proc) -> None:
    for choice, messages in (("none", TOOL_MSG), ("auto", [{"role": "user", "content": "hi"}])):
        r = post(emu.url, CHAT, {**_tool_body(choice), "messages": messages})
        (c,) = r.json()["choices"]
        assert list(c["message"]) == MESSAGE_KEYS and c["message"]["content"]
    r = post(emu.url, CHAT, _tool_body({"type": "function", "function": {"name": "nope"}}))
    assert r.status_code == 400 and "nope" in r.json()["error"]["message"]


@pytest.mark.parametrize(("choice", "finish"), [(NAMED, "stop"), ("required", "tool_calls")],
                         ids=["named", "required"])  # fmt: skip
def test_tool_call_stream_chunks(emu: Proc, choice: Any, finish: str) -> None:
    """The role chunk; then a DeltaToolCall with id, type, index and the function's name
    (and its first arguments); then index + arguments deltas; the finish chunk."""
    r, raw = stream_raw(emu.url, CHAT, _tool_body(choice, True))
    assert r.status_code == 200
    events = sse_events(raw)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"] for e in events[1:] if e.get("choices")]
    opening = deltas[0]["tool_calls"][0]
    assert list(opening) == ["id", "type", "index", "function"]
    assert re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", opening["id"])
    assert opening["type"] == "function" and opening["index"] == 0
    assert list(opening["function"]) == ["name", "arguments"]
    name = opening["function"]["name"]
    for d in deltas[1:]:
        assert list(d) == ["tool_calls"]
        (part,) = d["tool_calls"]
        assert part.keys() == {"index", "function"} and list(part["function"]) == ["arguments"]
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas)
    _valid_arguments(name, arguments)
    last = [e for e in events if e.get("choices")][-1]["choices"][0]
    assert last["finish_reason"] == finish
    assert raw.endswith(b"data: [DONE]\n\n")


def test_tool_calls_through_the_openai_sdk(emu: Proc) -> None:
    c = openai.OpenAI(base_url=emu.url + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(model="llama-8b", messages=TOOL_MSG,  # type: ignore[arg-type]
                                  tools=[WEATHER], tool_choice=NAMED, max_tokens=64)  # type: ignore[list-item]  # fmt: skip
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    _valid_arguments("get_weather", call.function.arguments)
    # streamed: the SDK's chunks put together give one call with valid arguments
    ids, names, parts = set(), set(), []
    with c.chat.completions.create(model="llama-8b", messages=TOOL_MSG, tools=[WEATHER],  # type: ignore[arg-type,list-item]
                                   tool_choice="required", max_tokens=64, stream=True) as s:  # fmt: skip
        finish = None
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
