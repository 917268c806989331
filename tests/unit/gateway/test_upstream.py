"""The upstream client against real loopback servers that misbehave on purpose."""

import asyncio

import pytest

from gateway.upstream import Endpoint, Timeouts, UpstreamClient
from gateway.upstream_errors import UpstreamError

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, Endpoint.from_url(f"http://127.0.0.1:{port}")


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def test_keep_alive_reuses_one_connection():
    connections = 0

    async def handler(reader, writer):
        nonlocal connections
        connections += 1
        try:
            while True:
                await read_request(reader)
                writer.write(OK)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server, ep = await serve(handler)
    client = UpstreamClient(Timeouts(1, 1, 1))
    for _ in range(5):
        r = await client.request(ep, b"POST", b"/x", b"", b"{}")
        assert r.status == 200 and await r.read() == b"{}"
        r.release()
    assert connections == 1
    await client.close()
    server.close()


async def test_chunked_body_arrives_in_pieces():
    gate = asyncio.Event()

    async def handler(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await gate.wait()
        writer.write(b"6\r\n world\r\n0\r\n\r\n")
        await writer.drain()

    server, ep = await serve(handler)
    client = UpstreamClient(Timeouts(1, 5, 5))
    r = await client.request(ep, b"POST", b"/x", b"", b"{}")
    assert await r.next_chunk() == b"hello"  # before the rest is even written
    gate.set()
    assert await r.next_chunk() == b" world"
    assert await r.next_chunk() is None
    r.release()
    await client.close()
    server.close()


async def test_connect_refused_is_before_response():
    client = UpstreamClient(Timeouts(1, 1, 1))
    with pytest.raises(UpstreamError) as e:
        await client.request(Endpoint.from_url("http://127.0.0.1:1"), b"POST", b"/", b"", b"")
    assert e.value.kind == "connect" and e.value.before_response
    await client.close()


async def test_first_byte_and_idle_timeouts():
    async def silent(reader, writer):
        await read_request(reader)
        await asyncio.sleep(10)

    async def stalls(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await asyncio.sleep(10)

    client = UpstreamClient(Timeouts(1, 0.2, 0.2))
    server, ep = await serve(silent)
    with pytest.raises(UpstreamError) as e:
        r = await client.request(ep, b"POST", b"/", b"", b"")
    assert e.value.kind == "first_byte_timeout" and e.value.is_timeout
    server.close()

    server, ep = await serve(stalls)
    r = await client.request(ep, b"POST", b"/", b"", b"")
    assert await r.next_chunk() == b"a"
    with pytest.raises(UpstreamError) as e:
        await r.next_chunk()
    assert e.value.kind == "idle_timeout" and not e.value.before_response
    r.release()
    server.close()
    await client.close()


async def test_reset_mid_response():
    async def dies(reader, writer):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        writer.transport.abort()

    server, ep = await serve(dies)
    client = UpstreamClient(Timeouts(1, 1, 1))
    r = await client.request(ep, b"POST", b"/", b"", b"")
    with pytest.raises(UpstreamError) as e:
        while await r.next_chunk() is not None:
            pass
    assert e.value.kind == "reset" and not e.value.before_response
    r.release()
    server.close()
    await client.close()


async def test_stale_pooled_connection_is_retried_transparently():
    served = 0

    async def one_per_connection(reader, writer):
        nonlocal served
        await read_request(reader)
        served += 1
        # advertise keep-alive, then close right after answering (the keep-alive race)
        writer.write(OK)
        await writer.drain()
        writer.close()

    server, ep = await serve(one_per_connection)
    client = UpstreamClient(Timeouts(1, 1, 1))
    for _ in range(3):
        r = await client.request(ep, b"POST", b"/", b"", b"{}")
        assert await r.read() == b"{}"
        r.release()
        await asyncio.sleep(0.05)
    assert served == 3
    await client.close()
    server.close()


async def test_cancel_closes_the_connection():
    closed = asyncio.Event()

    async def slow(reader, writer):
        await read_request(reader)
        try:
            await reader.read()  # returns when the client closes
        finally:
            closed.set()

    server, ep = await serve(slow)
    client = UpstreamClient(Timeouts(1, 10, 10))
    task = asyncio.create_task(client.request(ep, b"POST", b"/", b"", b""))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(closed.wait(), 5)
    await client.close()
    server.close()
