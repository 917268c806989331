"""Conformance of the hand-written upstream client and SSE relay, against an engine that
misbehaves on purpose (tests/misbehaving_engine.py). Every async case runs on asyncio's
default loop and on uvloop (the gateway's loop).

Time bounds here are generous ceilings (a slow, loaded machine passes), never ratios.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import tracemalloc
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.relay import StreamScanner
from gateway.upstream import MAX_HEAD_BYTES, Endpoint, Timeouts, UpstreamClient
from gateway.upstream_errors import UpstreamError
from tests.misbehaving_engine import BOGUS, MisbehavingEngine, completion_json, sse_events

STREAM_BODY = b'{"model":"m","stream":true,"messages":[]}'
JSON_BODY = b'{"model":"m","messages":[]}'
CEILING_S = 5.0  # "fails fast": far below the first-byte timeout, generous for a slow box

# the loop_factories hook that replaces it is session-wide; this override stays local
pytestmark = pytest.mark.filterwarnings(
    'ignore:Overriding the "event_loop_policy" fixture:DeprecationWarning'
)


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    if request.param == "uvloop":
        return uvloop.EventLoopPolicy()
    return asyncio.DefaultEventLoopPolicy()


@pytest.fixture
async def engine() -> AsyncIterator[MisbehavingEngine]:
    e = MisbehavingEngine()
    await e.start()
    yield e
    await e.close()


@pytest.fixture(scope="module")
def engine_process() -> Iterator[Endpoint]:
    """The engine in its own process: memory measured here is the client's alone."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.misbehaving_engine", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.match(r"listening on (\d+)", line)
        assert m, f"engine did not start: {line!r}"
        yield Endpoint.from_url(f"http://127.0.0.1:{m.group(1)}")
    finally:
        proc.terminate()
        proc.wait(10)


def ep_of(engine: MisbehavingEngine) -> Endpoint:
    return Endpoint.from_url(engine.url)


def misbehave(mode: str, **params: object) -> bytes:
    return b"x-misbehave: %s\r\n" % mode.encode() + b"".join(
        b"x-misbehave-%s: %s\r\n" % (k.encode(), str(v).encode()) for k, v in params.items()
    )


async def fetch(client: UpstreamClient, ep: Endpoint, headers: bytes = b"", body=JSON_BODY):
    r = await client.request(ep, b"POST", b"/v1/chat/completions", headers, body)
    try:
        return r.status, await r.read()
    finally:
        r.release()


async def stream_all(client: UpstreamClient, ep: Endpoint, headers: bytes = b"") -> bytes:
    r = await client.request(ep, b"POST", b"/v1/chat/completions", headers, STREAM_BODY)
    try:
        assert r.status == 200
        parts = []
        while (chunk := await r.next_chunk()) is not None:
            parts.append(chunk)
        return b"".join(parts)
    finally:
        r.release()


async def eventually(predicate, timeout: float = CEILING_S) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


# --- 1. interim 1xx responses ---------------------------------------------------------------
@pytest.mark.parametrize("mode", ["early-hints", "continue"])
async def test_interim_1xx_is_skipped_and_the_connection_stays_clean(engine, mode):
    client = UpstreamClient(Timeouts(2, 10, 10))
    ep = ep_of(engine)
    try:
        r = await client.request(ep, b"POST", b"/v1/chat/completions", misbehave(mode), JSON_BODY)
        assert r.status == 200
        assert r.header(b"link") is None  # the 103's headers are not the answer's
        assert r.header(b"content-type") == b"application/json"
        assert await r.read() == completion_json()
        r.release()
        # the pooled connection answers the next request with exactly its own answer
        assert await stream_all(client, ep) == b"".join(sse_events(5))
        assert await fetch(client, ep) == (200, completion_json())
        assert engine.total_connections == 1
    finally:
        await client.close()


