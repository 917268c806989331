"""Checks shared by both personalities' contract tests: stop, logprobs, no empty answers.

The emulated model recites a fixed passage (emulator/sampling.py), so its first tokens
are known: " Continuous", " batching", " keeps", " the", " accelerator", … — which is
what lets these checks name stop strings and stop tokens that the answer will contain.
"""

from __future__ import annotations

import math
from typing import Any

import openai

from compressor.tokenizer import cl100k
from tests.contract.emu_wire import post, sse_events, stream_raw

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
OPENING = " Continuous batching keeps the accelerator busy"


def _text(body: dict[str, Any], chat: bool) -> str:
    c = body["choices"][0]
    return str(c["message"]["content"] if chat else c["text"])


def _reason_key(vllm: bool) -> str:
    return "stop_reason" if vllm else "matched_stop"


def _streamed(url: str, path: str, body: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]]]:
    _, raw = stream_raw(url, path, {**body, "stream": True})
    ev = [e for e in sse_events(raw) if e["choices"]]
    chat = path == CHAT
    pieces = [
        (e["choices"][0]["delta"].get("content") or "") if chat else e["choices"][0]["text"]
        for e in ev
    ]
    return pieces, ev


def check_stop_strings(url: str, vllm: bool) -> None:
    key = _reason_key(vllm)
    for path, chat in ((CHAT, True), (COMP, False)):
        base: dict[str, Any] = {"max_tokens": 50, "ignore_eos": True}
        base |= {"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"}
        # one stop string, as a str and in a list; its token is generated and counted
        for stop in ("keeps", ["zzz", "keeps"]):
            body = post(url, path, {**base, "stop": stop}).json()
            c = body["choices"][0]
            assert _text(body, chat) == " Continuous batching "
            assert c["finish_reason"] == "stop" and c[key] == "keeps"
            assert body["usage"]["completion_tokens"] == 3
        # several match in the same token " batching": vLLM takes the one that completes
        # first (ties: list order), SGLang the first of the list, cut where it occurs
        body = post(url, path, {**base, "stop": ["ching", "batch"]}).json()
        c = body["choices"][0]
        won, text = ("batch", " Continuous ") if vllm else ("ching", " Continuous bat")
        assert c[key] == won and c["finish_reason"] == "stop" and _text(body, chat) == text
        # a stop string at the very start: an empty answer, because it was asked for
        body = post(url, path, {**base, "stop": [" Contin"]}).json()
        assert _text(body, chat) == "" and body["usage"]["completion_tokens"] == 1
        # no match: unchanged
        body = post(url, path, {**base, "max_tokens": 4, "stop": "zzz"}).json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["choices"][0][key] is None
        assert body["usage"]["completion_tokens"] == 4


def check_stop_on_last_allowed_token(url: str, vllm: bool) -> None:
    """vLLM: a stop string in the max_tokens-th token is a "stop"; SGLang checks the length
    first, so it is a "length" and nothing is trimmed."""
    body = post(url, COMP, {"prompt": "hi", "max_tokens": 3, "stop": "keeps"}).json()
    c = body["choices"][0]
    if vllm:
        assert (c["finish_reason"], c["stop_reason"], c["text"]) == (
            "stop",
            "keeps",
            " Continuous batching ",
        )
    else:
        assert (c["finish_reason"], c["matched_stop"]) == ("length", None)
        assert c["text"] == " Continuous batching keeps"
    assert body["usage"]["completion_tokens"] == 3


def check_stop_token_ids(url: str, vllm: bool) -> None:
    batching = cl100k().encode(" batching")[0]
    body = post(url, COMP, {"prompt": "hi", "max_tokens": 20, "ignore_eos": False,
                            "stop_token_ids": [batching]}).json()  # fmt: skip
    c = body["choices"][0]
    assert c["text"] == " Continuous"  # the stop token's text is not shown
    assert c["finish_reason"] == "stop" and c[_reason_key(vllm)] == batching
    assert body["usage"]["completion_tokens"] == 2
    # min_tokens masks stop tokens (and stop strings, on vLLM) for its first positions
    body = post(url, COMP, {"prompt": "hi", "max_tokens": 20, "min_tokens": 2,
                            "stop_token_ids": [batching], "ignore_eos": True}).json()  # fmt: skip
    if vllm:
        assert body["usage"]["completion_tokens"] == 20  # " batching" recurs no sooner
    else:
        assert body["choices"][0]["finish_reason"] == "length"  # ignore_eos drops stop ids


def check_stream_hides_stop_string(url: str, vllm: bool) -> None:
    key = _reason_key(vllm)
    for path in (CHAT, COMP):
        body: dict[str, Any] = {"max_tokens": 50, "ignore_eos": True}
        body |= (
            {"messages": [{"role": "user", "content": "hi"}]} if path == CHAT else {"prompt": "hi"}
        )
        # a stop string inside one token: stream and body agree, the stop string never shows
        full = _text(post(url, path, {**body, "stop": "keeps"}).json(), path == CHAT)
        pieces, ev = _streamed(url, path, {**body, "stop": "keeps"})
        assert "".join(pieces) == full == " Continuous batching "
        assert ev[-1]["choices"][0]["finish_reason"] == "stop"
        assert ev[-1]["choices"][0][key] == "keeps"
        # a stop string over two tokens (" the", " accelerator")
        stop = "the accelerator"
        full = _text(post(url, path, {**body, "stop": stop}).json(), path == CHAT)
        assert full == " Continuous batching keeps "
        pieces, ev = _streamed(url, path, {**body, "stop": stop})
        joined = "".join(pieces)
        assert stop not in joined and all(stop not in p for p in pieces)
        if vllm:  # holds back len(stop) - 1 characters: never shows a partial match
            assert joined == full
            # " Continuous" (11 characters) is all held back (14), its chunk still sent
            assert pieces[1 if path == CHAT else 0] == ""
        else:  # SGLang streams " the" before the match trims it from the finished text
            assert joined == full + "the"
        assert ev[-1]["choices"][0][key] == stop


