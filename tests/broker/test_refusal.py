"""BrokerRefusal is answered in one place: the wrapper every broker handler is registered through."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from txmq.broker.refusal import BrokerRefusal, answering_refusals
from txmq.protocol.frame import RemotingCommand

REQUEST = RemotingCommand(code=10, opaque=7)


def test_a_refusal_raised_at_once_is_the_response() -> None:
    def handler(_conn: Any, _cmd: RemotingCommand) -> RemotingCommand:
        raise BrokerRefusal(17, "topic[T] not exist, apply first please!")

    answer = answering_refusals(handler)(None, REQUEST)
    assert (answer.code, answer.remark, answer.opaque) == (17, "topic[T] not exist, apply first please!", 7)


async def test_a_refusal_raised_by_a_coroutine_is_the_response() -> None:
    async def handler(_conn: Any, _cmd: RemotingCommand) -> RemotingCommand:
        await asyncio.sleep(0)
        raise BrokerRefusal(1, "[TXMQ] the request body must be a JSON object")

    answer = await answering_refusals(handler)(None, REQUEST)
    assert (answer.code, answer.remark) == (1, "[TXMQ] the request body must be a JSON object")


async def test_answers_and_other_errors_pass_through() -> None:
    ok = REQUEST.response(0)
    assert answering_refusals(lambda _c, _r: ok)(None, REQUEST) is ok
    assert answering_refusals(lambda _c, _r: None)(None, REQUEST) is None
    future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
    assert answering_refusals(lambda _c, _r: future)(None, REQUEST) is future  # no extra future per send

    async def broken(_conn: Any, _cmd: RemotingCommand) -> RemotingCommand:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):  # the connection answers SYSTEM_ERROR and logs it
        await answering_refusals(broken)(None, REQUEST)
