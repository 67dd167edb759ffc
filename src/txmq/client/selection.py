"""Pure decision logic: which queue a send goes to, when a failed send is retried, how queues are shared out.

Kept free of IO so the rules can be unit-tested: round-robin queue selection that steers a retry away from the
broker that just failed, the retryable response codes, hash selection for orderly sends, and RocketMQ's
AllocateMessageQueueAveragely rebalance strategy.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Collection, Sequence
from typing import Any

from txmq.client.message import Message, MessageQueue
from txmq.protocol.record import java_string_hash

QueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue]
"""``selector(queues, message, arg) -> queue`` for orderly sends (RocketMQ's MessageQueueSelector)."""

# Broker answers after which a sync send tries again on another broker (Java's retryResponseCodes).
RETRYABLE_SEND_CODES = frozenset({17, 14, 1, 16, 204, 205})


class QueueRoundRobin:
    """Round-robin over a topic's publish queues, avoiding brokers that failed during the current send.

    One instance per topic, shared by all sends to it, like Java's ``sendWhichQueue`` counter. It starts at a random
    position so that many producers do not all hit queue 0 first.
    """

    def __init__(self, start: int | None = None) -> None:
        self._counter = itertools.count(random.randrange(1 << 16) if start is None else start)

    def select(self, queues: Sequence[MessageQueue], avoid_brokers: Collection[str] = ()) -> MessageQueue:
        if not queues:
            raise ValueError("no queues to choose from")
        n = len(queues)
        start = next(self._counter)
        if avoid_brokers:
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name not in avoid_brokers:
                    return mq
        # Every broker has failed (or nothing to avoid): plain round-robin rather than giving up.
        return queues[start % n]


def select_by_hash(queues: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
    """RocketMQ's SelectMessageQueueByHash: ``abs(arg.hashCode()) % len(queues)``.

    Strings hash with Java's ``String.hashCode`` so a sharding key lands on the same queue as from a Java producer.
    """
    if isinstance(arg, str):
        h = java_string_hash(arg)
    elif isinstance(arg, int):
        h = arg if -(1 << 31) <= arg < (1 << 31) else _java_long_hash(arg)  # Integer / Long hashCode
    else:
        h = hash(arg)
    return queues[abs(h) % len(queues)]


def _java_long_hash(value: int) -> int:
    v = value & 0xFFFF_FFFF_FFFF_FFFF
    h = (v ^ (v >> 32)) & 0xFFFF_FFFF
    return h - (1 << 32) if h & 0x8000_0000 else h


def allocate_averagely(
    consumer_group: str, current_cid: str, all_queues: Sequence[MessageQueue], all_cids: Sequence[str]
) -> list[MessageQueue]:
    """Share sorted queues among sorted consumer ids in contiguous blocks; the first ``len % n`` get one extra.

    Both lists must already be sorted (every consumer must compute the same answer). A consumer not in the list
    gets nothing. ``consumer_group`` is only for the error text.
    """
    if not current_cid:
        raise ValueError("current_cid is empty")
    if current_cid not in all_cids:
        return []
    n_queues, n_cids = len(all_queues), len(all_cids)
    if n_queues == 0:
        return []
    index = list(all_cids).index(current_cid)
    mod = n_queues % n_cids
    if n_queues <= n_cids:
        size = 1 if index < n_queues else 0
    elif mod > 0 and index < mod:
        size = n_queues // n_cids + 1
    else:
        size = n_queues // n_cids
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n_queues - start)
    return [all_queues[(start + i) % n_queues] for i in range(max(0, count))]