# --- 2. unsolicited bytes -----------------------------------------------------------------
async def test_bytes_on_an_idle_pooled_connection_close_it(engine):
    client = UpstreamClient(Timeouts(2, 10, 10))
    ep = ep_of(engine)
    try:
        assert await fetch(client, ep, misbehave("unsolicited", delay=0.05)) == (
            200,
            completion_json(),
        )
        await eventually(lambda: client.pool_status(ep).open == 0)  # dropped, not kept idle
        for _ in range(3):
            assert await fetch(client, ep) == (200, completion_json())
        assert engine.total_connections == 2
    finally:
        await client.close()


async def test_bytes_after_a_complete_answer_are_never_the_next_answer(engine):
    client = UpstreamClient(Timeouts(2, 10, 10))
    ep = ep_of(engine)
    try:
        assert await fetch(client, ep, misbehave("unsolicited-inline")) == (200, completion_json())
        status, body = await fetch(client, ep)
        assert (status, body) == (200, completion_json())
        assert b"WRONG" not in body and BOGUS not in body
        assert engine.total_connections == 2
    finally:
        await client.close()


# --- 3. response head limits ----------------------------------------------------------------
async def _head_failure(ep: Endpoint, headers: bytes) -> tuple[UpstreamError, int]:
    """The error, and the peak memory (bytes) this process allocated meanwhile."""
    client = UpstreamClient(Timeouts(2, 60, 60))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(UpstreamError) as e:
            async with asyncio.timeout(CEILING_S):
                await client.request(ep, b"POST", b"/v1/chat/completions", headers, JSON_BODY)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        await client.close()
    return e.value, peak


async def test_endless_header_lines_fail_fast_with_bounded_memory(engine_process):
    err, peak = await _head_failure(engine_process, misbehave("header-flood"))
    assert err.kind == "protocol" and err.before_response
    assert peak < 2 * 1024 * 1024, f"buffered {peak} bytes"


@pytest.mark.parametrize("size", [1024 * 1024, 8 * 1024 * 1024])
async def test_a_huge_header_fails_fast_with_bounded_memory(engine_process, size):
    err, peak = await _head_failure(engine_process, misbehave("big-header", size=size))
    assert err.kind == "protocol" and err.before_response
    assert str(MAX_HEAD_BYTES) in str(err)
    assert peak < 2 * 1024 * 1024, f"buffered {peak} bytes"


async def test_a_head_just_under_the_limits_is_fine(engine):
    client = UpstreamClient(Timeouts(2, 10, 10))
    try:
        status, body = await fetch(client, ep_of(engine), misbehave("big-header", size=60_000))
        assert (status, body) == (200, completion_json())
    finally:
        await client.close()


# --- 4. body limit --------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["huge-body", "huge-chunked"])
async def test_a_body_read_whole_is_capped(engine, mode):
    limit = 1024 * 1024
    client = UpstreamClient(Timeouts(2, 10, 10), max_response_bytes=limit)
    ep = ep_of(engine)
    try:
        r = await client.request(
            ep, b"POST", b"/v1/chat/completions", misbehave(mode, size=64 * limit), JSON_BODY
        )
        with pytest.raises(UpstreamError) as e:
            async with asyncio.timeout(CEILING_S):
                await r.read()
        r.release()
        assert e.value.kind == "body_too_large" and not e.value.before_response
        assert str(limit) in str(e.value) and "max_response_bytes" in str(e.value)
        assert client.pool_status(ep).open == 0  # that connection is gone
        # under the limit is fine, and so is a per-call limit
        assert await fetch(client, ep, misbehave(mode, size=limit)) == (200, b"x" * limit)
        r = await client.request(
            ep, b"POST", b"/v1/chat/completions", misbehave(mode, size=limit), JSON_BODY
        )
        with pytest.raises(UpstreamError) as e:
            await r.read(max_bytes=1000)
        r.release()
        assert e.value.kind == "body_too_large" and "1000 bytes" in str(e.value)
    finally:
        await client.close()


