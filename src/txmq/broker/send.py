"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320)."""

from __future__ import annotations

import functools
import logging
import random
import zlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from txmq.broker.refusal import BrokerRefusal
from txmq.broker.schedule import PROP_DLQ_REASON, reconsume_limit
from txmq.broker.stored import answer_when_stored, send_response
from txmq.broker.topics import (
    AUTO_CREATE_TOPIC_KEY,
    NOT_ALLOWED_SEND_TOPICS,
    PERM_READ,
    PERM_WRITE,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicConfig,
    dlq_topic,
    validate_topic,
)
from txmq.errors import ProtocolError
from txmq.net.pending import Pending
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import SendMessageRequestHeader
from txmq.protocol.record import (
    TRANSACTION_MASK,
    MessageRecord,
    Prop,
    SysFlag,
    decode_batch,
    decode_properties,
    encode_offset_msg_id,
    normalize_host,
)

if TYPE_CHECKING:
    from txmq.broker.config import BrokerConfig
    from txmq.broker.schedule import ScheduleService
    from txmq.broker.subscriptions import SubscriptionGroupManager
    from txmq.broker.topics import TopicConfigManager
    from txmq.broker.txn import TransactionService
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker")


class SendProcessor:
    def __init__(
        self,
        *,
        config: BrokerConfig,
        store_host: tuple[str, int],
        store: MessageStore,
        topics: TopicConfigManager,
        subscriptions: SubscriptionGroupManager,
        transactions: TransactionService,
        schedule: ScheduleService,
        topic_changed: Callable[[], None],
        requester_seen: Callable[[str, Any], None] | None = None,
    ) -> None:
        self.config = config
        self.store_host = store_host
        self.store = store
        self.topics = topics
        self.subscriptions = subscriptions
        self.transactions = transactions
        self.schedule = schedule
        self.topic_changed = topic_changed
        self.requester_seen = requester_seen
        self._random = random.Random()

    def handle(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | Pending | Awaitable[RemotingCommand]:
        """Refuse at once (:class:`BrokerRefusal`); otherwise return the response to come (:class:`Pending`), without
        a task or a future per message."""
        try:
            header = SendMessageRequestHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        if header.batch:
            return self._send_batch(conn, cmd, header)
        return self._send_one(conn, cmd, header)

    # -- checks shared by single and batch sends ---------------------------------------------------------------------

    def _check_topic(self, header: SendMessageRequestHeader) -> TopicConfig:
        return self.check_topic(header.topic, header.queueId, header.defaultTopic, header.defaultTopicQueueNums)

    def check_topic(
        self, topic: str, queue_id: int = -1, template: str = AUTO_CREATE_TOPIC_KEY, template_queue_nums: int = 4
    ) -> TopicConfig:
        """The config of a topic a message may be stored on (auto-created from ``template`` when allowed), or
        :class:`BrokerRefusal`. Door-neutral: the gRPC door calls it too."""
        config = self.config
        if not config.broker_permission & PERM_WRITE:
            raise BrokerRefusal(
                ResponseCode.NO_PERMISSION, f"the broker[{config.broker_name}] sending message is forbidden"
            )
        problem = validate_topic(topic)
        if problem is not None:
            raise BrokerRefusal(ResponseCode.SYSTEM_ERROR, problem)
        if topic in NOT_ALLOWED_SEND_TOPICS:
            raise BrokerRefusal(ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")
        cfg = self.topics.get(topic)
        if cfg is None:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                cfg, _ = self.topics.ensure(topic, 1, PERM_READ | PERM_WRITE)
            elif config.auto_create_topic_enable:
                cfg = self.topics.create_from_template(topic, template, template_queue_nums)
            if cfg is None:
                raise BrokerRefusal(
                    ResponseCode.TOPIC_NOT_EXIST,
                    f"topic[{topic}] not exist, apply first please! (autoCreateTopicEnable="
                    f"{str(config.auto_create_topic_enable).lower()})",
                )
            self.topic_changed()
        if not cfg.writable:
            raise BrokerRefusal(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        if queue_id >= cfg.queue_count:
            raise BrokerRefusal(
                ResponseCode.SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, topic: {topic} queue count: {cfg.queue_count}",
            )
        return cfg

    def check_body_size(self, size: int) -> None:
        if size > self.config.max_message_size:
            raise BrokerRefusal(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the message body size {size} is over the limit {self.config.max_message_size}",
            )

    def _pick_queue(self, header: SendMessageRequestHeader, cfg: TopicConfig) -> int:
        if header.queueId < 0:
            return self._random.randrange(max(1, cfg.write_queue_nums))
        return header.queueId

    def born_host(self, conn: Any) -> tuple[str, int]:
        peer = getattr(conn, "peer", None) or ("127.0.0.1", 0)
        host = normalize_host((peer[0], int(peer[1])))
        return host if ":" not in host[0] else ("127.0.0.1", host[1])

    def _sys_flag(self, header: SendMessageRequestHeader, cfg: TopicConfig) -> int:
        flag = header.sysFlag
        if cfg.topic_filter_type == "MULTI_TAG":
            flag |= SysFlag.MULTI_TAGS
        return flag

    def _retry_redirect(
        self, header: SendMessageRequestHeader, topic: str, queue_id: int, version: int = 0
    ) -> tuple[str, int]:
        """A direct send to ``%RETRY%group`` past the group's limit goes to ``%DLQ%group`` instead."""
        if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return topic, queue_id
        group = topic[len(RETRY_GROUP_TOPIC_PREFIX) :]
        sub = self.subscriptions.get(group)
        if sub is None:
            raise BrokerRefusal(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
        max_times = reconsume_limit(version, header.maxReconsumeTimes, sub)
        if (header.reconsumeTimes or 0) >= max_times:
            dlq = dlq_topic(group)
            self.topics.ensure(dlq, 1, PERM_READ | PERM_WRITE)
            self.topic_changed()
            log.info("message to %s reached %d reconsumes: sent to %s", topic, max_times, dlq)
            return dlq, 0
        return topic, queue_id

    # -- single ------------------------------------------------------------------------------------------------------

    def _send_one(self, conn: Any, cmd: RemotingCommand, header: SendMessageRequestHeader) -> Pending:
        config = self.config
        cfg = self._check_topic(header)
        queue_id = self._pick_queue(header, cfg)
        response_queue_id = queue_id
        topic, queue_id = self._retry_redirect(header, header.topic, queue_id, cmd.version)
        self.check_body_size(len(cmd.body))
        props = decode_properties(header.properties or "")
        props.pop(Prop.WAIT, None)
        props[Prop.CLUSTER] = config.broker_cluster_name
        requester = props.get(Prop.REPLY_TO_CLIENT)
        if requester is not None and self.requester_seen is not None:
            self.requester_seen(requester, conn)  # request-reply: where the reply will be pushed
        if topic != header.topic:  # redirected to the DLQ: no delay there (wire §2.3 step 5)
            props.pop(Prop.DELAY, None)
            props[PROP_DLQ_REASON] = f"reconsumed {header.reconsumeTimes} times (sent directly to {header.topic})"
        record = MessageRecord(
            topic=topic,
            body=cmd.body,
            queue_id=queue_id,
            flag=header.flag,
            sys_flag=self._sys_flag(header, cfg),
            born_timestamp=header.bornTimestamp,
            born_host=self.born_host(conn),
            store_host=self.store_host,
            reconsume_times=header.reconsumeTimes or 0,
            properties=props,
        )
        if props.get(Prop.TRAN_MSG, "").lower() == "true":
            return self._prepare(conn, cmd, header, record, response_queue_id)
        if record.sys_flag & TRANSACTION_MASK:
            # Only END_TRANSACTION may write COMMIT or ROLLBACK records (a plain int test: no enum per message).
            record.sys_flag &= ~TRANSACTION_MASK
        delay = props.get(Prop.DELAY)
        if delay and delay != "0":
            record = self.schedule.redirect(record, delay)
        return answer_when_stored(
            cmd, self.store, record, response_queue_id, config, self.store_host, None, getattr(conn, "loop", None)
        )

    def _prepare(
        self, conn: Any, cmd: RemotingCommand, header: SendMessageRequestHeader, record: MessageRecord, queue_id: int
    ) -> Pending:
        """A transaction's half message: stored by the transaction driver, answered like a send."""
        config = self.config
        if config.reject_transaction_message:
            raise BrokerRefusal(
                ResponseCode.NO_PERMISSION,
                f"the broker[{config.broker_name}] sending transaction message is forbidden "
                "(rejectTransactionMessage=true)",
            )
        if not record.properties.get(Prop.PGROUP) and header.producerGroup:
            record.properties[Prop.PGROUP] = header.producerGroup
        transactions = self.transactions
        half = transactions.admit(record)
        return answer_when_stored(
            cmd,
            self.store,
            half,
            queue_id,
            config,
            self.store_host,
            functools.partial(transactions.table.half_stored, half),  # compiled: no interpreted call per prepare
            getattr(conn, "loop", None),
        )

    def _inflate(self, body: bytes) -> bytes:
        limit = self.config.max_message_size * 4
        inflater = zlib.decompressobj()
        try:
            out = inflater.decompress(body, limit)
        except zlib.error as exc:
            raise BrokerRefusal(
                ResponseCode.MESSAGE_ILLEGAL, f"the compressed batch body does not inflate: {exc}"
            ) from exc
        if inflater.unconsumed_tail:
            raise BrokerRefusal(ResponseCode.MESSAGE_ILLEGAL, f"the batch inflates to more than {limit} bytes")
        return out

    # -- batch -------------------------------------------------------------------------------------------------------

    async def _send_batch(self, conn: Any, cmd: RemotingCommand, header: SendMessageRequestHeader) -> RemotingCommand:
        config = self.config
        cfg = self._check_topic(header)
        if header.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise BrokerRefusal(ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be sent to a retry topic")
        if header.sysFlag & 0xC:
            raise BrokerRefusal(ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot be transactional")
        body = cmd.body
        sys_flag = self._sys_flag(header, cfg)
        if sys_flag & SysFlag.COMPRESSED:
            # The C++ client zlib-compresses a whole batch body over 4 KiB; entries are stored uncompressed.
            body = self._inflate(body)
            sys_flag &= ~SysFlag.COMPRESSED & ~0x700
        try:
            entries = decode_batch(body)
        except ProtocolError as exc:
            raise BrokerRefusal(ResponseCode.MESSAGE_ILLEGAL, f"the batch body is malformed: {exc}") from exc
        if not entries:
            raise BrokerRefusal(ResponseCode.MESSAGE_ILLEGAL, "the batch is empty")
        queue_id = self._pick_queue(header, cfg)
        batch_props = decode_properties(header.properties or "")
        batch_props.pop(Prop.WAIT, None)
        batch_props[Prop.CLUSTER] = config.broker_cluster_name
        born_host = self.born_host(conn)
        records = []
        for entry in entries:
            if len(entry.body) > config.max_message_size:
                raise BrokerRefusal(ResponseCode.MESSAGE_ILLEGAL, "a message in the batch is over the size limit")
            props = decode_properties(entry.properties)
            if props.get(Prop.DELAY, "0") not in ("", "0"):
                raise BrokerRefusal(ResponseCode.MESSAGE_ILLEGAL, "batch messages cannot carry a delay level")
            props.pop(Prop.WAIT, None)
            props.update(batch_props)
            records.append(
                MessageRecord(
                    topic=header.topic,
                    body=entry.body,
                    queue_id=queue_id,
                    flag=entry.flag,
                    sys_flag=sys_flag,
                    born_timestamp=header.bornTimestamp,
                    born_host=born_host,
                    store_host=self.store_host,
                    reconsume_times=header.reconsumeTimes or 0,
                    properties=props,
                )
            )
        results = await self.store.put_many(records)
        ids = ",".join(encode_offset_msg_id(self.store_host, r.physical_offset) for r in results)
        return send_response(cmd, results[0], queue_id, config, self.store_host, ids)
