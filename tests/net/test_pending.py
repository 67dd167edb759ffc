"""Pending: a response to come without a future. Its callbacks run at once, in order, and a connection answers a
handler's Pending when it is settled, counting it in flight until then."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from txmq.errors import ConnectionClosedError
from txmq.net import Connection, Server, connect
from txmq.net.pending import Pending
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.testing import aeventually

pytestmark = pytest.mark.timeout(30)


def test_callbacks_run_at_once_in_order_and_only_once() -> None:
    seen: list[tuple[str, Any, Any]] = []
    pending = Pending()
    pending.then(lambda r, e: seen.append(("first", r, e)))
    pending.then(lambda r, e: seen.append(("second", r, e)))
    assert not pending.done and seen == []
    pending.resolve("answer")
    assert seen == [("first", "answer", None), ("second", "answer", None)]
    pending.resolve("again")  # ignored, as is a later failure
    pending.fail(RuntimeError("late"))
    assert pending.done and pending.response == "answer" and pending.error is None
    pending.then(lambda r, e: seen.append(("after", r, e)))  # added once settled: called at once
    assert seen[-1] == ("after", "answer", None) and len(seen) == 3


def test_failure_reaches_every_callback_and_one_callback_failing_does_not_stop_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[Any] = []
    error = ValueError("no disk")

    def broken(_r: Any, _e: Any) -> None:
        raise KeyError("bug")

    pending = Pending()
    pending.then(broken)
    pending.then(lambda r, e: seen.append((r, e)))
    with caplog.at_level(logging.ERROR, logger="txmq.net"):
        pending.fail(error)
    assert seen == [(None, error)]
    assert any("callback" in r.getMessage() for r in caplog.records)
    pending.resolve("late")
    assert pending.error is error and pending.response is None


async def test_as_future_for_code_that_awaits() -> None:
    pending = Pending()
    future = pending.as_future()
    assert not future.done()
    pending.resolve(7)
    assert await future == 7
    failed = Pending()
    failed.fail(RuntimeError("x"))
    with pytest.raises(RuntimeError):
        await failed.as_future()


async def test_connection_answers_a_pending_when_settled_and_counts_it_in_flight() -> None:
    answers: list[tuple[RemotingCommand, Pending]] = []

    def handler(conn: Connection, cmd: RemotingCommand) -> Pending:
        pending = Pending()
        answers.append((cmd, pending))
        return pending

    server = await Server.start("127.0.0.1", 0, handler, max_in_flight=4)
    client = await connect("127.0.0.1", server.port)
    try:
        tasks = [
            asyncio.ensure_future(client.request(RemotingCommand.request(10, body=b"%d" % i), timeout=10))
            for i in range(10)
        ]
        await aeventually(lambda: len(server.connections) == 1)
        (conn,) = server.connections
        await aeventually(lambda: conn.reading_paused)
        await aeventually(lambda: len(answers) == 4)
        await asyncio.sleep(0.1)
        assert len(answers) == 4 and conn.in_flight == 4  # the cap holds the rest back, as for futures
        served = 0
        while served < 10:
            await aeventually(lambda n=served: len(answers) > n)  # type: ignore[misc]
            cmd, pending = answers[served]
            if served == 3:
                pending.fail(OSError("the store failed"))
            elif served == 5:
                pending.resolve(42)  # not a response
            else:
                pending.resolve(cmd.response(body=cmd.body))
            served += 1
        responses = await asyncio.gather(*tasks)
        for i, response in enumerate(responses):
            if i == 3:
                assert response.code == ResponseCode.SYSTEM_ERROR and response.remark == "the store failed"
            elif i == 5:
                assert response.code == ResponseCode.SYSTEM_ERROR and "int" in (response.remark or "")
            else:
                assert response.code == ResponseCode.SUCCESS and response.body == b"%d" % i
        assert conn.in_flight == 0
        await aeventually(lambda: not conn.reading_paused)
    finally:
        client.close()
        await server.close()


async def test_a_pending_settled_after_the_connection_closed_is_dropped() -> None:
    held: list[Pending] = []

    def handler(conn: Connection, cmd: RemotingCommand) -> Pending:
        held.append(Pending())
        return held[-1]

    server = await Server.start("127.0.0.1", 0, handler)
    client = await connect("127.0.0.1", server.port)
    try:
        request = asyncio.ensure_future(client.request(RemotingCommand.request(10), timeout=10))
        await aeventually(lambda: len(held) == 1)
        (conn,) = server.connections
        client.close()
        await aeventually(lambda: conn.closed)
        held[0].resolve(RemotingCommand(code=0))  # nothing to write to: no error, nothing sent
        assert conn.in_flight == 0
        with pytest.raises(ConnectionClosedError):
            await request
    finally:
        await server.close()