# --- 5. close-delimited bodies --------------------------------------------------------------
async def test_close_delimited_json_is_read_whole(engine):
    client = UpstreamClient(Timeouts(2, 10, 10))
    ep = ep_of(engine)
    try:
        assert await fetch(client, ep, misbehave("close-json")) == (200, completion_json())
        assert client.pool_status(ep).open == 0  # not pooled
        assert await fetch(client, ep) == (200, completion_json())
        assert engine.total_connections == 2
    finally:
        await client.close()


async def test_close_delimited_sse_ends_cleanly(engine):
    client = UpstreamClient(Timeouts(2, 10, 10))
    ep = ep_of(engine)
    try:
        assert await stream_all(client, ep, misbehave("close-sse", n=4)) == b"".join(sse_events(4))
        assert client.pool_status(ep).open == 0
    finally:
        await client.close()


# --- 6. a caller blocked on its own slow client --------------------------------------------
async def test_a_suspension_longer_than_the_idle_timeout_is_not_an_idle_timeout(engine):
    client = UpstreamClient(Timeouts(2, 10, 0.3))
    ep = ep_of(engine)
    expired = []
    try:
        # ~2.6 MiB: the client stops reading the engine (high water) while suspended
        headers = misbehave("long-sse", n=40, size=64 * 1024)
        r = await client.request(ep, b"POST", b"/v1/chat/completions", headers, STREAM_BODY)
        parts = [await r.next_chunk()]
        r.suspend_for_client(30.0, lambda: expired.append(1))
        await asyncio.sleep(1.5)  # five idle timeouts
        r.resume_from_client()
        while (chunk := await r.next_chunk()) is not None:
            parts.append(chunk)
        r.release()
        assert b"".join(p or b"" for p in parts) == b"".join(sse_events(40, pad=64 * 1024))
        assert expired == []
    finally:
        await client.close()


async def test_a_suspension_past_the_write_deadline_calls_on_expire_once(engine):
    client = UpstreamClient(Timeouts(2, 10, 0.3))
    ep = ep_of(engine)
    expired = []
    try:
        headers = misbehave("long-sse", n=40, size=64 * 1024)
        r = await client.request(ep, b"POST", b"/v1/chat/completions", headers, STREAM_BODY)
        first = await r.next_chunk()
        r.suspend_for_client(0.2, lambda: expired.append(1))
        await eventually(lambda: expired)
        await asyncio.sleep(0.5)  # and only once, and never an engine error
        assert expired == [1]
        r.resume_from_client()
        rest = []
        while (chunk := await r.next_chunk()) is not None:
            rest.append(chunk)
        r.release()
        assert (first or b"") + b"".join(rest) == b"".join(sse_events(40, pad=64 * 1024))
    finally:
        await client.close()


async def test_the_write_deadline_holds_after_the_engine_has_finished(engine):
    client = UpstreamClient(Timeouts(2, 10, 0.3))
    ep = ep_of(engine)
    expired = []
    try:
        headers = misbehave("close-sse", n=2, delay=0.01)
        r = await client.request(ep, b"POST", b"/v1/chat/completions", headers, STREAM_BODY)
        r.suspend_for_client(0.5, lambda: expired.append(1))
        await eventually(lambda: engine.open_connections == 0)  # the engine is done and gone
        await eventually(lambda: expired)
        r.resume_from_client()
        rest = []
        while (chunk := await r.next_chunk()) is not None:
            rest.append(chunk)
        r.release()
        assert b"".join(rest) == b"".join(sse_events(2)) and expired == [1]
    finally:
        await client.close()


