"""The asyncio :class:`PullConsumer`: the caller picks queues and offsets and pulls explicitly."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from txmq.client.instance import ClientInstance
from txmq.client.lifecycle import ClientLifecycle
from txmq.client.message import ConsumeFromWhere, ConsumeType, MessageModel, MessageQueue, PullResult
from txmq.client.offset_store import OffsetStore, offset_store_for
from txmq.client.producer import check_group, check_topic
from txmq.client.push_consumer import PULL_SUBSCRIPTION, PULL_SUSPEND
from txmq.client.subscription import Subscription
from txmq.errors import MQClientError
from txmq.protocol.headers import PullMessageRequestHeader

log = logging.getLogger("txmq.client")


class PullConsumer(ClientLifecycle):
    """Explicit pulling: ``fetch_queues`` a topic, then ``pull(queue, expression, offset)`` from any offset.

    Offsets are the caller's; ``update_offset`` / ``fetch_offset`` keep them on the brokers (clustering) or in a
    local file (broadcasting), committed every few seconds and on shutdown.
    """

    _what = "pull consumer"

    def __init__(
        self,
        group: str,
        namesrv_addr: str | Sequence[str],
        *,
        message_model: MessageModel = MessageModel.CLUSTERING,
        broker_suspend_max_time: float = 20.0,
        consumer_timeout_when_suspend: float = 30.0,
        consumer_pull_timeout: float = 10.0,
        offset_store_dir: str | Path | None = None,
        **options: Any,
    ) -> None:
        check_group(group)
        super().__init__(namesrv_addr, **options)
        self.group = group
        self.message_model = message_model
        self.broker_suspend_max_time = broker_suspend_max_time
        self.consumer_timeout_when_suspend = consumer_timeout_when_suspend
        self.consumer_pull_timeout = consumer_pull_timeout
        self.offset_store_dir = Path(offset_store_dir) if offset_store_dir is not None else None
        self._topics: set[str] = set()
        self._offset_store: OffsetStore | None = None
        self._touched: set[MessageQueue] = set()

    # -- lifecycle (ClientLifecycle) ------------------------------------------------------------------------------

    def _attach(self, instance: ClientInstance) -> None:
        instance.register_consumer(self)
        self._offset_store = offset_store_for(
            instance, self.group, self.config, self.message_model is MessageModel.CLUSTERING, self.offset_store_dir
        )

    async def _detach(self, instance: ClientInstance) -> None:
        assert self._offset_store is not None
        await self._offset_store.persist_all(sorted(self._touched), wait=True)
        await instance.unregister_consumer(self.group)

    # -- instance member protocol ---------------------------------------------------------------------------------

    def consumer_data(self) -> dict[str, Any]:
        return {
            "groupName": self.group,
            "consumeType": ConsumeType.CONSUME_ACTIVELY.value,
            "messageModel": self.message_model.value,
            "consumeFromWhere": ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET.value,
            "unitMode": False,
            "subscriptionDataSet": [Subscription.parse(t, "*", 0).to_json() for t in sorted(self._topics)],
        }

    def subscribed_topics(self) -> set[str]:
        return set(self._topics)

    async def rebalance(self) -> None:
        return None  # a pull consumer chooses its own queues

    async def persist_offsets(self) -> None:
        if self._offset_store is not None and self._touched:
            await self._offset_store.persist_all(sorted(self._touched))

    # -- queues ---------------------------------------------------------------------------------------------------

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic``, sorted (fresh from the name server)."""
        check_topic(topic)
        instance = self.instance
        route = await instance.update_route(topic)
        if topic not in self._topics:
            self._topics.add(topic)
            await instance.send_heartbeat_to_all()
        return route.subscribe_queues()

    async def _addr(self, mq: MessageQueue) -> str:
        addr = await self.instance.find_broker_addr_refreshing(mq.broker_name, mq.topic, master_only=False)
        if addr is None:
            raise MQClientError(f"the broker {mq.broker_name} of {mq} is not known")
        return addr

    # -- pulling --------------------------------------------------------------------------------------------------

    async def pull(
        self,
        mq: MessageQueue,
        expression: str = "*",
        offset: int = 0,
        max_nums: int = 32,
        timeout: float | None = None,
        *,
        expression_type: str = "TAG",
    ) -> PullResult:
        """Read up to ``max_nums`` messages of ``mq`` from ``offset`` matching ``expression`` (tags, or an SQL92
        selector with ``expression_type="SQL92"`` on a broker with ``enablePropertyFilter``); no waiting."""
        return await self._pull(mq, expression, offset, max_nums, block=False, timeout=timeout, type_=expression_type)

    async def pull_blocking(
        self,
        mq: MessageQueue,
        expression: str = "*",
        offset: int = 0,
        max_nums: int = 32,
        timeout: float | None = None,
        *,
        expression_type: str = "TAG",
    ) -> PullResult:
        """Like :meth:`pull`, but the broker holds the request (long poll) until a message arrives or it gives up."""
        return await self._pull(mq, expression, offset, max_nums, block=True, timeout=timeout, type_=expression_type)

    async def _pull(
        self,
        mq: MessageQueue,
        expression: str,
        offset: int,
        max_nums: int,
        *,
        block: bool,
        timeout: float | None,
        type_: str = "TAG",
    ) -> PullResult:
        if offset < 0:
            raise MQClientError(f"offset must be >= 0, got {offset}")
        if max_nums <= 0:
            raise MQClientError(f"max_nums must be positive, got {max_nums}")
        sub = Subscription.parse(mq.topic, expression, 0, type_)
        suspend_ms = int(self.broker_suspend_max_time * 1000) if block else 0
        header = PullMessageRequestHeader(
            consumerGroup=self.group,
            topic=mq.topic,
            queueId=mq.queue_id,
            queueOffset=offset,
            maxMsgNums=max_nums,
            sysFlag=PULL_SUBSCRIPTION | (PULL_SUSPEND if block else 0),
            commitOffset=0,
            suspendTimeoutMillis=suspend_ms,
            subscription=sub.expression,
            subVersion=0,
            expressionType=sub.expression_type,
        )
        if timeout is None:
            timeout = self.consumer_timeout_when_suspend if block else self.consumer_pull_timeout
        return await self.instance.api.pull_message(
            await self._addr(mq), mq.broker_name, header, timeout, tags=sub.tags
        )

    # -- offsets --------------------------------------------------------------------------------------------------

    async def update_offset(self, mq: MessageQueue, offset: int) -> None:
        """Remember the next offset to consume for ``mq``; committed within a few seconds and on shutdown."""
        assert self._offset_store is not None
        _ = self.instance
        self._offset_store.update(mq, offset)
        self._touched.add(mq)

    async def fetch_offset(self, mq: MessageQueue, from_store: bool = True) -> int:
        """The committed offset of ``mq`` (from the broker or file when ``from_store``), or -1 if there is none."""
        assert self._offset_store is not None
        _ = self.instance
        return await self._offset_store.read(mq, from_store=from_store)

    async def persist_offset(self, mq: MessageQueue) -> None:
        """Commit ``mq``'s offset now and wait for the broker to take it."""
        assert self._offset_store is not None
        await self._offset_store.persist(mq, wait=True)

    async def min_offset(self, mq: MessageQueue) -> int:
        return await self.instance.api.get_min_offset(await self._addr(mq), mq)

    async def max_offset(self, mq: MessageQueue) -> int:
        return await self.instance.api.get_max_offset(await self._addr(mq), mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The offset of the message stored nearest to ``timestamp_ms``."""
        return await self.instance.api.search_offset(await self._addr(mq), mq, timestamp_ms)

    async def earliest_msg_store_time(self, mq: MessageQueue) -> int:
        return await self.instance.api.get_earliest_msg_store_time(await self._addr(mq), mq)
