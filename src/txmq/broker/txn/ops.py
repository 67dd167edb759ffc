"""What the transaction driver writes and reads for one transaction: its half message read back, its committed copy
(redirected to the schedule topic when delayed), an op marker on its own, and the system topics they need."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from txmq.broker.refusal import BrokerRefusal
from txmq.broker.txn.writer import marker_stored
from txmq.protocol.codes import ResponseCode
from txmq.protocol.op_marker import OP_TAG
from txmq.protocol.record import MessageRecord, Prop
from txmq.protocol.topics import PERM_READ, PERM_WRITE, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from txmq.txn import records
from txmq.txn.effects import Reply

if TYPE_CHECKING:
    from txmq.broker.schedule import ScheduleService
    from txmq.broker.topics import TopicConfigManager
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.transactions")


class StoreOps:
    def __init__(
        self,
        *,
        store: MessageStore,
        clock: Clock,
        store_host: tuple[str, int],
        topics: TopicConfigManager,
        schedule: ScheduleService,
        topic_changed: Callable[[], None],
    ) -> None:
        self.store = store
        self.clock = clock
        self.store_host = store_host
        self.topics = topics
        self.schedule = schedule
        self.topic_changed = topic_changed

    def read_half(self, phys: int, size: int | None = None) -> MessageRecord | None:
        """The half message at ``phys``, or None (logged when unreadable)."""
        try:
            half = self.store.read_message(phys, size)
        except Exception as exc:
            log.warning("the half message at commit-log offset %d is unreadable: %s", phys, exc)
            return None
        return half if half is not None and half.topic == TRANS_HALF_TOPIC else None

    def commit_copy(self, half: MessageRecord) -> MessageRecord | Reply:
        """The committed copy of ``half`` (in the schedule topic when delayed), or why it cannot be made."""
        try:
            copy = records.commit_copy(half, self.store_host)
        except (KeyError, ValueError) as exc:
            return Reply(ResponseCode.SYSTEM_ERROR, f"the prepared message lacks its real topic/queue: {exc}")
        delay = copy.properties.get(Prop.DELAY)
        if delay and delay != "0":
            try:
                copy = self.schedule.redirect(copy, delay)
            except BrokerRefusal as exc:
                return Reply(exc.code, exc.remark)
        return copy

    async def write_op(self, items: list[records.MarkerItem]) -> bool:
        """Store one op marker on its own (recovery, discard)."""
        self.op_topic_ready()
        result = await self.store.put(records.decision_marker(items, self.clock.now_ms(), self.store_host))
        return marker_stored(result, OP_TAG, items[0][2], items[0][1])

    def op_topic_ready(self) -> None:
        self.ensure(TRANS_OP_HALF_TOPIC)

    def ensure(self, topic: str) -> None:
        """``topic`` exists (a system topic, read and write), and the name server hears of it when it is new."""
        if topic not in self.topics.topics and self.topics.ensure(topic, 1, PERM_READ | PERM_WRITE)[1]:
            self.topic_changed()