async def test_after_resuming_the_idle_timer_runs_again(engine):
    client = UpstreamClient(Timeouts(2, 10, 0.3))
    ep = ep_of(engine)
    try:
        headers = misbehave("slow-sse", n=3, delay=1.5)
        r = await client.request(ep, b"POST", b"/v1/chat/completions", headers, STREAM_BODY)
        assert await r.next_chunk() == sse_events(3)[0]
        r.suspend_for_client(30.0, lambda: None)
        r.resume_from_client()
        with pytest.raises(UpstreamError) as e:
            await r.next_chunk()  # the next event comes 1.5 s later: idle timeout is 0.3 s
        r.release()
        assert e.value.kind == "idle_timeout"
    finally:
        await client.close()


# --- 7. SSE framing -------------------------------------------------------------------------
FRAMINGS = ["lf", "crlf", "cr", "mixed"]


def _expected(events: list[bytes], strip: bool) -> bytes:
    return b"".join(e for e in events if not (strip and b'"usage"' in e))


def _run(scanner: StreamScanner, chunks: list[bytes]) -> bytes:
    return b"".join(scanner.feed(c) for c in chunks) + scanner.flush()


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("strip", [False, True])
def test_sse_framing_split_at_every_byte(framing, strip):
    events = sse_events(3, framing)
    stream = b"".join(events)
    for cut in range(len(stream) + 1):
        s = StreamScanner(strip_usage=strip)
        assert _run(s, [stream[:cut], stream[cut:]]) == _expected(events, strip), cut
        assert s.usage is not None and s.usage["completion_tokens"] == 3
        assert s.done
    s = StreamScanner(strip_usage=strip)
    assert _run(s, [stream[i : i + 1] for i in range(len(stream))]) == _expected(events, strip)
    assert s.done and s.usage is not None


@pytest.mark.parametrize("framing", FRAMINGS)
@pytest.mark.parametrize("strip", [False, True])
def test_sse_complete_events_are_forwarded_at_once(framing, strip):
    events = sse_events(3, framing)
    s = StreamScanner(strip_usage=strip)
    for event in events:
        expected = b"" if strip and b'"usage"' in event else event
        assert s.feed(event) == expected
    assert s.flush() == b""
    assert s.done


def test_sse_crlf_event_is_forwarded_before_its_last_lf():
    # a CR ends a line: "data: x\r\n\r" is a complete event; the LF that follows is relayed
    # with the next read (or dropped with a stripped usage event)
    events = sse_events(1, "crlf")
    s = StreamScanner(strip_usage=True)
    assert s.feed(events[0][:-1]) == events[0][:-1]
    assert s.feed(b"\n" + events[1][:-1]) == b"\n"  # event 0's LF; the usage event, stripped
    assert s.feed(b"\n" + events[2]) == events[2]  # its LF went with it
    assert s.done


@pytest.mark.parametrize("mode", ["sse-crlf", "sse-cr", "sse-mixed"])
async def test_sse_framings_relay_through_the_client(engine, mode):
    client = UpstreamClient(Timeouts(2, 10, 10))
    try:
        raw = await stream_all(client, ep_of(engine), misbehave(mode, n=4))
        events = sse_events(4, mode[4:])
        assert raw == b"".join(events)
        s = StreamScanner(strip_usage=True)
        assert _run(s, [raw]) == _expected(events, True)
        assert s.done and s.usage is not None
    finally:
        await client.close()


_LINE_ENDS = [b"\n", b"\r\n", b"\r"]


