"""The answer to a put once the store has it: the response code of a put result, and the send response (a
:class:`~txmq.net.pending.Pending` settled by the store's callback, so a send costs no task and no future)."""

from __future__ import annotations

from asyncio import AbstractEventLoop
from collections.abc import Callable
from typing import Any

from txmq.broker.config import BrokerConfig
from txmq.net.pending import Pending
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.record import MessageRecord, encode_offset_msg_id
from txmq.store.message_store import MessageStore, PutStatus


def put_status_code(result: Any) -> int:
    """The response code of a store put result."""
    status = result.status
    if status is PutStatus.PUT_OK:
        return ResponseCode.SUCCESS
    if status is PutStatus.FLUSH_DISK_TIMEOUT:
        return ResponseCode.FLUSH_DISK_TIMEOUT
    if status in (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED):
        return ResponseCode.MESSAGE_ILLEGAL
    if status is PutStatus.SERVICE_NOT_AVAILABLE:
        return ResponseCode.SERVICE_NOT_AVAILABLE
    return ResponseCode.SYSTEM_ERROR


def send_response(
    cmd: RemotingCommand,
    result: Any,
    queue_id: int,
    config: BrokerConfig,
    store_host: tuple[str, int],
    msg_ids: str | None = None,
) -> RemotingCommand:
    """SEND_MESSAGE's response to a put ``result``: msgId (offsetMsgId), queueId, queueOffset."""
    code = put_status_code(result)
    if code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT):
        remark = getattr(result, "remark", None)
        status = getattr(result, "status", result)
        return cmd.response(code, f"storing the message failed: {status}" + (f": {remark}" if remark else ""))
    ext = {
        "msgId": msg_ids or encode_offset_msg_id(store_host, result.physical_offset),
        "queueId": str(queue_id),
        "queueOffset": str(result.queue_offset),
        "MSG_REGION": config.region_id,
        "TRACE_ON": "true" if config.trace_on else "false",
    }
    return cmd.response(code, None, ext)


def answer_when_stored(
    cmd: RemotingCommand,
    store: MessageStore,
    record: MessageRecord,
    queue_id: int,
    config: BrokerConfig,
    store_host: tuple[str, int],
    on_stored: Callable[[Any], None] | None = None,
    loop: AbstractEventLoop | None = None,
) -> Pending:
    """Store ``record`` and return the send response to come (settled from the store's callback: no task, no
    future per message); ``on_stored(result)`` runs first when the record was stored. ``loop``: the running loop,
    when the caller has it (the connection's)."""
    answer = Pending()

    def respond(result: Any) -> None:
        if answer.done:
            return
        try:
            if on_stored is not None and result.ok:
                on_stored(result)
            response = send_response(cmd, result, queue_id, config, store_host)
        except Exception as exc:  # answered SYSTEM_ERROR by the connection, not left unanswered
            answer.fail(exc)
            return
        answer.resolve(response)

    store.put_then(record, respond, loop)
    return answer
