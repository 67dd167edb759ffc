"""What a broker's role changes at its 4.x door: a slave refuses writes with RocketMQ's codes, a SYNC_MASTER answers
a send only once a slave has its bytes durably."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from txmq.broker.ha.master import HaMaster, ReplicaWait
from txmq.broker.refusal import BrokerRefusal, Handler
from txmq.net.pending import Pending
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.ha")

# RocketMQ's answer when a put reaches a slave's store (PutMessageStatus.SERVICE_NOT_AVAILABLE).
SLAVE_SEND_REMARK = (
    "service not available now: this broker is a SLAVE (brokerRole=SLAVE), it takes no messages; send to its master"
)


def slave_refusing_sends(cmd: RemotingCommand) -> RemotingCommand:
    return cmd.response(ResponseCode.SERVICE_NOT_AVAILABLE, SLAVE_SEND_REMARK)


def slave_send_handler(_conn: Any, cmd: RemotingCommand) -> RemotingCommand:
    return slave_refusing_sends(cmd)


def slave_end_transaction_handler(_conn: Any, cmd: RemotingCommand) -> RemotingCommand | None:
    """RocketMQ's EndTransactionProcessor on a slave: SLAVE_NOT_AVAILABLE (nothing for a oneway request)."""
    log.warning("END_TRANSACTION reached a slave; refused (the master decides transactions)")
    if cmd.is_oneway:
        return None
    return cmd.response(ResponseCode.SLAVE_NOT_AVAILABLE, "this broker is a SLAVE: end the transaction on its master")


def fenced_refusal(cmd: RemotingCommand, reason: str) -> RemotingCommand:
    """What a fenced master answers (RocketMQ 5's fenced store refuses puts as SERVICE_NOT_AVAILABLE)."""
    return cmd.response(
        ResponseCode.SERVICE_NOT_AVAILABLE,
        f"service not available now: this master is fenced ({reason}); it acknowledges nothing until the "
        "controller confirms a master: retry, the route will name the new one",
    )


def refusing_when_fenced(handler: Handler, ha: HaMaster) -> Handler:
    """A master's write handler in controller mode (ASYNC_MASTER sends, END_TRANSACTION, send-backs): refused,
    nothing stored, while the master is fenced."""

    def call(conn: Any, cmd: RemotingCommand) -> Any:
        reason = ha.fence_reason()
        if reason:
            return None if cmd.is_oneway else fenced_refusal(cmd, reason)
        return handler(conn, cmd)

    return call


def waiting_for_slave(handler: Handler, ha: HaMaster, store: MessageStore, timeout_ms: int) -> Handler:
    """A SYNC_MASTER send handler: once the send is stored, wait until a slave has the log durably up to the end
    the store had then; answer FLUSH_SLAVE_TIMEOUT when it does not within ``syncFlushTimeout``, and
    SLAVE_NOT_AVAILABLE when no slave is in sync (the message is stored either way, as in RocketMQ)."""
    return WaitingForSlave(handler, ha, store, timeout_ms)


class WaitingForSlave:
    """:func:`waiting_for_slave`'s handler. Per send: the answer to come (a :class:`Pending`), and a wait in the
    master's :class:`~txmq.ha.waits.ReplicaWaits` that settles it (no task, no timer and no future per send; classes
    rather than closures, since this module is compiled: setup.py ``HOT_MODULES``)."""

    def __init__(self, handler: Handler, ha: HaMaster, store: MessageStore, timeout_ms: int) -> None:
        self.handler = handler
        self.ha = ha
        self.store = store
        self.timeout_ms = timeout_ms
        self.timeout = timeout_ms / 1000

    def __call__(self, conn: Any, cmd: RemotingCommand) -> Any:
        reason = self.ha.fence_reason()
        if reason:
            return None if cmd.is_oneway else fenced_refusal(cmd, reason)
        result = self.handler(conn, cmd)
        if result is None or cmd.is_oneway:
            return result
        out = Pending()
        if isinstance(result, RemotingCommand):
            self.replicated(cmd, result, out)
        elif type(result) is Pending:
            result.then(_StoredThen(self, cmd, out))
        else:
            asyncio.ensure_future(result).add_done_callback(_Stored(self, cmd, out))
        return out

    def replicated(self, cmd: RemotingCommand, response: Any, out: Pending) -> None:
        """The send is stored (``response``): answer ``out`` once the slave has it."""
        if response is None or response.code != ResponseCode.SUCCESS:
            out.resolve(response)
            return
        outcome = self.ha.when_replicated(
            self.store.max_physical_offset(), self.timeout, _Answer(self, cmd, response, out)
        )
        if outcome is not None:
            out.resolve(self.answer(cmd, response, outcome))

    def answer(self, cmd: RemotingCommand, response: RemotingCommand, outcome: ReplicaWait) -> RemotingCommand:
        ha = self.ha
        if outcome is ReplicaWait.PUT_OK and ha.fence_reason():
            outcome = ReplicaWait.FENCED
        if outcome is ReplicaWait.PUT_OK:
            return response
        if outcome is ReplicaWait.FENCED:
            return fenced_refusal(cmd, ha.fence_reason() or "fenced while waiting")
        timed_out = outcome is ReplicaWait.FLUSH_SLAVE_TIMEOUT
        response.code = ResponseCode.FLUSH_SLAVE_TIMEOUT if timed_out else ResponseCode.SLAVE_NOT_AVAILABLE
        response.remark = (
            f"stored on the master, but no slave confirmed it within {self.timeout_ms} ms"
            if timed_out
            else "stored on the master, but no slave is in sync (SYNC_MASTER)"
        )
        return response


class _StoredThen:
    """The store has answered a send (its :class:`Pending`): on to the wait for the slave."""

    def __init__(self, owner: WaitingForSlave, cmd: RemotingCommand, out: Pending) -> None:
        self.owner = owner
        self.cmd = cmd
        self.out = out

    def __call__(self, response: Any, error: BaseException | None) -> None:
        if error is not None:
            self.out.fail(error)
        else:
            self.owner.replicated(self.cmd, response, self.out)


class _Stored:
    """The store has answered a send (``pending``, the future of a coroutine handler): on to the wait for the
    slave."""

    def __init__(self, owner: WaitingForSlave, cmd: RemotingCommand, out: Pending) -> None:
        self.owner = owner
        self.cmd = cmd
        self.out = out

    def __call__(self, pending: asyncio.Future[Any]) -> None:
        out = self.out
        if out.done:
            return
        if pending.cancelled():
            out.fail(asyncio.CancelledError())
            return
        exc = pending.exception()
        if isinstance(exc, BrokerRefusal):
            out.resolve(exc.response(self.cmd))
        elif exc is not None:
            out.fail(exc)
        else:
            self.owner.replicated(self.cmd, pending.result(), out)


class _Answer:
    """A send's wait for the slave has ended: answer it."""

    def __init__(self, owner: WaitingForSlave, cmd: RemotingCommand, response: RemotingCommand, out: Pending):
        self.owner = owner
        self.cmd = cmd
        self.response = response
        self.out = out

    def __call__(self, outcome: ReplicaWait) -> None:
        if not self.out.done:
            self.out.resolve(self.owner.answer(self.cmd, self.response, outcome))
