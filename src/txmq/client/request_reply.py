"""Request-reply, as RocketMQ 4.6+'s ``DefaultMQProducer.request`` and ``MessageUtil.createReplyMessage``.

A request is an ordinary message that carries ``CORRELATION_ID``, ``REPLY_TO_CLIENT`` (the requester's client id) and
``TTL``. The consumer that handles it answers with :func:`create_reply`, sent by any producer: the producer sees
``MSG_TYPE=reply`` and uses SEND_REPLY_MESSAGE_V2, and the broker pushes the reply straight to the requester's
connection (PUSH_REPLY_MESSAGE_TO_CLIENT). :class:`ReplyWaiters` (one per client instance) matches it to the waiting
request by its correlation id.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from txmq.client.message import Message, MessageExt, decompress_body
from txmq.errors import MQClientError, RequestTimeoutError
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.record import Prop, SysFlag, decode_properties
from txmq.protocol.topics import reply_topic

if TYPE_CHECKING:
    from txmq.client.instance import ClientInstance

log = logging.getLogger("txmq.client")

REPLY = "reply"  # MSG_TYPE of a reply (MixAll.REPLY_MESSAGE_FLAG)


def create_reply(request: MessageExt, body: bytes) -> Message:
    """The reply to ``request`` (a message a consumer got), to be sent with any producer's ``send``."""
    cluster = request.properties.get(Prop.CLUSTER)
    if not cluster:
        raise MQClientError(f"create reply message fail, requestMessage error, property[{Prop.CLUSTER}] is null.")
    reply = Message(reply_topic(cluster), body)
    for key in (Prop.CORRELATION_ID, Prop.REPLY_TO_CLIENT, Prop.TTL):
        value = request.properties.get(key)
        if value is not None:
            reply.properties[key] = value
    reply.properties[Prop.MSG_TYPE] = REPLY
    return reply


def is_reply(msg: Message) -> bool:
    return msg.properties.get(Prop.MSG_TYPE) == REPLY


def mark_request(msg: Message, client_id: str, timeout: float) -> str:
    """Stamp ``msg`` as a request from ``client_id``; returns its correlation id."""
    correlation_id = str(uuid.uuid4())
    msg.properties[Prop.CORRELATION_ID] = correlation_id
    msg.properties[Prop.REPLY_TO_CLIENT] = client_id
    msg.properties[Prop.TTL] = str(int(timeout * 1000))
    return correlation_id


class ReplyWaiters:
    """The requests of one client instance that wait for their reply, by correlation id."""

    def __init__(self, instance: ClientInstance) -> None:
        self._instance = instance
        self._waiting: dict[str, asyncio.Future[MessageExt]] = {}
        instance.register_request_handler(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, self._on_reply)

    @classmethod
    def of(cls, instance: ClientInstance) -> ReplyWaiters:
        if instance.reply_waiters is None:
            instance.reply_waiters = cls(instance)
        waiters: ReplyWaiters = instance.reply_waiters
        return waiters

    def expect(self, correlation_id: str) -> asyncio.Future[MessageExt]:
        future: asyncio.Future[MessageExt] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        return future

    async def wait(self, correlation_id: str, future: asyncio.Future[MessageExt], timeout: float) -> MessageExt:
        """The reply, or :class:`RequestTimeoutError` after ``timeout`` seconds of the instance's clock."""

        def expire() -> None:
            if not future.done():
                future.set_exception(
                    RequestTimeoutError(f"the request was sent, but no reply came within {timeout:g}s")
                )

        timer = self._instance.clock.call_later(max(timeout, 0.0), expire)
        try:
            return await future
        finally:
            timer.cancel()
            self._waiting.pop(correlation_id, None)

    def forget(self, correlation_id: str) -> None:
        future = self._waiting.pop(correlation_id, None)
        if future is not None and not future.done():
            future.cancel()

    def _on_reply(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        ext = cmd.ext_fields
        try:
            reply = _reply_message(ext, cmd.body, self._instance.clock.now_ms())
        except (ValueError, KeyError) as exc:
            log.warning("a malformed PUSH_REPLY_MESSAGE_TO_CLIENT was ignored: %s", exc)
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"malformed reply: {exc}")
        correlation_id = reply.properties.get(Prop.CORRELATION_ID, "")
        future = self._waiting.get(correlation_id)
        if future is None:
            log.info("a reply for correlation id %r matches no waiting request (it may have timed out)", correlation_id)
        elif not future.done():
            future.set_result(reply)
        return cmd.response(ResponseCode.SUCCESS)


def _host(text: str) -> tuple[str, int]:
    host, _, port = text.lstrip("/").rpartition(":")
    return (host, int(port)) if host else ("", 0)


def _reply_message(ext: dict[str, str], body: bytes, now_ms: int) -> MessageExt:
    sys_flag = int(ext.get("sysFlag") or 0)
    properties = decode_properties(ext.get("properties") or "")
    properties[Prop.REPLY_ARRIVE_TIME] = str(now_ms)
    return MessageExt(
        ext["topic"],
        decompress_body(body, sys_flag) if sys_flag & SysFlag.COMPRESSED else body,
        flag=int(ext.get("flag") or 0),
        properties=properties,
        queue_id=int(ext.get("queueId") or 0),
        sys_flag=sys_flag,
        born_timestamp=int(ext.get("bornTimestamp") or 0),
        born_host=_host(ext.get("bornHost") or ""),
        store_timestamp=int(ext.get("storeTimestamp") or 0),
        store_host=_host(ext.get("storeHost") or ""),
        reconsume_times=int(ext.get("reconsumeTimes") or 0),
    )
