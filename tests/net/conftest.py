"""Helpers for txmq.net tests: real sockets on 127.0.0.1, a raw-bytes client, and a polling wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from txmq.net import Server
from txmq.protocol.frame import FrameDecoder, RemotingCommand, encode_frame


class RawClient:
    """A socket that speaks bytes, for sending what a well-behaved client never would."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder()
        self.received: list[RemotingCommand] = []

    @classmethod
    async def open(cls, port: int) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_command(self, cmd: RemotingCommand) -> None:
        await self.send(encode_frame(cmd))

    async def read_command(self, timeout: float = 5.0) -> RemotingCommand:
        while not self.received:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise EOFError("server closed the connection")
            self.received += self.decoder.feed(data)
        return self.received.pop(0)

    async def read_eof(self, timeout: float = 5.0) -> bytes:
        """Read until the server closes; returns whatever arrived before."""
        return await asyncio.wait_for(self.reader.read(), timeout)

    def close(self) -> None:
        self.writer.close()


def echo(conn, cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ext_fields=dict(cmd.ext_fields), body=cmd.body)


@pytest.fixture
async def echo_server() -> AsyncIterator[Server]:
    server = await Server.start("127.0.0.1", 0, echo)
    try:
        yield server
    finally:
        await server.close()
