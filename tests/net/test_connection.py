"""Connections over real loopback sockets: request/response, pipelining, oneway, errors, both directions."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from txmq.errors import ConnectError, ConnectionClosedError, RemotingError, RequestTimeoutError
from txmq.net import Connection, Server, connect
from txmq.net.connection import _address
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand, encode_frame
from txmq.testing import FakeClock, aeventually

from .conftest import RawClient

pytestmark = pytest.mark.timeout(30)


async def test_request_response(echo_server: Server) -> None:
    conn = await connect("127.0.0.1", echo_server.port)
    try:
        req = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "G", "b": "T"}, b"hello")
        resp = await conn.request(req, timeout=5)
        assert resp.is_response and resp.code == ResponseCode.SUCCESS
        assert resp.opaque == req.opaque
        assert resp.ext_fields == {"a": "G", "b": "T"} and resp.body == b"hello"
        assert conn.pending_requests == 0
        assert conn.peer == ("127.0.0.1", echo_server.port)
        assert conn.local[0] == "127.0.0.1"
        await aeventually(lambda: len(echo_server.connections) == 1)
        (server_side,) = echo_server.connections
        assert server_side.peer == conn.local and server_side.local == conn.peer
    finally:
        conn.close()


async def test_binary_request_gets_a_binary_response(echo_server: Server) -> None:
    raw = await RawClient.open(echo_server.port)
    try:
        req = RemotingCommand(code=34, opaque=77, ext_fields={"k": "v"}, serialize_type=1)
        await raw.send_command(req)
        resp = await raw.read_command()
        assert (resp.opaque, resp.flag, resp.serialize_type, resp.ext_fields) == (77, 1, 1, {"k": "v"})
    finally:
        raw.close()


async def test_concurrent_requests_answered_out_of_order() -> None:
    gates: dict[int, asyncio.Event] = {}
    finished: list[int] = []

    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        index = int(cmd.ext_fields["i"])
        await gates[index].wait()
        finished.append(index)
        return cmd.response(ext_fields={"i": str(index)}, body=cmd.body)

    n = 50
    gates.update({i: asyncio.Event() for i in range(n)})
    server = await Server.start("127.0.0.1", 0, handler)
    conn = await connect("127.0.0.1", server.port)
    try:
        tasks = [
            asyncio.ensure_future(conn.request(RemotingCommand.request(10, {"i": str(i)}, b"%d" % i), timeout=10))
            for i in range(n)
        ]
        (server_side,) = await _server_connections(server, 1)
        await aeventually(lambda: server_side.in_flight == n)  # all handlers run at once: the read loop never waited
        for i in reversed(range(n)):
            gates[i].set()
            await asyncio.sleep(0)
        responses = await asyncio.gather(*tasks)
        assert finished == list(reversed(range(n)))
        for i, resp in enumerate(responses):
            assert resp.ext_fields == {"i": str(i)} and resp.body == b"%d" % i
    finally:
        conn.close()
        await server.close()


async def _server_connections(server: Server, count: int) -> list[Connection]:
    await aeventually(lambda: len(server.connections) == count)
    return list(server.connections)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_oneway_gets_no_response_even_if_the_handler_returns_one(mode: str) -> None:
    seen: list[tuple[int, bool]] = []

    def sync_handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        seen.append((cmd.code, cmd.is_oneway))
        return cmd.response(remark="should not be sent")

    async def async_handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        return sync_handler(conn, cmd)

    server = await Server.start("127.0.0.1", 0, sync_handler if mode == "sync" else async_handler)
    raw = await RawClient.open(server.port)
    try:
        await raw.send_command(RemotingCommand(code=37, opaque=1, flag=2))
        await raw.send_command(RemotingCommand(code=37, opaque=2, flag=2))
        await raw.send_command(RemotingCommand(code=34, opaque=3, flag=0))
        resp = await raw.read_command()
        assert resp.opaque == 3  # nothing came back for opaques 1 and 2
        assert seen == [(37, True), (37, True), (34, False)]
        # and nothing is queued behind it either
        await raw.send_command(RemotingCommand(code=34, opaque=4))
        assert (await raw.read_command()).opaque == 4
    finally:
        raw.close()
        await server.close()


async def test_send_oneway_sets_the_flag_and_needs_no_answer() -> None:
    received: asyncio.Queue[RemotingCommand] = asyncio.Queue()

    def handler(conn: Connection, cmd: RemotingCommand) -> None:
        received.put_nowait(cmd)

    server = await Server.start("127.0.0.1", 0, handler)
    conn = await connect("127.0.0.1", server.port)
    try:
        conn.send_oneway(RemotingCommand(code=RequestCode.END_TRANSACTION, ext_fields={"x": "1"}))
        cmd = await asyncio.wait_for(received.get(), 5)
        assert cmd.code == 37 and cmd.flag == 2 and cmd.ext_fields == {"x": "1"}
    finally:
        conn.close()
        await server.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_handler_exception_answers_system_error_and_keeps_the_connection(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    def sync_handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        nonlocal calls
        calls += 1
        if cmd.code == 666:
            raise ValueError("topic name is not allowed")
        return cmd.response()

    async def async_handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(0)
        return sync_handler(conn, cmd)

    server = await Server.start("127.0.0.1", 0, sync_handler if mode == "sync" else async_handler)
    conn = await connect("127.0.0.1", server.port)
    try:
        with caplog.at_level(logging.ERROR, logger="txmq.net"):
            resp = await conn.request(RemotingCommand.request(666), timeout=5)
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark == "topic name is not allowed"
        assert any("handler failed on request code 666" in r.getMessage() for r in caplog.records)
        # A oneway request that fails gets no answer; the next request proves the connection still works.
        conn.send_oneway(RemotingCommand(code=666))
        resp = await conn.request(RemotingCommand.request(34), timeout=5)
        assert resp.code == ResponseCode.SUCCESS and not conn.closed
        assert calls == 3
    finally:
        conn.close()
        await server.close()


async def test_handler_returning_garbage_answers_system_error() -> None:
    server = await Server.start("127.0.0.1", 0, lambda conn, cmd: 42)
    conn = await connect("127.0.0.1", server.port)
    try:
        resp = await conn.request(RemotingCommand.request(34), timeout=5)
        assert resp.code == 1 and "int" in (resp.remark or "")
    finally:
        conn.close()
        await server.close()


async def test_unencodable_response_becomes_system_error() -> None:
    server = await Server.start("127.0.0.1", 0, lambda conn, cmd: cmd.response(remark="\ud800"))
    conn = await connect("127.0.0.1", server.port)
    try:
        resp = await conn.request(RemotingCommand.request(34), timeout=5)
        assert resp.code == 1 and "could not be encoded" in (resp.remark or "")
    finally:
        conn.close()
        await server.close()


async def test_server_sends_requests_to_the_client_on_its_own_connection() -> None:
    server_side: list[Connection] = []

    def broker(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        server_side.append(conn)
        return cmd.response()

    checks: asyncio.Queue[RemotingCommand] = asyncio.Queue()

    def producer(conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            checks.put_nowait(cmd)
            return None
        return cmd.response(ext_fields={"clientId": "c1"}, body=b"running-info")

    server = await Server.start("127.0.0.1", 0, broker)
    client = await connect("127.0.0.1", server.port, producer)
    try:
        await client.request(RemotingCommand.request(RequestCode.HEART_BEAT), timeout=5)
        conn = server_side[0]
        resp = await conn.request(RemotingCommand.request(RequestCode.GET_CONSUMER_RUNNING_INFO), timeout=5)
        assert resp.ext_fields == {"clientId": "c1"} and resp.body == b"running-info"
        conn.send_oneway(
            RemotingCommand(code=RequestCode.CHECK_TRANSACTION_STATE, ext_fields={"tranStateTableOffset": "5"})
        )
        check = await asyncio.wait_for(checks.get(), 5)
        assert check.is_oneway and check.ext_fields == {"tranStateTableOffset": "5"}
    finally:
        client.close()
        await server.close()


async def test_client_without_handler_answers_not_supported() -> None:
    server_side: list[Connection] = []
    server = await Server.start("127.0.0.1", 0, lambda conn, cmd: server_side.append(conn) or cmd.response())
    client = await connect("127.0.0.1", server.port)
    try:
        await client.request(RemotingCommand.request(34), timeout=5)
        resp = await server_side[0].request(RemotingCommand.request(307), timeout=5)
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        assert resp.remark == " request type 307 not supported"
    finally:
        client.close()
        await server.close()


async def test_request_timeout_with_a_fake_clock() -> None:
    never: asyncio.Event = asyncio.Event()

    async def silent(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        await never.wait()
        return cmd.response(remark="late")

    clock = FakeClock()
    server = await Server.start("127.0.0.1", 0, silent)
    conn = await connect("127.0.0.1", server.port, clock=clock)
    try:
        task = asyncio.ensure_future(conn.request(RemotingCommand.request(10), timeout=3))
        await clock.advance(2.9)
        assert not task.done()
        await clock.advance(0.2)
        with pytest.raises(RequestTimeoutError, match=r"request code 10 .* within 3s") as info:
            await task
        assert isinstance(info.value, RemotingError)
        assert conn.pending_requests == 0
        # The late response is dropped and the connection stays usable.
        never.set()
        conn2 = await connect("127.0.0.1", server.port)
        try:
            assert (await conn2.request(RemotingCommand.request(10), timeout=5)).remark == "late"
        finally:
            conn2.close()
        assert not conn.closed
    finally:
        conn.close()
        await server.close()


async def test_requests_with_different_timeouts_expire_each_at_its_own_deadline() -> None:
    """One sweep timer serves every request: a later request with a shorter timeout still fails first, answered
    requests are forgotten, and nothing stays armed once nothing waits."""
    release: dict[str, asyncio.Event] = {"answer": asyncio.Event()}

    async def handler(conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
        if cmd.ext_fields.get("answer") == "yes":
            await release["answer"].wait()
            return cmd.response(remark="answered")
        await asyncio.Event().wait()  # never
        raise AssertionError

    clock = FakeClock()
    server = await Server.start("127.0.0.1", 0, handler)
    conn = await connect("127.0.0.1", server.port, clock=clock)
    try:
        slow = asyncio.ensure_future(conn.request(RemotingCommand.request(11), timeout=10))
        answered = asyncio.ensure_future(conn.request(RemotingCommand.request(12, {"answer": "yes"}), timeout=5))
        await asyncio.sleep(0.05)
        quick = asyncio.ensure_future(conn.request(RemotingCommand.request(13), timeout=2))
        await asyncio.sleep(0.05)
        release["answer"].set()
        assert (await answered).remark == "answered"
        await clock.advance(1.9)
        assert not quick.done() and not slow.done()
        await clock.advance(0.2)
        with pytest.raises(RequestTimeoutError, match=r"request code 13 .* within 2s"):
            await quick
        assert not slow.done()
        await clock.advance(7.0)  # 9.1 s in: the answered request's 5 s passed without effect
        assert not slow.done()
        await clock.advance(1.0)
        with pytest.raises(RequestTimeoutError, match=r"request code 11 .* within 10s"):
            await slow
        assert conn.pending_requests == 0 and conn._sweep is None
    finally:
        conn.close()
        await server.close()


async def test_connection_closed_while_waiting() -> None:
    def hang_up(conn: Connection, cmd: RemotingCommand) -> None:
        conn.close("bye")

    server = await Server.start("127.0.0.1", 0, hang_up)
    conn = await connect("127.0.0.1", server.port)
    closed: list[Connection] = []
    conn.add_close_callback(closed.append)
    try:
        with pytest.raises(ConnectionClosedError):
            await conn.request(RemotingCommand.request(10), timeout=5)
        assert conn.closed and closed == [conn]
        with pytest.raises(ConnectionClosedError):
            await conn.request(RemotingCommand.request(10), timeout=5)
        with pytest.raises(ConnectionClosedError):
            conn.send_oneway(RemotingCommand(code=37))
        conn.send_response(RemotingCommand(code=0, flag=1))  # no-op, no error
        late: list[Connection] = []
        conn.add_close_callback(late.append)
        assert late == [conn]
    finally:
        await server.close()


async def test_local_close_fails_waiting_requests() -> None:
    async def slow(conn: Connection, cmd: RemotingCommand) -> None:
        await asyncio.sleep(3600)

    server = await Server.start("127.0.0.1", 0, slow)
    conn = await connect("127.0.0.1", server.port)
    try:
        tasks = [asyncio.ensure_future(conn.request(RemotingCommand.request(10), timeout=60)) for _ in range(5)]
        await aeventually(lambda: conn.pending_requests == 5)
        conn.close("client shutting down")
        for task in tasks:
            with pytest.raises(ConnectionClosedError, match="client shutting down"):
                await task
        await conn.wait_closed()
    finally:
        await server.close()


async def test_server_close_closes_its_connections() -> None:
    server = await Server.start("127.0.0.1", 0, lambda conn, cmd: cmd.response())
    clients = [await connect("127.0.0.1", server.port) for _ in range(3)]
    await aeventually(lambda: len(server.connections) == 3)
    await server.close()
    assert not server.connections
    for client in clients:
        await aeventually(lambda c=client: c.closed)
    with pytest.raises(ConnectError):
        await connect("127.0.0.1", clients[0].peer[1])


async def test_connect_refused() -> None:
    server = await Server.start("127.0.0.1", 0, lambda conn, cmd: None)
    port = server.port
    await server.close()
    with pytest.raises(ConnectError, match=f"127.0.0.1:{port}"):
        await connect("127.0.0.1", port)


async def test_close_callbacks_run_once_and_failures_are_contained(caplog: pytest.LogCaptureFixture) -> None:
    server = await Server.start("127.0.0.1", 0, lambda conn, cmd: cmd.response())
    conn = await connect("127.0.0.1", server.port)
    calls: list[str] = []
    conn.add_close_callback(lambda c: calls.append("a"))
    conn.add_close_callback(lambda c: 1 / 0)
    conn.add_close_callback(lambda c: calls.append("c"))
    conn.attributes["clientId"] = "x"
    conn.close()
    conn.close()
    await conn.wait_closed()
    assert calls == ["a", "c"]
    assert conn.attributes == {"clientId": "x"}
    await server.close()


def test_address_normalises_ipv4_mapped_ipv6() -> None:
    assert _address(("::ffff:10.0.0.7", 1234, 0, 0)) == ("10.0.0.7", 1234)
    assert _address(("::1", 1234, 0, 0)) == ("::1", 1234)
    assert _address(("127.0.0.1", 80)) == ("127.0.0.1", 80)
    assert _address(None) == ("", 0)


async def test_dual_stack_listener_reports_ipv4_peers() -> None:
    # asyncio makes "::" listeners IPv6-only, so build a dual-stack socket by hand, as a deployment could.
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
    except OSError:
        pytest.skip("no IPv6 on this machine")
    sock.listen()
    port = sock.getsockname()[1]
    loop = asyncio.get_running_loop()
    accepted: list[Connection] = []
    server = await loop.create_server(
        lambda: Connection(
            lambda conn, cmd: cmd.response(remark=f"{conn.peer[0]}|{conn.local[0]}"), on_open=accepted.append
        ),
        sock=sock,
    )
    conn = await connect("127.0.0.1", port)
    try:
        resp = await conn.request(RemotingCommand.request(34), timeout=5)
        assert resp.remark == "127.0.0.1|127.0.0.1"
    finally:
        conn.close()
        server.close()
        for connection in accepted:
            await connection.wait_closed()


async def test_nothing_is_served_after_a_handler_closes_the_connection() -> None:
    calls: list[int] = []

    def handler(conn: Connection, cmd: RemotingCommand) -> None:
        calls.append(cmd.opaque)
        conn.close("done")

    server = await Server.start("127.0.0.1", 0, handler)
    raw = await RawClient.open(server.port)
    try:
        await raw.send(b"".join(encode_frame(RemotingCommand(code=10, opaque=i)) for i in range(3)))
        assert await raw.read_eof() == b""
        assert calls == [0]
    finally:
        raw.close()
        await server.close()
