"""The emulator's P/D roles (emulator/pd.py) speaking vLLM's and SGLang's protocols as
their routers send them (docs/WIRE_SPEC.md §9): the exact requests of vLLM's proxy and of
SGLang's PD router, a decode refusing parameters no prefill issued, a decode whose prefill
never came, a client gone while its decode waits — and nothing left running after."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.contract.emu_wire import CLIENT, metrics, sample, sse_events, wait_for
from tests.procs import Proc, procs

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
# 1,200 characters of prompt: 18 blocks of 16 tokens and some
PROMPT = " ".join(f"word{i}" for i in range(300))
BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": PROMPT}],
    "max_tokens": 20,
    "ignore_eos": True,
}
COMMON = ("--model", "m", "--time-scale", "0.01")


@pytest.fixture(scope="module")
def pd() -> Iterator[dict[str, Proc]]:
    with procs() as ps:
        started = {
            "vp": ps.emulator("vp", *COMMON, "--role", "prefill"),
            "vd": ps.emulator("vd", *COMMON, "--role", "decode"),
            "sp": ps.emulator("sp", *COMMON, "--personality", "sglang", "--role", "prefill"),
            "sd": ps.emulator(
                "sd",
                *COMMON,
                "--personality",
                "sglang",
                "--role",
                "decode",
                "--pd-waiting-timeout-s",
                "50",  # 0.5 s wall at this time scale
            ),
        }
        for p in started.values():
            p.wait_ready("/health")
        yield started


def _idle(url: str, personality: str) -> bool:
    fam = metrics(url)
    if personality == "vllm":
        return (
            sample(fam, "vllm:num_requests_running") + sample(fam, "vllm:num_requests_waiting") == 0
        )
    return sample(fam, "sglang:num_running_reqs") + sample(fam, "sglang:num_queue_reqs") == 0


# -- vLLM: prefill, then decode with the prefill's kv_transfer_params --------------------


def _vllm_prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's proxy (toy_proxy_server.py) sends to the prefill."""
    out = dict(body)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    out["stream"] = False
    out["max_tokens"] = 1
    out.pop("stream_options", None)
    return out


