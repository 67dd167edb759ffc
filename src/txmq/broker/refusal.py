"""One way to refuse a request: raise :class:`BrokerRefusal`; :func:`answering_refusals` (the wrapper every handler
is registered through) turns it into the response. A request header that does not parse (:class:`HeaderError`: a
required field missing, a number that is not one) is refused the same way, with RocketMQ's SYSTEM_ERROR and the
field named, instead of reaching the connection's last-resort handler as if the broker had a bug."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from txmq.net.pending import Pending
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import HeaderError

Handler = Callable[[Any, RemotingCommand], Any]


class BrokerRefusal(Exception):
    """A request refused with a RocketMQ response code and a remark a person can act on."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark

    def response(self, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(self.code, self.remark)


def answering_refusals(handler: Handler) -> Handler:
    """``handler`` with a :class:`BrokerRefusal` answered as its response, whether raised at once or by the
    coroutine it returns. A returned future or :class:`~txmq.net.pending.Pending` (the send path's answer to come,
    no task per message) passes through untouched: a handler refuses before it returns one."""

    def call(conn: Any, cmd: RemotingCommand) -> Any:
        try:
            result = handler(conn, cmd)
        except BrokerRefusal as refusal:
            return refusal.response(cmd)
        except HeaderError as exc:
            return _bad_header(cmd, exc)
        if result is None or type(result) is Pending or isinstance(result, RemotingCommand | asyncio.Future):
            return result
        return _awaiting(cmd, result)

    return call


async def _awaiting(cmd: RemotingCommand, awaitable: Awaitable[Any]) -> Any:
    try:
        return await awaitable
    except BrokerRefusal as refusal:
        return refusal.response(cmd)
    except HeaderError as exc:
        return _bad_header(cmd, exc)


def _bad_header(cmd: RemotingCommand, exc: HeaderError) -> RemotingCommand:
    # RocketMQ answers a header it cannot decode (RemotingCommandException) with SYSTEM_ERROR and the reason.
    return cmd.response(ResponseCode.SYSTEM_ERROR, f"bad request header: {exc}")
