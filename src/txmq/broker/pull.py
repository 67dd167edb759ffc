"""PULL_MESSAGE (11) with tag and SQL92 property filtering and long polling."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txmq.broker.clients import Subscription
from txmq.broker.filters import (
    FILTER_DATA_NOT_EXIST_REMARK,
    PARSE_FAILED_REMARK,
    ConsumerFilters,
    record_filter,
    unsupported_remark,
)
from txmq.errors import FilterExpressionError, ProtocolError
from txmq.filter import SqlFilter, is_tag_type
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import PullMessageRequestHeader
from txmq.store.message_store import GetStatus

if TYPE_CHECKING:
    from txmq.broker.clients import ClientRegistry
    from txmq.broker.config import BrokerConfig
    from txmq.broker.longpoll import PullHoldService
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.broker.runtime import BrokerStats
    from txmq.broker.subscriptions import SubscriptionGroupManager
    from txmq.broker.topics import TopicConfigManager
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker")

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

# Per-pull limits: RocketMQ's maxTransfer*OnMessageInMemory.
MAX_TRANSFER_COUNT = 32
MAX_TRANSFER_BYTES = 256 * 1024


@dataclass(slots=True)
class PullOutcome:
    code: int
    remark: str
    next_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""
    count: int = 0


class PullProcessor:
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
        pull_holds: PullHoldService,
        filters: ConsumerFilters,
        stats: BrokerStats,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store
        self.topics = topics
        self.subscriptions = subscriptions
        self.clients = clients
        self.offsets = offsets
        self.pull_holds = pull_holds
        self.filters = filters
        self.stats = stats

    def handle(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | asyncio.Future[RemotingCommand]:
        try:
            header = PullMessageRequestHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        checked = self._check(header, cmd)
        if isinstance(checked, RemotingCommand):
            return checked
        subscription, sql = checked
        outcome = self.pull(header, subscription, sql)
        # RocketMQ's slaves ignore the offset a pull carries (they take offsets from UPDATE_CONSUMER_OFFSET).
        if header.sysFlag & FLAG_COMMIT_OFFSET and header.commitOffset >= 0 and not self.config.is_slave:
            self.offsets.commit(header.consumerGroup, header.topic, header.queueId, header.commitOffset)
        if outcome.code == ResponseCode.PULL_NOT_FOUND and header.sysFlag & FLAG_SUSPEND:
            timeout_ms = (
                header.suspendTimeoutMillis
                if self.config.long_polling_enable
                else (self.config.short_polling_time_mills)
            )
            loop = asyncio.get_running_loop()
            future: asyncio.Future[RemotingCommand] = loop.create_future()
            deadline = self.clock.monotonic() + timeout_ms / 1000

            def resume() -> None:
                if future.done():
                    return
                if getattr(conn, "closed", False):
                    # The consumer is gone: hand nothing out (it would count as pulled and in flight, for nobody).
                    future.cancel()
                    return
                again = self.pull(header, subscription, sql)
                remaining = deadline - self.clock.monotonic()
                if (
                    sql is not None
                    and again.code == ResponseCode.PULL_RETRY_IMMEDIATELY
                    and again.next_offset >= again.max_offset
                    and remaining > 0.01  # (a timer may fire a little early)
                ):
                    # Only messages the SQL92 filter rejects arrived: keep holding, as RocketMQ's hold service
                    # does when the new message does not match, and wake again past them.
                    self.pull_holds.hold(header.topic, header.queueId, again.next_offset, remaining, resume)
                    return
                future.set_result(self._respond(cmd, header, again))

            self.pull_holds.hold(header.topic, header.queueId, header.queueOffset, timeout_ms / 1000, resume)
            return future
        return self._respond(cmd, header, outcome)

    def _respond(self, cmd: RemotingCommand, h: PullMessageRequestHeader, outcome: PullOutcome) -> RemotingCommand:
        found = outcome.code == ResponseCode.SUCCESS
        self.stats.count_get(outcome.count, found=found)
        if found or outcome.code == ResponseCode.PULL_NOT_FOUND:
            self.stats.count_out(
                h.topic, h.consumerGroup, h.queueId, outcome.count, len(outcome.body), outcome.next_offset
            )
        return cmd.response(
            outcome.code,
            outcome.remark,
            {
                "suggestWhichBrokerId": "0",
                "nextBeginOffset": str(outcome.next_offset),
                "minOffset": str(outcome.min_offset),
                "maxOffset": str(outcome.max_offset),
            },
            outcome.body,
        )

    def _check(
        self, h: PullMessageRequestHeader, cmd: RemotingCommand
    ) -> tuple[Subscription, SqlFilter | None] | RemotingCommand:
        if not self.config.broker_permission & 4:
            return cmd.response(
                ResponseCode.NO_PERMISSION, f"the broker[{self.config.broker_name}] pulling message is forbidden"
            )
        group = self.subscriptions.get(h.consumerGroup)
        if group is None:
            return cmd.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{h.consumerGroup}] does not exist"
            )
        if not group.consume_enable:
            return cmd.response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {h.consumerGroup}")
        cfg = self.topics.get(h.topic)
        if cfg is None:
            return cmd.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{h.topic}] not exist, apply first please!")
        if not cfg.readable:
            return cmd.response(ResponseCode.NO_PERMISSION, f"the topic[{h.topic}] pulling message is forbidden")
        if h.queueId < 0 or h.queueId >= cfg.read_queue_nums:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{h.queueId}] is illegal, topic:[{h.topic}] topicConfig.readQueueNums:[{cfg.read_queue_nums}]",
            )
        if h.sysFlag & FLAG_SUBSCRIPTION:
            sub = Subscription.parse(h.topic, h.subscription, h.subVersion, h.expressionType or "TAG")
            if is_tag_type(h.expressionType):
                return sub, None
            if not h.subscription:  # FilterAPI.build: "Expression can't be null!"
                return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, PARSE_FAILED_REMARK)
            if not self.config.enable_property_filter:
                return cmd.response(ResponseCode.SYSTEM_ERROR, unsupported_remark(sub.expression_type))
            try:
                return sub, self.filters.get(h.consumerGroup, h.topic, sub.expression_type, h.subscription)
            except FilterExpressionError as exc:
                # RocketMQ (assertions off) would pull unfiltered here; txmq refuses with the parse-failure code
                return cmd.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED, f"{PARSE_FAILED_REMARK}: {exc}")
        info = self.clients.consumers.get(h.consumerGroup)
        if info is None:
            return cmd.response(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, f"the consumer's group info not exist, group: {h.consumerGroup}"
            )
        if info.message_model == "BROADCASTING" and not group.consume_broadcast_enable:
            return cmd.response(
                ResponseCode.NO_PERMISSION, f"the consumer group[{h.consumerGroup}] can not consume by broadcast way"
            )
        sub = info.subscriptions.get(h.topic)
        if sub is None:
            return cmd.response(
                ResponseCode.SUBSCRIPTION_NOT_EXIST, f"the consumer's subscription not exist, group: {h.consumerGroup}"
            )
        if sub.sub_version < h.subVersion:
            return cmd.response(
                ResponseCode.SUBSCRIPTION_NOT_LATEST,
                f"the consumer's subscription not latest, group: {h.consumerGroup}",
            )
        if is_tag_type(sub.expression_type):
            return sub, None
        try:
            sql = self.filters.get(h.consumerGroup, h.topic, sub.expression_type, sub.expression)
        except FilterExpressionError:
            return cmd.response(ResponseCode.FILTER_DATA_NOT_EXIST, FILTER_DATA_NOT_EXIST_REMARK)
        if not self.config.enable_property_filter:
            return cmd.response(ResponseCode.SYSTEM_ERROR, unsupported_remark(sub.expression_type))
        return sub, sql

    def pull(self, h: PullMessageRequestHeader, sub: Subscription, sql: SqlFilter | None = None) -> PullOutcome:
        """Run one pull against the store and map RocketMQ's getMessage status to a response code."""
        result = self.store.get_messages(
            h.topic,
            h.queueId,
            h.queueOffset,
            max(1, min(h.maxMsgNums, MAX_TRANSFER_COUNT)),
            MAX_TRANSFER_BYTES,
            None if sub.matches_all else sub.codes,
            None if sql is None else record_filter(sql),
        )
        status = result.status
        if status is GetStatus.NO_MESSAGE_IN_QUEUE:
            code = ResponseCode.PULL_NOT_FOUND if h.queueOffset == 0 else ResponseCode.PULL_OFFSET_MOVED
        else:
            code = _CODES[status]
        body = result.body if status is GetStatus.FOUND else b""
        return PullOutcome(
            code,
            status.value,
            result.next_begin_offset,
            result.min_offset,
            result.max_offset,
            body,
            result.message_count,
        )


_CODES = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
}
