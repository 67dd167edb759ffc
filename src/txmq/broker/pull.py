"""PULL_MESSAGE (11) with tag filtering and long polling."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txmq.broker.clients import Subscription
from txmq.errors import ProtocolError
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import PullMessageRequestHeader

if TYPE_CHECKING:
    from txmq.broker.broker import Broker

log = logging.getLogger("txmq.broker")

FLAG_COMMIT_OFFSET = 0x1
FLAG_SUSPEND = 0x2
FLAG_SUBSCRIPTION = 0x4

# Per-pull limits: RocketMQ's maxTransfer*OnMessageInMemory.
MAX_TRANSFER_COUNT = 32
MAX_TRANSFER_BYTES = 256 * 1024
# How many consume-queue entries one pull may scan looking for tag matches.
MAX_FILTER_SCAN = 800


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
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def handle(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand | asyncio.Future[RemotingCommand]:
        try:
            header = PullMessageRequestHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        checked = self._check(header, cmd)
        if isinstance(checked, RemotingCommand):
            return checked
        subscription = checked
        outcome = self.pull(header, subscription)
        if header.sysFlag & FLAG_COMMIT_OFFSET and header.commitOffset >= 0:
            self.broker.offsets.commit(header.consumerGroup, header.topic, header.queueId, header.commitOffset)
        if outcome.code == ResponseCode.PULL_NOT_FOUND and header.sysFlag & FLAG_SUSPEND:
            timeout_ms = (
                header.suspendTimeoutMillis
                if self.broker.config.long_polling_enable
                else (self.broker.config.short_polling_time_mills)
            )
            loop = asyncio.get_running_loop()
            future: asyncio.Future[RemotingCommand] = loop.create_future()

            def resume() -> None:
                if future.done():
                    return
                again = self.pull(header, subscription)
                future.set_result(self._respond(cmd, again))

            self.broker.pull_holds.hold(header.topic, header.queueId, header.queueOffset, timeout_ms / 1000, resume)
            return future
        return self._respond(cmd, outcome)

    def _respond(self, cmd: RemotingCommand, outcome: PullOutcome) -> RemotingCommand:
        self.broker.stats.count_get(outcome.count, found=outcome.code == ResponseCode.SUCCESS)
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

    def _check(self, h: PullMessageRequestHeader, cmd: RemotingCommand) -> Subscription | RemotingCommand:
        broker = self.broker
        if not broker.config.broker_permission & 4:
            return cmd.response(
                ResponseCode.NO_PERMISSION, f"the broker[{broker.config.broker_name}] pulling message is forbidden"
            )
        group = broker.subscriptions.get(h.consumerGroup)
        if group is None:
            return cmd.response(
                ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{h.consumerGroup}] does not exist"
            )
        if not group.consume_enable:
            return cmd.response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {h.consumerGroup}")
        cfg = broker.topics.get(h.topic)
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
            return Subscription.parse(h.topic, h.subscription, h.subVersion, h.expressionType or "TAG")
        info = broker.clients.consumers.get(h.consumerGroup)
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
        return sub

    def pull(self, h: PullMessageRequestHeader, sub: Subscription) -> PullOutcome:
        """Run one pull against the store: the status table of RocketMQ's getMessage, mapped to response codes."""
        store = self.broker.store
        topic, qid, offset = h.topic, h.queueId, h.queueOffset
        min_off = store.min_offset(topic, qid)
        max_off = store.max_offset(topic, qid)
        if max_off == 0:
            code = ResponseCode.PULL_NOT_FOUND if offset == 0 else ResponseCode.PULL_OFFSET_MOVED
            return PullOutcome(code, "NO_MESSAGE_IN_QUEUE", 0, min_off, max_off)
        if offset < min_off:
            return PullOutcome(ResponseCode.PULL_OFFSET_MOVED, "OFFSET_TOO_SMALL", min_off, min_off, max_off)
        if offset == max_off:
            return PullOutcome(ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE", offset, min_off, max_off)
        if offset > max_off:
            return PullOutcome(ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY", max_off, min_off, max_off)
        max_count = max(1, min(h.maxMsgNums, MAX_TRANSFER_COUNT))
        scan = max_count if sub.matches_all else MAX_FILTER_SCAN
        entries = store.read_consume_queue(topic, qid, offset, scan)
        if not entries:
            return PullOutcome(ResponseCode.PULL_NOT_FOUND, "OFFSET_FOUND_NULL", offset, min_off, max_off)
        chunks: list[bytes] = []
        total = 0
        scanned = 0
        for phys, size, tags_code in entries:
            if len(chunks) >= max_count or (chunks and total + size > MAX_TRANSFER_BYTES):
                break
            scanned += 1
            if not sub.matches_code(tags_code):
                continue
            data = store.read_bytes(phys, size)
            if data is None:
                continue  # the segment was deleted by retention
            chunks.append(data)
            total += size
        next_offset = offset + scanned
        if not chunks:
            return PullOutcome(ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE", next_offset, min_off, max_off)
        return PullOutcome(ResponseCode.SUCCESS, "FOUND", next_offset, min_off, max_off, b"".join(chunks), len(chunks))
