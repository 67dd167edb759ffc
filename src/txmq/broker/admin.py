"""Client, offset, query and admin requests: everything that is neither a send nor a pull."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from txmq.broker.fastjson import mq_key, with_object_map
from txmq.broker.filters import unsupported_remark
from txmq.broker.subscriptions import SubscriptionGroupConfig
from txmq.broker.topics import PERM_READ, PERM_WRITE, TopicConfig, retry_topic, validate_group, validate_topic
from txmq.errors import FilterExpressionError
from txmq.filter import is_tag_type
from txmq.protocol.codes import RequestCode, ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import (
    ConsumerGroupHeader,
    CreateTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    QueryConsumerOffsetRequestHeader,
    QueryMessageRequestHeader,
    QueueHeader,
    SearchOffsetRequestHeader,
    TopicHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    ViewMessageRequestHeader,
)

if TYPE_CHECKING:
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.filters import ConsumerFilters
    from txmq.broker.locks import QueueLockManager
    from txmq.broker.notify import ConsumerIdsNotifier
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.broker.subscriptions import SubscriptionGroupManager
    from txmq.broker.topics import TopicConfigManager
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker")


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


# QUERY_CONSUMER_OFFSET treats a record as "hot" when it is within this share of RAM from the log's end.
HOT_RATIO = 0.40


class AdminProcessor:
    """Handlers keyed by request code; each takes (connection, command) and returns the response."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        store: MessageStore,
        topics: TopicConfigManager,
        subscriptions: SubscriptionGroupManager,
        clients: ClientRegistry,
        offsets: ConsumerOffsetManager,
        locks: QueueLockManager,
        filters: ConsumerFilters,
        notifier: ConsumerIdsNotifier,
        topic_changed: Callable[[], None],
        register_now: Callable[[], Awaitable[None]],
        broker_runtime_info: Callable[[], dict[str, Any]],
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.topics = topics
        self.subscriptions = subscriptions
        self.clients = clients
        self.offsets = offsets
        self.locks = locks
        self.filters = filters
        self.notifier = notifier
        self.topic_changed = topic_changed
        self.register_now = register_now
        self.broker_runtime_info = broker_runtime_info
        self._hot_bytes = int(_physical_memory() * HOT_RATIO)

    def handlers(self) -> dict[int, Any]:
        return {
            RequestCode.HEART_BEAT: self.heartbeat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.consumer_list,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: self.max_offset,
            RequestCode.GET_MIN_OFFSET: self.min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.earliest_store_time,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.create_topic,
            RequestCode.DELETE_TOPIC_IN_BROKER: self.delete_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.all_topic_config,
            RequestCode.GET_TOPIC_STATS_INFO: self.topic_stats,
            RequestCode.GET_CONSUME_STATS: self.consume_stats,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.runtime_info,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.consumer_connections,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.create_subscription_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.all_subscription_groups,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.all_consumer_offsets,
            RequestCode.DELETE_SUBSCRIPTIONGROUP: self.delete_subscription_group,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch,
            RequestCode.CHECK_CLIENT_CONFIG: self.check_client_config,
        }

    # -- clients

    def heartbeat(self, conn: Any, cmd: RemotingCommand) -> Any:
        try:
            data = orjson.loads(cmd.body) if cmd.body else {}
        except orjson.JSONDecodeError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"heartbeat body is not JSON: {exc}")
        if not isinstance(data, dict):
            return cmd.response(ResponseCode.SYSTEM_ERROR, "heartbeat body must be a JSON object")
        result = self.clients.heartbeat(
            conn, data, now=self.clock.monotonic(), language=cmd.language, version=cmd.version
        )
        created = False
        for cdata in data.get("consumerDataSet") or []:
            group = str(cdata.get("groupName") or "")
            sub = self.subscriptions.get(group) if group else None
            if sub is not None and sub.retry_queue_nums > 0:
                _, made = self.topics.ensure(retry_topic(group), sub.retry_queue_nums, PERM_READ | PERM_WRITE)
                created = created or made
        for group in result.changed_groups:
            self.notifier.notify_consumer_ids_changed(group)
        attrs = getattr(conn, "attributes", None)
        if attrs is not None:
            attrs["client_id"] = data.get("clientID")
            if not attrs.get("broker.watched"):
                attrs["broker.watched"] = True
                conn.add_close_callback(self.notifier.connection_closed)
        if created:
            # Java registers a retry topic it made before answering (createTopicInSendMessageBackMethod ->
            # registerBrokerAll), so a client asking for its route next, as the Go client does, finds it.
            return self._answer_once_registered(cmd)
        return cmd.response()

    async def _answer_once_registered(self, cmd: RemotingCommand) -> RemotingCommand:
        await self.register_now()
        return cmd.response()

    def unregister_client(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = UnregisterClientRequestHeader.from_ext(cmd.ext_fields)
        changed = self.clients.unregister(conn, producer_group=h.producerGroup, consumer_group=h.consumerGroup)
        for group in changed:
            self.notifier.notify_consumer_ids_changed(group)
        return cmd.response()

    def consumer_list(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = ConsumerGroupHeader.from_ext(cmd.ext_fields).consumerGroup
        ids = self.clients.consumer_ids(group)
        if not ids:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return cmd.response(body=orjson.dumps({"consumerIdList": ids}))

    def consumer_connections(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = ConsumerGroupHeader.from_ext(cmd.ext_fields).consumerGroup
        info = self.clients.consumers.get(group)
        if info is None or not info.channels:
            return cmd.response(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        body = {
            "connectionSet": [ch.connection_row() for ch in info.channels.values()],
            "subscriptionTable": {
                t: {
                    "topic": s.topic,
                    "subString": s.expression,
                    "tagsSet": sorted(s.tags),
                    "codeSet": sorted(s.codes),
                    "subVersion": s.sub_version,
                    "expressionType": s.expression_type,
                }
                for t, s in info.subscriptions.items()
            },
            "consumeType": info.consume_type,
            "messageModel": info.message_model,
            "consumeFromWhere": info.consume_from_where,
        }
        return cmd.response(body=orjson.dumps(body))

    # -- offsets

    def query_consumer_offset(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
        stored = self.offsets.query(h.consumerGroup, h.topic, h.queueId)
        if stored is not None and stored >= 0:
            return cmd.response(ext_fields={"offset": str(stored)})
        store = self.store
        if store.min_offset(h.topic, h.queueId) <= 0:
            entries = store.read_consume_queue(h.topic, h.queueId, 0, 1)
            if not entries or store.max_physical_offset() - entries[0][0] <= self._hot_bytes:
                # A young queue: a new group starts from 0 even with CONSUME_FROM_LAST_OFFSET, as in RocketMQ.
                return cmd.response(ext_fields={"offset": "0"})
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first"
        )

    def update_consumer_offset(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = UpdateConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
        self.offsets.commit(h.consumerGroup, h.topic, h.queueId, h.commitOffset)
        return cmd.response()

    def max_offset(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueHeader.from_ext(cmd.ext_fields)
        return cmd.response(ext_fields={"offset": str(self.store.max_offset(h.topic, h.queueId))})

    def min_offset(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueHeader.from_ext(cmd.ext_fields)
        return cmd.response(ext_fields={"offset": str(self.store.min_offset(h.topic, h.queueId))})

    def earliest_store_time(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = QueueHeader.from_ext(cmd.ext_fields)
        ts = self.store.earliest_store_time(h.topic, h.queueId)
        return cmd.response(ext_fields={"timestamp": str(ts if ts is not None else -1)})

    def search_offset(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = SearchOffsetRequestHeader.from_ext(cmd.ext_fields)
        offset = self.store.search_offset_by_timestamp(h.topic, h.queueId, h.timestamp)
        return cmd.response(ext_fields={"offset": str(offset)})

    # -- queries

    def query_message(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = QueryMessageRequestHeader.from_ext(cmd.ext_fields)
        max_num = h.maxNum
        if cmd.ext_fields.get("_UNIQUE_KEY_QUERY", "").lower() == "true" or max_num <= 0:
            max_num = self.config.default_query_max_num
        store = self.store
        offsets = store.query_by_key(h.topic, h.key, max_num, h.beginTimestamp, h.endTimestamp)
        chunks = []
        for phys in offsets:
            data = store.read_record(phys)
            if data is not None:
                chunks.append(data)
        ext = {
            "indexLastUpdateTimestamp": str(store.index_last_update_timestamp()),
            "indexLastUpdatePhyoffset": str(store.max_physical_offset()),
        }
        if not chunks:
            return cmd.response(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct", ext)
        return cmd.response(ext_fields=ext, body=b"".join(chunks))

    def view_message(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = ViewMessageRequestHeader.from_ext(cmd.ext_fields)
        data = self.store.read_record(h.offset)
        if data is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {h.offset}")
        return cmd.response(body=data)

    # -- topics

    def create_topic(self, _conn: Any, cmd: RemotingCommand) -> Any:
        h = CreateTopicRequestHeader.from_ext(cmd.ext_fields)
        problem = validate_topic(h.topic)
        if problem is not None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, problem)
        if self.topics.is_system_topic(h.topic) or h.topic == h.defaultTopic:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"The topic[{h.topic}] is conflict with system topic.")
        if h.readQueueNums <= 0 or h.writeQueueNums <= 0 or h.readQueueNums > 1024 or h.writeQueueNums > 1024:
            return cmd.response(ResponseCode.SYSTEM_ERROR, "queue counts must be within 1..1024")
        self.topics.upsert(
            TopicConfig(
                h.topic, h.readQueueNums, h.writeQueueNums, h.perm, h.topicFilterType, h.topicSysFlag or 0, h.order
            )
        )
        # Java answers once the name servers have the route (registerIncrementBrokerData waits for them), so a
        # client may subscribe right after creating the topic (the Go push consumer fails to start without a route).
        return self._answer_once_registered(cmd)

    def delete_topic(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        topic = TopicHeader.from_ext(cmd.ext_fields).topic
        if self.topics.is_system_topic(topic):
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"The topic[{topic}] is a system topic and cannot be deleted."
            )
        if self.topics.delete(topic):
            self.topic_changed()
        return cmd.response()

    def all_topic_config(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        return cmd.response(body=orjson.dumps(self.topics.wrapper()))

    def topic_stats(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        topic = TopicHeader.from_ext(cmd.ext_fields).topic
        cfg = self.topics.get(topic)
        if cfg is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = self.store
        name = self.config.broker_name
        entries = []
        for qid in range(cfg.write_queue_nums):
            last = store.last_store_time(topic, qid)
            entries.append(
                (
                    mq_key(topic, name, qid),
                    {
                        "minOffset": store.min_offset(topic, qid),
                        "maxOffset": store.max_offset(topic, qid),
                        "lastUpdateTimestamp": last or 0,
                    },
                )
            )
        return cmd.response(body=with_object_map("offsetTable", entries, {}))

    def consume_stats(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        h = GetConsumeStatsRequestHeader.from_ext(cmd.ext_fields)
        topics = [h.topic] if h.topic else self.offsets.topics_of_group(h.consumerGroup)
        entries = []
        for topic in topics:
            cfg = self.topics.get(topic)
            if cfg is None:
                continue
            # As in RocketMQ: while the group is online, only the topics it subscribes to are reported.
            online = self.clients.consumers.get(h.consumerGroup)
            if online is not None and online.channels and online.subscriptions and topic not in online.subscriptions:
                continue
            stored = self.offsets.offsets_of(h.consumerGroup, topic)
            for qid in range(cfg.read_queue_nums):
                consumer_offset = stored.get(qid, 0)
                last = 0
                if 0 < consumer_offset <= self.store.max_offset(topic, qid):
                    last = self.store.store_time_at(topic, qid, consumer_offset - 1) or 0
                entries.append(
                    (
                        mq_key(topic, self.config.broker_name, qid),
                        {
                            "brokerOffset": self.store.max_offset(topic, qid),
                            "consumerOffset": consumer_offset,
                            "lastTimestamp": last,
                        },
                    )
                )
        return cmd.response(body=with_object_map("offsetTable", entries, {"consumeTps": 0.0}))

    def runtime_info(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        # KVTable values are strings; structured txmq statistics go as JSON text, not Python reprs.
        table = {
            k: orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS).decode() if isinstance(v, (dict, list)) else str(v)
            for k, v in self.broker_runtime_info().items()
        }
        return cmd.response(body=orjson.dumps({"table": table}))

    # -- subscription groups

    def create_subscription_group(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            raw = orjson.loads(cmd.body)
            cfg = SubscriptionGroupConfig(
                group_name=str(raw["groupName"]),
                consume_enable=bool(raw.get("consumeEnable", True)),
                consume_from_min_enable=bool(raw.get("consumeFromMinEnable", True)),
                consume_broadcast_enable=bool(raw.get("consumeBroadcastEnable", True)),
                retry_queue_nums=int(raw.get("retryQueueNums", 1)),
                retry_max_times=int(raw.get("retryMaxTimes", 16)),
                broker_id=int(raw.get("brokerId", 0)),
                which_broker_when_consume_slowly=int(raw.get("whichBrokerWhenConsumeSlowly", 1)),
                notify_consumer_ids_changed_enable=bool(raw.get("notifyConsumerIdsChangedEnable", True)),
                consume_message_orderly=bool(raw.get("consumeMessageOrderly", False)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"invalid subscription group config: {exc}")
        problem = validate_group(cfg.group_name)
        if problem is not None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, problem)
        self.subscriptions.upsert(cfg)
        return cmd.response()

    def all_consumer_offsets(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """RocketMQ's ConsumerOffsetSerializeWrapper: what a slave copies from its master."""
        table = {k: {str(q): o for q, o in v.items()} for k, v in list(self.offsets.table.items())}
        return cmd.response(body=orjson.dumps({"offsetTable": table}))

    def all_subscription_groups(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        table = {
            name: {
                "groupName": c.group_name,
                "consumeEnable": c.consume_enable,
                "consumeFromMinEnable": c.consume_from_min_enable,
                "consumeBroadcastEnable": c.consume_broadcast_enable,
                "retryQueueNums": c.retry_queue_nums,
                "retryMaxTimes": c.retry_max_times,
                "brokerId": c.broker_id,
                "whichBrokerWhenConsumeSlowly": c.which_broker_when_consume_slowly,
                "notifyConsumerIdsChangedEnable": c.notify_consumer_ids_changed_enable,
                "consumeMessageOrderly": c.consume_message_orderly,
            }
            for name, c in self.subscriptions.groups.items()
        }
        return cmd.response(body=orjson.dumps({"subscriptionGroupTable": table, "dataVersion": {"counter": 0}}))

    def delete_subscription_group(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        group = cmd.ext_fields.get("groupName", "")
        self.subscriptions.delete(group)
        return cmd.response()

    # -- orderly consumption

    @staticmethod
    def _lock_body(cmd: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
        raw = orjson.loads(cmd.body)
        if type(raw) is not dict:
            raise ValueError(f"the body must be a JSON object, got {type(raw).__name__}")
        mqs = [(str(m["topic"]), str(m["brokerName"]), int(m["queueId"])) for m in raw.get("mqSet") or []]
        return str(raw["consumerGroup"]), str(raw["clientId"]), mqs

    def lock_batch(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group, client_id, mqs = self._lock_body(cmd)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"invalid lock request body: {exc}")
        held = self.locks.try_lock(group, client_id, mqs, self.clock.monotonic())
        body = {"lockOKMQSet": [{"topic": t, "brokerName": b, "queueId": q} for t, b, q in held]}
        return cmd.response(body=orjson.dumps(body))

    def unlock_batch(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            group, client_id, mqs = self._lock_body(cmd)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"invalid unlock request body: {exc}")
        self.locks.unlock(group, client_id, mqs)
        return cmd.response()

    def check_client_config(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """CHECK_CLIENT_CONFIG (46), sent by Java consumers at start for non-TAG subscriptions: RocketMQ's
        ClientManageProcessor.checkClientConfig, with its codes and remarks."""
        try:
            raw = orjson.loads(cmd.body) if cmd.body else {}
        except orjson.JSONDecodeError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"invalid CHECK_CLIENT_CONFIG body: {exc}")
        sub = raw.get("subscriptionData") if isinstance(raw, dict) else None
        if not isinstance(sub, dict):
            return cmd.response()
        expression_type = sub.get("expressionType")
        if is_tag_type(expression_type):
            return cmd.response()
        if not self.config.enable_property_filter:
            return cmd.response(ResponseCode.SYSTEM_ERROR, unsupported_remark(str(expression_type)))
        expression = sub.get("subString")
        try:
            self.filters.get(
                str(raw.get("group") or ""),
                str(sub.get("topic") or ""),
                str(expression_type),
                None if expression is None else str(expression),
            )
        except FilterExpressionError as exc:
            return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, str(exc))
        return cmd.response()
