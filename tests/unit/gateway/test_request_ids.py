"""gateway/request_ids.py: the engine's id is the gateway's, unique and unguessable; the
client's is kept only when it is safe in a header and a log line."""

from __future__ import annotations

import os

import orjson

from gateway import request_ids
from gateway.openai_request import CHAT, parse


def test_ids_are_distinct_128_bit_hex() -> None:
    ids = [request_ids.new() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids[:1000])
    # consecutive ids share no prefix a counter would give away
    assert len({i[:8] for i in ids[:1000]}) > 990


def test_a_forked_child_makes_other_ids() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(r)
        os.write(w, ",".join(request_ids.new() for _ in range(100)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        child = set(f.read().decode().split(","))
    os.waitpid(pid, 0)
    assert len(child) == 100
    assert not child & {request_ids.new() for _ in range(100)}


def test_client_id_is_kept_only_when_printable_ascii_up_to_128_bytes() -> None:
    assert request_ids.client_id(b"req-123") == "req-123"
    assert request_ids.client_id(b"x" * 128) == "x" * 128
    for bad in (None, b"", b"x" * 129, b"a\r\nb", b"caf\xc3\xa9", b"tab\there"):
        assert request_ids.client_id(bad) is None


def test_scrub_removes_a_body_request_id_and_nothing_else() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    raw = orjson.dumps(body)
    parsed = parse(raw, CHAT)
    assert request_ids.scrub(parsed, raw) is raw  # nothing to remove: forwarded as sent
    raw = orjson.dumps({**body, "rid": "x", "request_id": "y"})
    parsed = parse(raw, CHAT)
    out = request_ids.scrub(parsed, raw)
    assert orjson.loads(out) == body
    assert "rid" not in parsed.body and "request_id" not in parsed.body