def _check_top(entries: list[tuple[str, float]], chosen: tuple[str, float], n: int) -> None:
    assert len(entries) == n
    lps = [lp for _, lp in entries]
    assert all(math.isfinite(lp) and lp <= 0 for lp in lps)
    assert lps == sorted(lps, reverse=True)
    assert len({t for t, _ in entries}) == n
    if n:
        assert entries[0] == chosen  # the model says its most likely token
    assert sum(math.exp(lp) for lp in lps) <= 1.0 + 1e-9


def check_chat_logprobs(url: str, vllm: bool) -> None:
    msg = [{"role": "user", "content": "logprobs please"}]
    req = {"messages": msg, "max_tokens": 5, "ignore_eos": True, "logprobs": True,
           "top_logprobs": 3, "seed": 7}  # fmt: skip
    a = post(url, CHAT, req).json()
    b = post(url, CHAT, req).json()
    lp = a["choices"][0]["logprobs"]
    assert lp == b["choices"][0]["logprobs"]  # deterministic for a seed
    assert list(lp) == ["content"] and len(lp["content"]) == 5
    order = ["token", "logprob", "bytes"] if vllm else ["token", "bytes", "logprob"]
    for t in lp["content"]:
        assert list(t) == [*order, "top_logprobs"]
        assert t["bytes"] == list(t["token"].encode())
        for e in t["top_logprobs"]:
            assert list(e) == order and e["bytes"] == list(e["token"].encode())
        _check_top([(e["token"], e["logprob"]) for e in t["top_logprobs"]],
                   (t["token"], t["logprob"]), 3)  # fmt: skip
    assert "".join(t["token"] for t in lp["content"]) == a["choices"][0]["message"]["content"]
    other = post(url, CHAT, {**req, "seed": 8}).json()["choices"][0]["logprobs"]
    assert other != lp  # the seed matters
    # top_logprobs 0 (vLLM's default): the tokens alone; no logprobs: null
    zero = post(url, CHAT, {**req, "top_logprobs": 0}).json()["choices"][0]["logprobs"]
    assert all(t["top_logprobs"] == [] for t in zero["content"])
    assert (
        post(url, CHAT, {**req, "logprobs": False, "top_logprobs": None}).json()["choices"][0][
            "logprobs"
        ]
        is None
    )
    # streamed: each content chunk carries its own token's logprobs, equal to the body's
    _, ev = _streamed(url, CHAT, req)
    streamed = [
        t for e in ev if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == lp["content"]
    # and through the openai SDK
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    out = client.chat.completions.create(model="default" if not vllm else "llama-8b",
                                         messages=msg, max_tokens=2, logprobs=True, top_logprobs=2,  # type: ignore[arg-type]
                                         seed=7, extra_body={"ignore_eos": True})  # fmt: skip
    assert out.choices[0].logprobs is not None and out.choices[0].logprobs.content is not None
    assert len(out.choices[0].logprobs.content[0].top_logprobs) == 2


def check_completion_logprobs(url: str, vllm: bool) -> None:
    req = {"prompt": "The capital", "max_tokens": 4, "ignore_eos": True, "logprobs": 2}
    body = post(url, COMP, req).json()
    lp = body["choices"][0]["logprobs"]
    assert list(lp) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    assert len(lp["tokens"]) == 4 and "".join(lp["tokens"]) == body["choices"][0]["text"]
    if vllm:
        offs = [0]
        for t in lp["tokens"][:-1]:
            offs.append(offs[-1] + len(t))
        assert lp["text_offset"] == offs
    else:
        assert lp["text_offset"] == [-1, -1, -1, -1]  # SGLang: not supported
    for tok, chosen, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        _check_top(list(top.items()), (tok, chosen), 2)
    zero = post(url, COMP, {**req, "logprobs": 0}).json()["choices"][0]["logprobs"]
    # vLLM adds the sampled token to the top N (deduplicated); SGLang gives the top N
    assert all(len(t) == (1 if vllm else 0) for t in zero["top_logprobs"])
    _, ev = _streamed(url, COMP, req)
    assert [t for e in ev for t in e["choices"][0]["logprobs"]["tokens"]] == lp["tokens"]
    if vllm:
        assert [o for e in ev for o in e["choices"][0]["logprobs"]["text_offset"]] == lp[
            "text_offset"
        ]


def check_eos_never_first(url: str, path: str, model: str) -> None:
    """No prompt gets an empty answer: 200 distinct prompts, streamed via the openai SDK."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    for i in range(200):
        text = ""
        for chunk in client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"prompt number {i}: say something"}],
            max_tokens=50,
            stream=True,
        ):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        assert text, f"prompt {i} got an empty answer"
    # max_tokens=1 still gives one real token (the only way to "length" at once)
    body = post(url, path, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(cl100k().encode(body["choices"][0]["message"]["content"])) == 1
    # min_tokens: EOS only after min_tokens tokens of text
    for i in range(20):
        body = post(url, path, {"messages": [{"role": "user", "content": f"m{i}"}], "max_tokens": 100,
                                "min_tokens": 5}).json()  # fmt: skip
        c = body["choices"][0]
        assert len(cl100k().encode(c["message"]["content"])) >= 5
        if c["finish_reason"] == "stop":
            assert body["usage"]["completion_tokens"] >= 6
