"""What a broker's role changes at its 4.x door: a slave refuses writes with RocketMQ's codes, a SYNC_MASTER answers
a send only once a slave has its bytes durably."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from txmq.broker.ha.master import HaMaster, ReplicaWait
from txmq.broker.refusal import BrokerRefusal, Handler
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
    SLAVE_NOT_AVAILABLE when no slave is in sync (the message is stored either way, as in RocketMQ). Chained with
    callbacks, without a task per send (the send path itself answers with futures)."""
    timeout = timeout_ms / 1000

    def answer(cmd: RemotingCommand, response: RemotingCommand, outcome: ReplicaWait) -> RemotingCommand:
        if outcome is ReplicaWait.PUT_OK and ha.fence_reason():
            outcome = ReplicaWait.FENCED
        if outcome is ReplicaWait.PUT_OK:
            return response
        if outcome is ReplicaWait.FENCED:
            return fenced_refusal(cmd, ha.fence_reason() or "fenced while waiting")
        timed_out = outcome is ReplicaWait.FLUSH_SLAVE_TIMEOUT
        response.code = ResponseCode.FLUSH_SLAVE_TIMEOUT if timed_out else ResponseCode.SLAVE_NOT_AVAILABLE
        response.remark = (
            f"stored on the master, but no slave confirmed it within {timeout_ms} ms"
            if timed_out
            else "stored on the master, but no slave is in sync (SYNC_MASTER)"
        )
        return response

    def replicated(cmd: RemotingCommand, response: Any, out: asyncio.Future[Any]) -> None:
        """The send is stored (``response``): answer ``out`` once the slave has it."""
        if response is None or response.code != ResponseCode.SUCCESS:
            out.set_result(response)
            return
        outcome = ha.waiter(store.max_physical_offset(), timeout)
        if isinstance(outcome, ReplicaWait):
            out.set_result(answer(cmd, response, outcome))
            return

        def waited(done: asyncio.Future[ReplicaWait]) -> None:
            if out.done():
                return
            if done.cancelled():
                out.cancel()
            else:
                out.set_result(answer(cmd, response, done.result()))

        outcome.add_done_callback(waited)

    def stored(cmd: RemotingCommand, out: asyncio.Future[Any], pending: asyncio.Future[Any]) -> None:
        if out.done():
            return
        if pending.cancelled():
            out.cancel()
            return
        exc = pending.exception()
        if isinstance(exc, BrokerRefusal):
            out.set_result(exc.response(cmd))
        elif exc is not None:
            out.set_exception(exc)
        else:
            replicated(cmd, pending.result(), out)

    def call(conn: Any, cmd: RemotingCommand) -> Any:
        reason = ha.fence_reason()
        if reason:
            return None if cmd.is_oneway else fenced_refusal(cmd, reason)
        result = handler(conn, cmd)
        if result is None or cmd.is_oneway:
            return result
        out: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if isinstance(result, RemotingCommand):
            replicated(cmd, result, out)
        else:
            pending = asyncio.ensure_future(result)
            pending.add_done_callback(lambda done: stored(cmd, out, done))
        return out

    return call
