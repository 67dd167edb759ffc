"""A malformed frame closes that one connection, with a logged reason; everyone else keeps being served."""

from __future__ import annotations

import logging
import random
import struct

import orjson
import pytest

from txmq.net import Server, connect
from txmq.protocol.frame import RemotingCommand, encode_frame
from txmq.testing import aeventually

from .conftest import RawClient, echo

pytestmark = pytest.mark.timeout(30)


def _frame(header: bytes, serialize_type: int = 0) -> bytes:
    return struct.pack(">iI", 4 + len(header), (serialize_type << 24) | len(header)) + header


BAD_INPUTS = {
    "random bytes": random.Random(1234).randbytes(512),
    "2 GiB length prefix": struct.pack(">i", 0x7FFFFFFF) + b"\x00" * 16,
    "negative length": struct.pack(">i", -1) + b"\x00" * 8,
    "invalid JSON header": _frame(b'{"code": 10, "opaque": '),
    "non-object JSON header": _frame(b"[10]"),
    "header without code": _frame(orjson.dumps({"opaque": 1, "flag": 0})),
    "unknown serialize type": _frame(b"{}", serialize_type=7),
    "truncated binary header": _frame(b"\x00\x0a\x00", serialize_type=1),
    "good frame then garbage": encode_frame(RemotingCommand(code=1, opaque=1)) + b"\xff" * 12,
}

REASONS = {
    "random bytes": "malformed frame",
    "2 GiB length prefix": "exceeds the maximum frame size",
    "negative length": "negative frame length",
    "invalid JSON header": "not valid JSON",
    "non-object JSON header": "must be an object",
    "header without code": "no 'code' field",
    "unknown serialize type": "unknown serialize type 7",
    "truncated binary header": "shorter than",
    "good frame then garbage": "malformed frame",
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
async def test_malformed_input_closes_only_that_connection(name: str, caplog: pytest.LogCaptureFixture) -> None:
    server = await Server.start("127.0.0.1", 0, echo)
    good = await connect("127.0.0.1", server.port)
    bad = await RawClient.open(server.port)
    try:
        await aeventually(lambda: len(server.connections) == 2)
        with caplog.at_level(logging.WARNING, logger="txmq.net"):
            await bad.send(BAD_INPUTS[name])
            await bad.read_eof()  # the server hangs up on the bad client
            await aeventually(lambda: len(server.connections) == 1)
        bad_port = bad.writer.get_extra_info("sockname")[1]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"127.0.0.1:{bad_port}" in m and REASONS[name] in m for m in warnings), warnings
        # The well-behaved client never noticed.
        resp = await good.request(RemotingCommand.request(10, {"k": "v"}, b"still here"), timeout=5)
        assert resp.body == b"still here" and not good.closed
        # And new clients are welcome.
        other = await connect("127.0.0.1", server.port)
        assert (await other.request(RemotingCommand.request(10), timeout=5)).code == 0
        other.close()
    finally:
        bad.close()
        good.close()
        await server.close()


async def test_truncated_frame_then_close(caplog: pytest.LogCaptureFixture) -> None:
    server = await Server.start("127.0.0.1", 0, echo)
    good = await connect("127.0.0.1", server.port)
    bad = await RawClient.open(server.port)
    try:
        await aeventually(lambda: len(server.connections) == 2)
        frame = encode_frame(RemotingCommand(code=10, opaque=5, body=b"x" * 100))
        with caplog.at_level(logging.INFO, logger="txmq.net"):
            await bad.send(frame[:50])
            bad.writer.close()
            await bad.writer.wait_closed()
            await aeventually(lambda: len(server.connections) == 1)
        assert any("in the middle of a frame" in r.getMessage() for r in caplog.records)
        assert (await good.request(RemotingCommand.request(10, body=b"ok"), timeout=5)).body == b"ok"
    finally:
        good.close()
        await server.close()


async def test_client_side_decoder_errors_close_the_client_connection() -> None:
    # A server that answers garbage: the client connection closes and its waiting request fails cleanly.
    import asyncio

    from txmq.errors import ConnectionClosedError

    async def garbage_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"\x00\x00\x00\x08\x00\x00\x00\x04nope")
        await reader.read()  # until the client hangs up
        writer.close()
        finished.set()

    finished = asyncio.Event()

    raw_server = await asyncio.start_server(garbage_server, "127.0.0.1", 0)
    port = raw_server.sockets[0].getsockname()[1]
    conn = await connect("127.0.0.1", port)
    try:
        with pytest.raises(ConnectionClosedError, match="malformed frame"):
            await conn.request(RemotingCommand.request(10), timeout=5)
        assert conn.closed
    finally:
        raw_server.close()
        await asyncio.wait_for(finished.wait(), 5)
