"""Backpressure: a capped number of handlers per connection, and no unbounded buffering for peers that don't read."""

from __future__ import annotations

import asyncio
import struct

import pytest

from txmq.errors import ConnectionClosedError
from txmq.net import Connection, Server, connect
from txmq.protocol.frame import RemotingCommand, encode_frame
from txmq.testing import aeventually

from .conftest import RawClient

pytestmark = pytest.mark.timeout(60)


async def _settled(read: callable, rounds: int = 5, pause: float = 0.02) -> None:  # type: ignore[valid-type]
    """Wait until ``read()`` returns the same value ``rounds`` times in a row."""
    last = object()
    same = 0
    for _ in range(1000):
        value = read()
        same = same + 1 if value == last else 0
        if same >= rounds:
            return
        last = value
        await asyncio.sleep(pause)
    raise AssertionError("value never settled")


async def test_in_flight_cap_pauses_reading_and_resumes() -> None:
    gate = asyncio.Event()
    started = 0

    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal started
        started += 1
        await gate.wait()
        return cmd.response(body=cmd.body)

    server = await Server.start("127.0.0.1", 0, handler, max_in_flight=4)
    client = await connect("127.0.0.1", server.port)
    try:
        n = 50
        tasks = [
            asyncio.ensure_future(client.request(RemotingCommand.request(10, body=b"%d" % i), timeout=30))
            for i in range(n)
        ]
        await aeventually(lambda: len(server.connections) == 1)
        (conn,) = server.connections
        await aeventually(lambda: conn.reading_paused)
        await _settled(lambda: started)
        assert started == 4 and conn.in_flight == 4  # the other 46 wait, unread or held back, not running
        gate.set()
        responses = await asyncio.gather(*tasks)
        assert [r.body for r in responses] == [b"%d" % i for i in range(n)]
        assert started == n
        await aeventually(lambda: not conn.reading_paused)
    finally:
        client.close()
        await server.close()


async def test_peer_that_does_not_read_stops_being_read() -> None:
    big = b"r" * (256 * 1024)
    handled = 0

    def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal handled
        handled += 1
        return cmd.response(body=big)

    high = 256 * 1024
    server = await Server.start("127.0.0.1", 0, handler, write_buffer_high=high)
    raw = await RawClient.open(server.port)
    try:
        n = 2000  # 500 MiB of responses if the server buffered them all
        raw.writer.write(b"".join(encode_frame(RemotingCommand(code=10, opaque=i)) for i in range(n)))
        await aeventually(lambda: len(server.connections) == 1)
        (conn,) = server.connections
        await aeventually(lambda: conn.reading_paused, timeout=10)
        await _settled(lambda: handled)
        assert conn.reading_paused
        assert handled < n // 2  # bounded by the kernel's socket buffers, not by the number of requests
        # Memory held by the server for this peer stays near the high-water mark (plus one response).
        assert conn.write_buffer_size() <= high + 2 * (len(big) + 100)
        # Once the client reads, everything is answered.
        total = 0
        expected = n * (len(big) + len(encode_frame(RemotingCommand(code=0, opaque=0, flag=1))))
        while handled < n or total < expected - 4096 * n:
            chunk = await asyncio.wait_for(raw.reader.read(1 << 20), 10)
            assert chunk
            total += len(chunk)
        assert handled == n
    finally:
        raw.close()
        await server.close()


async def test_client_requests_wait_while_the_server_does_not_read() -> None:
    # A server that accepts and never reads: request() must stop writing once the client's buffer is full,
    # instead of queueing an unbounded amount of data, and fail cleanly when the connection closes.
    accepted: list[asyncio.StreamWriter] = []

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    raw_server = await asyncio.start_server(deaf, "127.0.0.1", 0)
    port = raw_server.sockets[0].getsockname()[1]
    conn = await connect("127.0.0.1", port, write_buffer_high=64 * 1024)
    body = b"b" * (1024 * 1024)
    tasks = []
    try:
        for _ in range(200):  # 200 MiB if nothing pushed back
            tasks.append(asyncio.ensure_future(conn.request(RemotingCommand.request(10, body=body), timeout=600)))
            await asyncio.sleep(0)
        await _settled(conn.write_buffer_size)
        assert conn.write_buffer_size() < 64 * 1024 + 2 * len(body)
        assert conn.pending_requests < 100  # the rest are waiting to write, not written
        conn.close("test over")
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, ConnectionClosedError) for r in results)
    finally:
        conn.abort()
        raw_server.close()
        for writer in accepted:
            writer.transport.abort()


async def test_responses_to_many_small_requests_arrive_in_one_piece() -> None:
    # Coalesced writes must still be valid, complete frames in order.
    server = await Server.start("127.0.0.1", 0, lambda conn, cmd: cmd.response(body=cmd.body))
    raw = await RawClient.open(server.port)
    try:
        n = 500
        await raw.send(
            b"".join(encode_frame(RemotingCommand(code=10, opaque=i, body=struct.pack(">i", i))) for i in range(n))
        )
        got = [await raw.read_command() for _ in range(n)]
        assert [c.opaque for c in got] == list(range(n))
        assert [struct.unpack(">i", c.body)[0] for c in got] == list(range(n))
    finally:
        raw.close()
        await server.close()
