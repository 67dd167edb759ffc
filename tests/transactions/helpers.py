"""Shared pieces of the transaction end-to-end tests: names, polling, topics, a collecting consumer, listeners."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from listeners import Collector
from txmq.client import (
    Admin,
    ConsumeFromWhere,
    LocalTransactionState,
    Message,
    MessageExt,
    PushConsumer,
)
from txmq.testing import aeventually

FAST = {"rebalance_interval": 1.0, "poll_name_server_interval": 2.0, "heartbeat_interval": 2.0}


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


async def make_topic(namesrv: str, queues: int = 4) -> str:
    """A new topic on every broker of the cluster, once the name server routes it."""
    topic = unique("TxT")
    async with Admin(namesrv, instance_name=unique("admin")) as admin:
        info = await admin.cluster_info()
        (cluster_name,) = info.clusters
        await admin.create_topic(topic, cluster=cluster_name, read_queue_nums=queues, write_queue_nums=queues)
        await aeventually(lambda: admin.topic_route(topic), f"a route for {topic}", timeout=15, retry_on=(Exception,))
    return topic


async def start_consumer(namesrv: str, topic: str, collector: Collector, **options: Any) -> PushConsumer:
    consumer = PushConsumer(
        unique("CG"),
        namesrv,
        instance_name=unique("c"),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        **{**FAST, **options},
    )
    consumer.subscribe(topic)
    consumer.register_listener(collector)
    await consumer.start()
    return consumer


class BookListener:
    """A transaction listener backed by a dict, the test's "database": body -> decision.

    ``execute`` returns what ``decide(body)`` says (and records it); ``check`` answers from the book, with
    ``on_missing`` for bodies it never saw. Every check is recorded.
    """

    def __init__(
        self,
        decide: Callable[[bytes], LocalTransactionState] | None = None,
        book: dict[bytes, LocalTransactionState] | None = None,
        on_missing: LocalTransactionState = LocalTransactionState.UNKNOWN,
    ) -> None:
        self.decide = decide or (lambda _b: LocalTransactionState.COMMIT)
        self.book: dict[bytes, LocalTransactionState] = {} if book is None else book
        self.on_missing = on_missing
        self.executed: list[bytes] = []
        self.checked: list[MessageExt] = []
        self.lock = threading.Lock()

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        state = self.decide(message.body)
        with self.lock:
            self.executed.append(message.body)
            self.book.setdefault(message.body, state)
        return state

    def check_local_transaction(self, message: MessageExt) -> LocalTransactionState:
        with self.lock:
            self.checked.append(message)
            return self.book.get(message.body, self.on_missing)

    def checked_bodies(self) -> set[bytes]:
        with self.lock:
            return {m.body for m in self.checked}


HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"


async def read_topic(namesrv: str, topic: str) -> list[MessageExt]:
    """Every message stored in ``topic`` (all queues, from offset 0), read with a PullConsumer."""
    from txmq.client import PullConsumer, PullStatus
    from txmq.errors import NoRouteError

    out: list[MessageExt] = []
    async with PullConsumer(unique("reader"), namesrv, instance_name=unique("r")) as reader:
        try:
            queues = await reader.fetch_queues(topic)
        except NoRouteError:
            return []
        for mq in queues:
            offset = 0
            while True:
                result = await reader.pull(mq, "*", offset, 32)
                if result.status is not PullStatus.FOUND:
                    break
                out.extend(result.messages)
                offset = result.next_begin_offset
    return out


async def pending_half_offsets(namesrv: str) -> set[int]:
    """Half-topic queue offsets with no op marker: the broker's in-doubt transactions, read over the wire."""
    halves = {m.queue_offset for m in await read_topic(namesrv, HALF_TOPIC)}
    # An op marker may hold several decisions: its body lists their half queue offsets, comma-separated.
    done = {int(q) for m in await read_topic(namesrv, OP_TOPIC) if m.tags == "d" for q in m.body.split(b",")}
    return halves - done
