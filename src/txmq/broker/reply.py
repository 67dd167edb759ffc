"""SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325): RocketMQ's request-reply (4.6 and later).

A requester (``DefaultMQProducer.request``) sends an ordinary message carrying ``CORRELATION_ID``, ``REPLY_TO_CLIENT``
(its client id) and ``TTL``; the broker stamps every stored message with ``CLUSTER``. The consumer that handles it
builds a reply (``MessageUtil.createReplyMessage``: topic ``<cluster>_REPLY_TOPIC``, ``MSG_TYPE=reply``) and sends it
with one of these codes. The broker pushes the reply at once to the requester's connection, found among the producer
connections by ``REPLY_TO_CLIENT``, as PUSH_REPLY_MESSAGE_TO_CLIENT (326), and answers the replier with how that went:
SUCCESS once the requester took it, SYSTEM_ERROR (with the reason) when it is gone or refused it. With
``storeReplyMessageEnable`` (the default, as in RocketMQ) the reply is also stored on the reply topic.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from txmq.broker.stored import send_response
from txmq.clock import Clock
from txmq.errors import ProtocolError
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.record import MessageRecord, Prop, decode_properties, encode_properties

if TYPE_CHECKING:
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.send import SendProcessor
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker")

PUSH_TIMEOUT_SECONDS = 10.0  # RocketMQ's Broker2Client.callClient waits this long for the requester


class ReplyProcessor:
    def __init__(
        self,
        *,
        config: BrokerConfig,
        store_host: tuple[str, int],
        store: MessageStore,
        send: SendProcessor,
        clients: ClientRegistry,
        clock: Clock,
    ) -> None:
        self.config = config
        self.store_host = store_host
        self.store = store
        self.send = send
        self.clients = clients
        self.clock = clock
        self._random = random.Random()

    async def handle(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            header = SendMessageRequestHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        config = self.config
        cfg = self.send.check_topic(header.topic, header.queueId, header.defaultTopic, header.defaultTopicQueueNums)
        self.send.check_body_size(len(cmd.body))
        queue_id = header.queueId if header.queueId >= 0 else self._random.randrange(max(1, cfg.write_queue_nums))
        props = decode_properties(header.properties or "")
        pushed, problem = await self._push(conn, header, props, cmd.body, queue_id)
        stored = None
        if config.store_reply_message_enable:
            props.pop(Prop.WAIT, None)
            record = MessageRecord(
                topic=header.topic,
                body=cmd.body,
                queue_id=queue_id,
                flag=header.flag,
                sys_flag=header.sysFlag,
                born_timestamp=header.bornTimestamp,
                born_host=self.send.born_host(conn),
                store_host=self.store_host,
                reconsume_times=header.reconsumeTimes or 0,
                properties=props,
            )
            result = await self.store.put_future(record)
            if result.ok:
                stored = send_response(cmd, result, queue_id, config, self.store_host)
            else:
                log.warning("storing a reply on %s failed: %s", header.topic, result.status)
        if not pushed:
            return cmd.response(ResponseCode.SYSTEM_ERROR, problem)
        if stored is not None:
            return stored
        # As RocketMQ: an unstored reply's answer names no message ("0", offset 0) so that clients decode it.
        return cmd.response(ResponseCode.SUCCESS, None, {"msgId": "0", "queueId": str(queue_id), "queueOffset": "0"})

    async def _push(
        self, replier: Any, header: SendMessageRequestHeader, props: dict[str, str], body: bytes, queue_id: int
    ) -> tuple[bool, str]:
        """PUSH_REPLY_MESSAGE_TO_CLIENT to the requester; (pushed, why not)."""
        requester = props.get(Prop.REPLY_TO_CLIENT)
        if not requester:
            return False, f"reply message properties[{Prop.REPLY_TO_CLIENT}] is null"
        channel = self.clients.find_producer(requester)
        if channel is None or getattr(channel.connection, "closed", False):
            log.info("a reply for %s has nowhere to go: no connection of that client", requester)
            return False, f"push reply message fail, channel of <{requester}> not found."
        now_ms = self.clock.now_ms()
        pushed_props = {**props, Prop.PUSH_REPLY_TIME: str(now_ms)}
        born = self.send.born_host(replier)
        ext = {
            "producerGroup": header.producerGroup,
            "topic": header.topic,
            "defaultTopic": header.defaultTopic,
            "defaultTopicQueueNums": str(header.defaultTopicQueueNums),
            "queueId": str(queue_id),
            "sysFlag": str(header.sysFlag),
            "bornTimestamp": str(header.bornTimestamp),
            "flag": str(header.flag),
            "properties": encode_properties(pushed_props),
            "reconsumeTimes": str(header.reconsumeTimes or 0),
            "unitMode": "true" if header.unitMode else "false",
            "bornHost": f"{born[0]}:{born[1]}",
            "storeHost": f"{self.store_host[0]}:{self.store_host[1]}",
            "storeTimestamp": str(now_ms),
        }
        try:
            answer = await channel.connection.request(
                RemotingCommand.request(RequestCode.PUSH_REPLY_MESSAGE_TO_CLIENT, ext, body), PUSH_TIMEOUT_SECONDS
            )
        except Exception as exc:  # closed or timed out: the replier hears it, the broker goes on
            log.info("pushing a reply to %s failed: %s", requester, exc)
            return False, f"push reply message to {requester} fail: {exc}"
        if answer.code != ResponseCode.SUCCESS:
            log.info("%s refused a reply: %s %s", requester, answer.code, answer.remark)
            return False, f"push reply message to {requester} fail: {answer.remark or answer.code}"
        return True, ""
