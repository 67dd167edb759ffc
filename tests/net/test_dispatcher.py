"""Dispatcher: routing by code, REQUEST_CODE_NOT_SUPPORTED, hooks."""

from __future__ import annotations

import asyncio

import pytest

from txmq.net import Connection, Dispatcher, Server, connect
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand

from .conftest import RawClient

pytestmark = pytest.mark.timeout(30)


async def test_unknown_code_is_not_supported_over_the_wire() -> None:
    dispatcher = Dispatcher()

    async def send(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(0)
        return cmd.response(ext_fields={"msgId": "M"})

    dispatcher.register(RequestCode.SEND_MESSAGE_V2, send)
    dispatcher.register(RequestCode.HEART_BEAT, lambda conn, cmd: cmd.response(remark="hb"))
    server = await Server.start("127.0.0.1", 0, dispatcher)
    conn = await connect("127.0.0.1", server.port)
    try:
        resp = await conn.request(RemotingCommand.request(9999), timeout=5)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert resp.remark == " request type 9999 not supported"
        assert (await conn.request(RemotingCommand.request(310), timeout=5)).ext_fields == {"msgId": "M"}
        assert (await conn.request(RemotingCommand.request(34), timeout=5)).remark == "hb"
        assert dispatcher.codes == {310, 34}
    finally:
        conn.close()
        await server.close()


async def test_unknown_oneway_code_gets_no_answer() -> None:
    server = await Server.start("127.0.0.1", 0, Dispatcher({34: lambda conn, cmd: cmd.response()}))
    raw = await RawClient.open(server.port)
    try:
        await raw.send_command(RemotingCommand(code=4242, opaque=1, flag=2))
        await raw.send_command(RemotingCommand(code=34, opaque=2))
        assert (await raw.read_command()).opaque == 2
    finally:
        raw.close()
        await server.close()


def test_hooks_run_first_and_can_answer() -> None:
    calls: list[str] = []
    dispatcher = Dispatcher(default=lambda conn, cmd: calls.append("default") or cmd.response(remark="default"))
    dispatcher.register(10, lambda conn, cmd: calls.append("send") or cmd.response())

    def acl(conn: object, cmd: RemotingCommand) -> RemotingCommand | None:
        calls.append("acl")
        if cmd.ext_fields.get("AccessKey") == "bad":
            return cmd.response(ResponseCode.SYSTEM_ERROR, "AclException: no permission")
        return None

    dispatcher.add_hook(acl)
    denied = dispatcher(None, RemotingCommand(code=10, ext_fields={"AccessKey": "bad"}))  # type: ignore[arg-type]
    assert denied.code == 1 and calls == ["acl"]
    assert dispatcher(None, RemotingCommand(code=10)).code == 0  # type: ignore[arg-type]
    assert dispatcher(None, RemotingCommand(code=77)).remark == "default"  # type: ignore[arg-type]
    assert calls == ["acl", "acl", "send", "acl", "default"]


async def test_hook_exception_answers_system_error() -> None:
    dispatcher = Dispatcher({10: lambda conn, cmd: cmd.response()})

    def hook(conn: Connection, cmd: RemotingCommand) -> None:
        raise PermissionError("Check signature failed for accessKey=RocketMQ")

    dispatcher.add_hook(hook)
    server = await Server.start("127.0.0.1", 0, dispatcher)
    conn = await connect("127.0.0.1", server.port)
    try:
        resp = await conn.request(RemotingCommand.request(10), timeout=5)
        assert resp.code == 1 and resp.remark == "Check signature failed for accessKey=RocketMQ"
    finally:
        conn.close()
        await server.close()