@st.composite
def sse_stream(draw):
    """(events as (bytes, is_usage_only, is_done)) with random framing and line endings."""
    n = draw(st.integers(0, 6))
    kinds = [*(["tok"] * n), "usage", "done"]
    if draw(st.booleans()):
        kinds.insert(draw(st.integers(0, len(kinds) - 1)), "comment")
    events = []
    for i, kind in enumerate(kinds):
        if kind == "tok":
            text = draw(st.text(alphabet='ab "usage\\n{}', max_size=12))
            payload = orjson.dumps(
                {"object": "chat.completion.chunk", "choices": [{"delta": {"content": text}}]}
            )
            lines = [b"id: %d" % i] if draw(st.booleans()) else []
            lines.append(b"data: " + payload)
        elif kind == "usage":
            payload = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 9}})
            lines = [(b"data: " if draw(st.booleans()) else b"data:") + payload]
        elif kind == "done":
            lines = [b"data: [DONE]"]
        else:
            lines = [b": keep-alive"]
        raw = b""
        for line in [*lines, b""]:  # the blank line ends the event
            # a CR followed by a LF would be one CRLF line ending, not two
            ends = _LINE_ENDS[1:] if raw.endswith(b"\r") and not line else _LINE_ENDS
            raw += line + draw(st.sampled_from(ends))
        events.append((raw, kind == "usage", kind == "done"))
    return events


def _dispatch_point(event_end: int, raw: bytes) -> int:
    # an event whose blank line is a CRLF is complete at its CR
    return event_end - 1 if raw.endswith(b"\r\n") else event_end


@settings(max_examples=300, deadline=None)
@given(sse_stream(), st.lists(st.integers(0, 10_000), max_size=8), st.booleans())
def test_sse_scanner_property(events, cuts, strip):
    stream = b"".join(raw for raw, _, _ in events)
    expected = b"".join(raw for raw, usage, _ in events if not (strip and usage))
    points = sorted({c % (len(stream) + 1) for c in cuts})
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    s = StreamScanner(strip_usage=strip)
    out = b""
    fed = 0
    for chunk in chunks:
        out += s.feed(chunk)
        fed += len(chunk)
        assert expected.startswith(out)
        # every event complete within what was fed is out already
        owed = 0
        end = 0
        for raw, usage, _ in events:
            end += len(raw)
            if _dispatch_point(end, raw) > fed:
                break
            if not (strip and usage):
                owed += len(raw) if end <= fed else len(raw) - 1
        assert len(out) >= owed
    out += s.flush()
    assert out == expected
    assert s.usage == {"prompt_tokens": 9}
    assert s.done


# --- 8. per-worker connection cap ------------------------------------------------------
async def test_the_connection_cap_holds_under_40_concurrent_streams(engine):
    client = UpstreamClient(Timeouts(2, 10, 10), max_connections_per_worker=2)
    ep = ep_of(engine)
    try:
        headers = misbehave("slow-sse", n=3, delay=0.01)
        results = await asyncio.gather(*(stream_all(client, ep, headers) for _ in range(40)))
        assert all(r == b"".join(sse_events(3)) for r in results)
        assert engine.peak_connections <= 2
        assert len(engine.requests) == 40
        st_ = client.pool_status(ep)
        assert st_.open <= 2 and st_.waiting == 0 and st_.in_use == 0
        assert st_.idle == st_.open  # idle connections are what the cap counts
    finally:
        await client.close()


async def test_waiters_are_served_first_come_first_served(engine):
    client = UpstreamClient(Timeouts(2, 10, 10), max_connections_per_worker=1)
    ep = ep_of(engine)
    try:
        holder = await client.request(
            ep, b"POST", b"/0", misbehave("slow-sse", n=2, delay=0.2), STREAM_BODY
        )
        tasks = []
        for i in range(1, 6):
            tasks.append(asyncio.create_task(fetch_path(client, ep, b"/%d" % i)))
            await eventually(lambda i=i: client.pool_status(ep).waiting == i)
        while await holder.next_chunk() is not None:
            pass
        holder.release()
        assert await asyncio.gather(*tasks) == [(200, completion_json())] * 5
        assert [r.path for r in engine.requests] == [f"/{i}" for i in range(6)]
        assert engine.total_connections == 1
    finally:
        await client.close()


async def fetch_path(client: UpstreamClient, ep: Endpoint, path: bytes):
    r = await client.request(ep, b"POST", path, b"", JSON_BODY)
    try:
        return r.status, await r.read()
    finally:
        r.release()


