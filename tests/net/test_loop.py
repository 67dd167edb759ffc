"""install_event_loop: uvloop when present, and our connections work on it."""

from __future__ import annotations

import asyncio

import pytest

from txmq.net import Server, connect, install_event_loop
from txmq.protocol.frame import RemotingCommand


def test_connections_work_on_the_installed_loop() -> None:
    pytest.importorskip("uvloop")
    before = asyncio.get_event_loop_policy()

    async def round_trip() -> tuple[str, list[bytes]]:
        async def handler(conn, cmd: RemotingCommand) -> RemotingCommand:
            await asyncio.sleep(0)
            return cmd.response(body=cmd.body)

        server = await Server.start("127.0.0.1", 0, handler)
        conn = await connect("127.0.0.1", server.port)
        try:
            responses = await asyncio.gather(
                *(conn.request(RemotingCommand.request(10, body=b"%d" % i), timeout=5) for i in range(100))
            )
            return type(asyncio.get_running_loop()).__module__, [r.body for r in responses]
        finally:
            conn.close()
            await server.close()

    try:
        assert install_event_loop() == "uvloop"
        module, bodies = asyncio.run(round_trip())
    finally:
        asyncio.set_event_loop_policy(before)
    assert module.startswith("uvloop")
    assert bodies == [b"%d" % i for i in range(100)]
