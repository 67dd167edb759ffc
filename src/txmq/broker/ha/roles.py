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
    SLAVE_NOT_AVAILABLE when no slave is in sync (the message is stored either way, as in RocketMQ)."""
    timeout = timeout_ms / 1000

    async def replicated(conn: Any, cmd: RemotingCommand, pending: Any) -> Any:
        try:
            response = await pending if not isinstance(pending, RemotingCommand) else pending
        except BrokerRefusal as refusal:
            return refusal.response(cmd)
        if response is None or response.code != ResponseCode.SUCCESS:
            return response
        outcome = await ha.wait_replicated(store.max_physical_offset(), timeout)
        if outcome is ReplicaWait.PUT_OK:
            return response
        if outcome is ReplicaWait.FENCED:
            return fenced_refusal(cmd, ha.fence_reason() or "fenced while waiting")
        response.code = (
            ResponseCode.FLUSH_SLAVE_TIMEOUT
            if outcome is ReplicaWait.FLUSH_SLAVE_TIMEOUT
            else ResponseCode.SLAVE_NOT_AVAILABLE
        )
        response.remark = (
            f"stored on the master, but no slave confirmed it within {timeout_ms} ms"
            if outcome is ReplicaWait.FLUSH_SLAVE_TIMEOUT
            else "stored on the master, but no slave is in sync (SYNC_MASTER)"
        )
        return response

    def call(conn: Any, cmd: RemotingCommand) -> Any:
        reason = ha.fence_reason()
        if reason:
            return None if cmd.is_oneway else fenced_refusal(cmd, reason)
        result = handler(conn, cmd)
        if result is None or cmd.is_oneway:
            return result
        return asyncio.ensure_future(replicated(conn, cmd, result))

    return call