def test_vllm_prefill_answers_with_transfer_params_the_decode_reads_once(pd: dict[str, Proc]):
    vp, vd = pd["vp"], pd["vd"]
    r = CLIENT.post(vp.url + CHAT, json=_vllm_prefill_body(BODY), headers={"X-Request-Id": "x1"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["usage"]["completion_tokens"] == 1
    params = answer["kv_transfer_params"]
    assert set(params) == {
        "do_remote_prefill",
        "do_remote_decode",
        "remote_block_ids",
        "remote_engine_id",
        "remote_request_id",
        "remote_host",
        "remote_port",
        "tp_size",
    }
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", vp.port)
    blocks = -(-answer["usage"]["prompt_tokens"] // 16)
    assert params["remote_block_ids"] == [list(range(1, blocks + 1))]

    decode = {**BODY, "kv_transfer_params": params}
    r = CLIENT.post(vd.url + CHAT, json=decode)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 20
    assert r.json()["choices"][0]["message"]["content"]
    # the same parameters again: the prefill handed its KV out already
    again = CLIENT.post(vd.url + CHAT, json=decode)
    assert again.status_code == 500
    assert again.json() == {
        "error": {
            "message": "Internal server error",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }


def test_vllm_decode_refuses_parameters_no_prefill_issued(pd: dict[str, Proc]):
    vp, vd = pd["vp"], pd["vd"]
    forged = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [[1, 2, 3]],
        "remote_engine_id": "not-the-prefills-engine",
        "remote_request_id": "cmpl-0000-0",
        "remote_host": "127.0.0.1",
        "remote_port": vp.port,
        "tp_size": 1,
    }
    r = CLIENT.post(vd.url + CHAT, json={**BODY, "kv_transfer_params": forged})
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
    # streamed: the 200 is out before the KV load fails; one error event, then [DONE]
    r = CLIENT.post(vd.url + CHAT, json={**BODY, "stream": True, "kv_transfer_params": forged})
    assert r.status_code == 200
    events = sse_events(r.content)  # (it checks the closing [DONE])
    assert len(events) == 1 and events[0]["error"]["code"] == 500
    assert wait_for(lambda: _idle(vd.url, "vllm"))


def test_vllm_decode_without_all_remote_fields_recomputes_the_prompt(pd: dict[str, Proc]):
    params = {"do_remote_prefill": True, "remote_block_ids": [[1]], "remote_host": "127.0.0.1"}
    r = CLIENT.post(pd["vd"].url + CHAT, json={**BODY, "kv_transfer_params": params})
    assert r.status_code == 200  # logged "Got invalid KVTransferParams", served locally


def test_vllm_prefill_without_params_is_an_ordinary_request(pd: dict[str, Proc]):
    r = CLIENT.post(pd["vp"].url + CHAT, json=BODY)
    assert r.status_code == 200 and r.json()["kv_transfer_params"] is None


def test_vllm_streamed_decode_after_a_prefill(pd: dict[str, Proc]):
    vp, vd = pd["vp"], pd["vd"]
    params = CLIENT.post(vp.url + CHAT, json=_vllm_prefill_body(BODY)).json()["kv_transfer_params"]
    body = {**BODY, "stream": True, "kv_transfer_params": params}
    r = CLIENT.post(vd.url + CHAT, json=body)
    assert r.status_code == 200
    events = sse_events(r.content)
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")
    )
    assert text


# -- SGLang: the same body to both, with a bootstrap room --------------------------------


def _sglang_body(prefill: Proc, body: dict[str, Any], room: int) -> dict[str, Any]:
    """What SGLang's PD router (smg's inject_bootstrap_into_value) sends to both servers."""
    return {
        **body,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": prefill.port,
        "bootstrap_room": room,
    }


async def _both(
    prefill: Proc, decode: Proc, body: dict[str, Any]
) -> tuple[httpx.Response, httpx.Response]:
    async with httpx.AsyncClient(timeout=30.0) as c:
        p, d = await asyncio.gather(
            c.post(prefill.url + CHAT, json=body), c.post(decode.url + CHAT, json=body)
        )
    return p, d


@pytest.mark.parametrize("stream", [False, True])
def test_sglang_prefill_and_decode_at_once_share_a_room(pd: dict[str, Proc], stream: bool):
    sp, sd = pd["sp"], pd["sd"]
    body = _sglang_body(sp, {**BODY, "stream": stream}, random.randrange(2**63))
    p, d = asyncio.run(_both(sp, sd, body))
    assert p.status_code == 200 and d.status_code == 200, (p.text, d.text)
    if stream:
        events = sse_events(d.content)
        text = "".join(
            e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")
        )
        assert text
    else:
        assert p.json()["usage"]["completion_tokens"] == 1  # the prefill's one token
        assert d.json()["usage"]["completion_tokens"] == 20
    assert wait_for(lambda: _idle(sd.url, "sglang") and _idle(sp.url, "sglang"))


def test_sglang_decode_whose_prefill_never_comes_fails_after_its_waiting_timeout(
    pd: dict[str, Proc],
):
    sp, sd = pd["sp"], pd["sd"]
    r = CLIENT.post(sd.url + CHAT, json=_sglang_body(sp, BODY, random.randrange(2**63)))
    assert r.status_code == 500
    assert r.json()["object"] == "error" and "KV transfer failed" in r.json()["message"]


def test_sglang_prefill_needs_a_room(pd: dict[str, Proc]):
    r = CLIENT.post(pd["sp"].url + CHAT, json=BODY)
    assert r.status_code == 400 and "bootstrap_room" in r.json()["message"]


def test_sglang_a_room_is_read_once(pd: dict[str, Proc]):
    sp, sd = pd["sp"], pd["sd"]
    body = _sglang_body(sp, BODY, random.randrange(2**63))
    p, d = asyncio.run(_both(sp, sd, body))
    assert p.status_code == d.status_code == 200
    again = CLIENT.post(sd.url + CHAT, json=body)  # a second decode for the same room
    assert again.status_code == 500


def test_sglang_client_gone_while_its_decode_waits_leaves_nothing_running(pd: dict[str, Proc]):
    sp, sd = pd["sp"], pd["sd"]
    body = _sglang_body(sp, BODY, random.randrange(2**63))
    with pytest.raises(httpx.TimeoutException):
        CLIENT.post(sd.url + CHAT, json=body, timeout=0.1)  # no prefill: it waits, we leave
    assert wait_for(lambda: _idle(sd.url, "sglang"))
    # the prefill comes later: it runs, publishes the room, and nobody reads it
    r = CLIENT.post(sp.url + CHAT, json=body)
    assert r.status_code == 200
    assert wait_for(lambda: _idle(sp.url, "sglang"))