async def test_a_waiter_past_the_wait_bound_gets_a_timeout(engine):
    client = UpstreamClient(Timeouts(2, 10, 10, pool_wait=0.3), max_connections_per_worker=1)
    ep = ep_of(engine)
    try:
        holder = await client.request(
            ep, b"POST", b"/", misbehave("slow-sse", n=2, delay=3), STREAM_BODY
        )
        with pytest.raises(UpstreamError) as e:
            async with asyncio.timeout(CEILING_S):
                await client.request(ep, b"POST", b"/", b"", JSON_BODY)
        assert e.value.kind == "pool_timeout" and e.value.is_timeout and e.value.before_response
        assert "no free connection" in str(e.value)
        assert client.pool_status(ep).waiting == 0
        holder.release()
    finally:
        await client.close()


async def test_a_cancelled_waiter_leaves_the_queue(engine):
    client = UpstreamClient(Timeouts(2, 10, 10), max_connections_per_worker=1)
    ep = ep_of(engine)
    try:
        holder = await client.request(
            ep, b"POST", b"/", misbehave("slow-sse", n=2, delay=0.2), STREAM_BODY
        )
        waiter = asyncio.create_task(client.request(ep, b"POST", b"/", b"", JSON_BODY))
        await eventually(lambda: client.pool_status(ep).waiting == 1)
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        assert client.pool_status(ep).waiting == 0
        while await holder.next_chunk() is not None:
            pass
        holder.release()
        assert client.pool_status(ep) == (1, 1, 0, 0)
        assert await fetch(client, ep) == (200, completion_json())
        assert engine.total_connections == 1
    finally:
        await client.close()


async def test_a_closed_connection_frees_its_slot_for_a_waiter(engine):
    client = UpstreamClient(Timeouts(2, 10, 10), max_connections_per_worker=1)
    ep = ep_of(engine)
    try:
        holder = await client.request(
            ep, b"POST", b"/", misbehave("close-sse", n=2, delay=0.1), STREAM_BODY
        )
        waiter = asyncio.create_task(fetch(client, ep))
        await eventually(lambda: client.pool_status(ep).waiting == 1)
        while await holder.next_chunk() is not None:
            pass
        holder.release()
        assert await waiter == (200, completion_json())
        assert engine.peak_connections == 1 and engine.total_connections == 2
    finally:
        await client.close()


# --- what the client already did ---------------------------------------------------------
async def test_keep_alive_reuses_one_connection(engine):
    client = UpstreamClient(Timeouts(2, 10, 10))
    ep = ep_of(engine)
    try:
        for _ in range(5):
            assert await fetch(client, ep) == (200, completion_json())
            assert await stream_all(client, ep) == b"".join(sse_events(5))
        assert engine.total_connections == 1
    finally:
        await client.close()


async def test_first_byte_and_idle_timeouts(engine):
    client = UpstreamClient(Timeouts(2, 0.3, 0.3))
    ep = ep_of(engine)
    try:
        with pytest.raises(UpstreamError) as e:
            await client.request(ep, b"POST", b"/", misbehave("silent"), JSON_BODY)
        assert e.value.kind == "first_byte_timeout" and e.value.before_response
        r = await client.request(ep, b"POST", b"/", misbehave("slow-sse", delay=2), STREAM_BODY)
        with pytest.raises(UpstreamError) as e:
            await r.next_chunk()
        r.release()
        assert e.value.kind == "first_byte_timeout" and not e.value.before_response
    finally:
        await client.close()


async def test_cancellation_closes_the_connection(engine):
    client = UpstreamClient(Timeouts(2, 10, 10))
    ep = ep_of(engine)
    try:
        task = asyncio.create_task(client.request(ep, b"POST", b"/", misbehave("silent"), b""))
        await eventually(lambda: engine.open_connections == 1 and engine.requests)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await eventually(lambda: engine.open_connections == 0)
    finally:
        await client.close()
