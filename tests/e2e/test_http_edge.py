"""The client side of the HTTP edge, from raw sockets against a real gateway process.

Each case is one of the HTTP audit's findings against the hand-written server the gateway
had before uvicorn (issue "The HTTP edge on uvicorn and FastAPI"): what it did then is in
the test's docstring. Bounds are generous: they hold on a loaded 2-core machine.
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from tests.e2e.fleet import MODEL, emulator, gateway_config, start_gateway
from tests.e2e.rawhttp import Conn, chunked, request
from tests.procs import procs

pytestmark = pytest.mark.e2e

KEY = "edge-key"
ADMIN = "edge-admin"
AUTH = {"authorization": f"Bearer {KEY}"}
MAX_BODY = 256 * 1024
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def gw():
    with procs() as ps:
        emu = emulator(ps, "edge-emu", 8192).wait_ready()
        cfg = gateway_config(
            [emu.url],
            [],
            auth={"api_keys": [KEY], "admin_key": ADMIN},
            limits={"max_body_bytes": MAX_BODY, "head_timeout_s": 1.0, "body_timeout_s": 1.0},
        )
        yield start_gateway(ps, cfg)


def json_post(path: str, obj: object, headers: dict[str, str] | None = None) -> bytes:
    h = {"content-type": "application/json", **AUTH, **(headers or {})}
    return request("POST", path, orjson.dumps(obj), h)


def assert_openai_error(answer, status: int) -> dict:
    assert answer.status == status, (answer.status, answer.body[:300])
    assert answer.headers["content-type"].startswith("application/json")
    err = orjson.loads(answer.body)["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    return err


def test_60000_one_byte_chunks_do_not_freeze_the_loop(gw):
    """Was: the event loop frozen for 40 s (the body re-summed on every chunk)."""
    body = orjson.dumps(CHAT)
    body = body[:-1] + b" " * (60_000 - len(body)) + b"}"
    wire = request(
        "POST",
        "/v1/chat/completions",
        chunked([body[i : i + 1] for i in range(len(body))]),
        {"content-type": "application/json", "transfer-encoding": "chunked", **AUTH},
        length=False,
    )
    with Conn(gw.port, timeout=30) as c:
        c.send(wire)
        # the loop is still serving others while it takes the body in
        t = time.monotonic()
        assert httpx.get(gw.url + "/healthz", timeout=30).status_code == 200
        assert time.monotonic() - t < 5
        answer = c.read("POST")
    assert answer.status == 200, answer.body[:300]
    assert orjson.loads(answer.body)["usage"]["completion_tokens"] >= 1


def test_no_key_is_refused_before_the_body_is_read(gw):
    """A client with no key gets its 401 at once, however long its body would be."""
    head = request(
        "POST",
        "/v1/chat/completions",
        headers={"content-type": "application/json", "transfer-encoding": "chunked"},
        length=False,
    )
    with Conn(gw.port) as c:
        c.send(head + b"1\r\n{\r\n")  # the body has barely begun
        err = assert_openai_error(c.read("POST"), 401)
    assert err["type"] == "authentication_error"


def test_head_over_the_limit_is_431(gw):
    """Was: 400 'User callback error'."""
    with Conn(gw.port) as c:
        c.send(request("GET", "/healthz", headers={"x-big": "a" * (70 * 1024)}))
        assert_openai_error(c.read(), 431)
        assert c.closed_by_peer()


def test_endless_header_lines_are_cut(gw):
    """Header lines forever: answered 431 and closed after ~64 KiB, not buffered."""
    sent = 0
    with Conn(gw.port) as c:
        c.send(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        try:
            while sent < 8 * 1024 * 1024:
                c.send(b"x-h: " + b"v" * 1000 + b"\r\n")
                sent += 1006
        except (BrokenPipeError, ConnectionResetError):
            pass
    assert sent < 4 * 1024 * 1024, f"the gateway kept reading {sent} bytes of headers"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_body_over_the_limit_is_413(gw, framing):
    """Was: 400 'User callback error' (chunked) or a read of the whole body."""
    big = b"x" * (MAX_BODY + 1)
    if framing == "chunked":
        wire = request(
            "POST",
            "/v1/chat/completions",
            chunked([big[i : i + 65536] for i in range(0, len(big), 65536)]),
            {"transfer-encoding": "chunked", **AUTH},
            length=False,
        )
    else:
        wire = request("POST", "/v1/chat/completions", big, AUTH)
    with Conn(gw.port) as c:
        try:
            c.send(wire)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the gateway answered and closed before reading it all
        err = assert_openai_error(c.read("POST"), 413)
    assert err["code"] == "body_too_large"


def test_head_has_no_body_and_the_connection_goes_on(gw):
    """Was: a body after the HEAD answer; the next keep-alive request failed."""
    with Conn(gw.port) as c:
        c.send(request("HEAD", "/healthz") + request("GET", "/healthz"))
        head = c.read("HEAD")
        get = c.read()
    assert head.status == 200 and head.body == b""
    assert get.status == 200 and orjson.loads(get.body) == {"status": "ok"}


def test_h2c_upgrade_is_answered_over_http11(gw):
    """Was: an empty reply to `curl --http2`."""
    headers = {
        "connection": "Upgrade, HTTP2-Settings",
        "upgrade": "h2c",
        "http2-settings": "AAMAAABkAARAAAAAAAIAAAAA",
    }
    with Conn(gw.port) as c:
        c.send(request("GET", "/healthz", headers=headers))
        answer = c.read()
    assert answer.status == 200 and answer.version == 11


def test_half_closed_client_still_gets_its_answer(gw):
    """Was: no answer, and the engine request aborted."""
    with Conn(gw.port) as c:
        c.send(json_post("/v1/chat/completions", CHAT))
        c.sock.shutdown(1)  # SHUT_WR: the client is done sending, still reading
        answer = c.read("POST")
    assert answer.status == 200
    assert orjson.loads(answer.body)["choices"][0]["message"]["content"]


def test_pipelined_expect_100_continue_does_not_corrupt_a_stream(gw):
    """Was: `100 Continue` written into the middle of the previous chunked body."""
    stream = json_post("/v1/chat/completions", {**CHAT, "stream": True, "max_tokens": 8})
    second = json_post("/v1/chat/completions", CHAT, {"expect": "100-continue"})
    with Conn(gw.port) as c:
        c.send(stream + second)
        first = c.read("POST")
        then = c.read("POST")
    assert first.status == 200
    events = [e for e in first.body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    for e in events[:-1]:
        assert e.startswith(b"data: {") and orjson.loads(e[6:])
    assert then.status == 200 and orjson.loads(then.body)["usage"]


def test_slow_request_head_is_408(gw):
    """A head dribbled in (slowloris) is cut after limits.head_timeout_s."""
    with Conn(gw.port) as c:
        c.send(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        t = time.monotonic()
        err = assert_openai_error(c.read(), 408)
        assert time.monotonic() - t < 10
    assert "head" in err["message"]


def test_slow_request_body_is_408(gw):
    head = request(
        "POST",
        "/v1/chat/completions",
        headers={"content-type": "application/json", "content-length": "100", **AUTH},
    )
    with Conn(gw.port) as c:
        c.send(head + b'{"model":')
        err = assert_openai_error(c.read("POST"), 408)
    assert err["code"] == "request_timeout"


def test_compressed_body_is_415(gw):
    with Conn(gw.port) as c:
        c.send(json_post("/v1/chat/completions", CHAT, {"content-encoding": "gzip"}))
        err = assert_openai_error(c.read("POST"), 415)
    assert "gzip" in err["message"]


def test_malformed_request_is_an_openai_shaped_400(gw):
    with Conn(gw.port) as c:
        c.send(b"GET /healthz HTTP/1.1\r\nbad header line\r\n\r\n")
        assert_openai_error(c.read(), 400)


_CHUNKED_HEAD = request(
    "POST",
    "/v1/chat/completions",
    headers={"content-type": "application/json", "transfer-encoding": "chunked", **AUTH},
    length=False,
)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"zz\r\n{}\r\n0\r\n\r\n", id="bad-chunk-size"),
        pytest.param(b"-2\r\n{}\r\n0\r\n\r\n", id="negative-chunk-size"),
        pytest.param(b"2\r\n{}XX0\r\n\r\n", id="missing-crlf-after-data"),
        pytest.param(b"2\n{}\r\n0\r\n\r\n", id="bare-lf-after-size"),
        pytest.param(b"F" * 20 + b"\r\n{}", id="chunk-size-overflow"),
        # a size line still going after 32 KiB (llhttp would take leading zeros or an
        # extension for ever)
        pytest.param(b"0" * (32 * 1024), id="over-long-size-line"),
        pytest.param(b"2;" + b"e" * (32 * 1024), id="over-long-extension"),
    ],
)
def test_malformed_chunked_body_is_an_openai_shaped_400(gw, body):
    """Was: no answer at all (the connection closed, or held open; uvicorn answers 400)."""
    with Conn(gw.port, timeout=10) as c:
        try:
            c.send(_CHUNKED_HEAD + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before the rest was read
        err = assert_openai_error(c.read("POST"), 400)
        assert err["type"] == "invalid_request_error"
        assert "chunk" in err["message"].lower()
        assert c.closed_by_peer()
    assert httpx.get(gw.url + "/healthz", timeout=5).status_code == 200


@pytest.mark.parametrize("then", ["half-close", "silence"])
@pytest.mark.parametrize("sent", [b"", b'5\r\n{"mo'], ids=["no-chunk", "mid-chunk"])
def test_truncated_chunked_body_is_answered(gw, sent, then):
    """A body cut short gets an answer, never a hang: 400 when the client has closed its
    side (the body can never end), 408 after limits.body_timeout_s when it goes silent
    (also before its first chunk)."""
    import socket

    with Conn(gw.port, timeout=10) as c:
        c.send(_CHUNKED_HEAD + sent)
        if then == "half-close":
            c.sock.shutdown(socket.SHUT_WR)
        t = time.monotonic()
        answer = c.read("POST")
        assert time.monotonic() - t < 8
        err = assert_openai_error(answer, 400 if then == "half-close" else 408)
        assert c.closed_by_peer()
    assert err["code"] == ("invalid_request" if then == "half-close" else "request_timeout")


def test_vllm_health_route(gw):
    """Was: 404 (guidellm's backend check failed)."""
    r = httpx.get(gw.url + "/health")
    assert r.status_code == 200 and r.content == b""


def test_every_v1_route_needs_the_key(gw):
    """Was: GET /v1/models answered without a key."""
    assert httpx.get(gw.url + "/v1/models").status_code == 401
    assert (
        httpx.get(gw.url + "/v1/models", headers={"authorization": "Bearer no"}).status_code == 401
    )
    r = httpx.get(gw.url + "/v1/models", headers=AUTH)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL
    assert httpx.get(gw.url + "/healthz").status_code == 200  # health stays open


def test_framework_refusals_are_openai_shaped(gw):
    admin = {"authorization": f"Bearer {ADMIN}"}
    r = httpx.get(gw.url + "/admin/plan", params={"slo_ms": "fast"}, headers=admin)
    assert r.status_code == 400 and r.json()["error"]["param"] == "slo_ms"
    r = httpx.get(gw.url + "/no/such/route")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(gw.url + "/v1/chat/completions", headers=AUTH)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in r.headers["allow"]


def test_openapi_documents_every_route(gw):
    doc = httpx.get(gw.url + "/openapi.json").json()
    paths = doc["paths"]
    for path in ("/v1/chat/completions", "/v1/completions"):
        op = paths[path]["post"]
        assert op["requestBody"]["required"]
        assert {"200", "400", "401", "404", "413", "503"} <= set(op["responses"])
    for path in ("/v1/models", "/health", "/healthz", "/readyz", "/metrics", "/admin/plan"):
        assert "get" in paths[path]
    assert httpx.get(gw.url + "/docs").status_code == 200


def test_hidden_worker_addresses(fresh_procs):
    """expose.worker_header / expose.upstream_detail off: no internal address in answers."""
    emu = emulator(fresh_procs, "hidden-emu", 8192).wait_ready()
    dead = "http://127.0.0.1:9"  # nothing listens there
    cfg = gateway_config(
        [emu.url],
        [],
        expose={"worker_header": False, "upstream_detail": False},
    )
    g = start_gateway(fresh_procs, cfg)
    r = httpx.post(g.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and "x-fleetgate-worker" not in r.headers
    assert r.headers["x-fleetgate-pool"] == "short"
    cfg2 = gateway_config(
        [dead], [], expose={"upstream_detail": False}, health={"interval_s": 30.0}
    )
    g2 = start_gateway(fresh_procs, cfg2, name="gateway-dead")
    r = httpx.post(g2.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code in (502, 503)
    assert "127.0.0.1" not in r.text


# --- every other route: the key checked before the body, the body bounded (issue 23) ------
HUGE = 200 * 1024 * 1024


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/admin/workers", {}, 403),
        ("/admin/workers", {"authorization": "Bearer wrong"}, 403),
        ("/admin/reload", {}, 403),
        ("/admin/entitlements", {}, 403),  # routes not configured (no entitlements key)
        ("/admin/entitlements", {"authorization": f"Bearer {ADMIN}"}, 403),
        ("/admin/entitlements/x", {"authorization": f"Bearer {ADMIN}"}, 403),
        ("/v1/models", {}, 401),
    ],
)
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_refused_body_is_answered_before_it_is_sent(gw, path, headers, status, framing):
    """Was: the whole body read and parsed before the key was checked (no limit, no
    deadline, also with the admin routes not configured): here the client sends the head
    only, and the refusal comes at once, the connection closed behind it."""
    method = "PATCH" if path == "/admin/entitlements/x" else "POST"
    if path == "/v1/models":
        method = "GET"
    framed = {"content-length": str(HUGE)} if framing == "content-length" else {
        "transfer-encoding": "chunked"}  # fmt: skip
    head = request(method, path, headers={"content-type": "application/json", **headers,
                                          **framed})  # fmt: skip
    with Conn(gw.port, timeout=5) as c:
        c.send(head + (b"" if framing == "content-length" else b"1\r\n{\r\n"))
        err = assert_openai_error(c.read(method), status)
        assert c.closed_by_peer()
    assert err["type"] in ("permission_error", "authentication_error")


def test_a_huge_unauthenticated_admin_body_is_not_read(gw):
    """Was: one 200 MiB body took the process from 125 to 659 MiB."""
    before = _rss_kib(gw.popen.pid)
    piece = b"x" * (1024 * 1024)
    sent = 0
    head = request("POST", "/admin/workers", headers={"content-length": str(HUGE)})
    with Conn(gw.port, timeout=10) as c:
        c.send(head)
        try:
            while sent < HUGE:
                c.sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
    assert sent < HUGE // 4, f"the gateway took {sent >> 20} MiB of an unauthenticated body"
    grown = _rss_kib(gw.popen.pid) - before
    assert grown < 24 * 1024, f"RSS grew by {grown >> 10} MiB"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_admin_body_over_the_limit_is_413(gw, framing):
    admin = {"authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
    if framing == "content-length":
        head = request(
            "POST", "/admin/workers", headers={**admin, "content-length": str(MAX_BODY + 1)}
        )
        wire = head  # nothing of the body needs to be sent
    else:
        big = b"x" * (MAX_BODY + 1)
        wire = request("POST", "/admin/workers",
                       chunked([big[i : i + 65536] for i in range(0, len(big), 65536)]),
                       {**admin, "transfer-encoding": "chunked"}, length=False)  # fmt: skip
    with Conn(gw.port, timeout=5) as c:
        try:
            c.send(wire)
        except (BrokenPipeError, ConnectionResetError):
            pass
        err = assert_openai_error(c.read("POST"), 413)
    assert err["code"] == "body_too_large"


@pytest.mark.parametrize(
    ("method", "path", "auth"),
    [("POST", "/admin/workers", ADMIN), ("GET", "/v1/models", KEY), ("POST", "/healthz", None)],
)
def test_a_slow_body_on_any_route_is_408(gw, method, path, auth):
    """Was: 50 slow admin bodies still held after 40 s."""
    headers = {"content-type": "application/json", "content-length": "100"}
    if auth:
        headers["authorization"] = f"Bearer {auth}"
    with Conn(gw.port, timeout=8) as c:
        c.send(request(method, path, headers=headers) + b'{"pool":')
        err = assert_openai_error(c.read(method), 408)
        assert c.closed_by_peer()
    assert err["code"] == "request_timeout"


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_authenticated_small_admin_body_still_works(gw, framing):
    body = orjson.dumps({"pool": "nope", "url": "http://127.0.0.1:9"})
    admin = {"authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
    if framing == "chunked":
        wire = request("POST", "/admin/workers", chunked([body[:5], body[5:]]),
                       {**admin, "transfer-encoding": "chunked"}, length=False)  # fmt: skip
    else:
        wire = request("POST", "/admin/workers", body, admin)
    with Conn(gw.port) as c:
        c.send(wire + request("GET", "/v1/models", headers=AUTH))
        err = assert_openai_error(c.read("POST"), 400)  # the body was read: it names the pool
        models = c.read()
    assert err["param"] == "pool"
    assert models.status == 200 and orjson.loads(models.body)["data"][0]["id"] == MODEL
