"""The broker's pull counters and GET_BROKER_RUNTIME_INFO's answer, gathered from the parts that keep them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txmq.broker.config import BrokerConfig
    from txmq.broker.longpoll import PullHoldService
    from txmq.broker.tools_admin import ToolsAdminProcessor
    from txmq.broker.txn import TransactionService
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

BROKER_VERSION_DESC = "V4_9_8"
BROKER_VERSION = 409


class BrokerStats:
    """Pull counters. ``out`` and ``pulled`` feed the metrics: per (topic, group) ``[messages, bytes]`` handed out,
    and per (group, topic, queue) the next offset the last pull answered (what is in flight lies between the
    committed offset and it)."""

    def __init__(self) -> None:
        self.get_messages = 0
        self.get_found = 0
        self.get_miss = 0
        self.since = time.monotonic()
        self.out: dict[tuple[str, str], list[int]] = {}
        self.pulled: dict[tuple[str, str, int], int] = {}

    def count_popped(self, topic: str, group: str, nbytes: int) -> None:
        """One message handed out by a pop receive (the gRPC door): counted out, not tracked per queue offset."""
        counts = self.out.get((topic, group))
        if counts is None:
            self.out[(topic, group)] = [1, nbytes]
        else:
            counts[0] += 1
            counts[1] += nbytes

    def count_out(self, topic: str, group: str, queue_id: int, messages: int, nbytes: int, next_offset: int) -> None:
        self.pulled[(group, topic, queue_id)] = next_offset
        if messages:
            counts = self.out.get((topic, group))
            if counts is None:
                self.out[(topic, group)] = [messages, nbytes]
            else:
                counts[0] += messages
                counts[1] += nbytes

    def count_get(self, count: int, *, found: bool) -> None:
        self.get_messages += count
        if found:
            self.get_found += 1
        else:
            self.get_miss += 1


class RuntimeInfo:
    """``runtime_info()``: the keys of GET_BROKER_RUNTIME_INFO, the store's statistics and the ``tx.*`` counters."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        started_at_ms: int,
        store: MessageStore,
        stats: BrokerStats,
        pull_holds: PullHoldService,
        tools_admin: ToolsAdminProcessor,
        transactions: TransactionService,
    ) -> None:
        self.config = config
        self.clock = clock
        self.started_at_ms = started_at_ms
        self.store = store
        self.stats = stats
        self.pull_holds = pull_holds
        self.tools_admin = tools_admin
        self.transactions = transactions
        self.sources: list[Callable[[], dict[str, Any]]] = []  # more keys from other parts (replication)

    def __call__(self) -> dict[str, Any]:
        store = self.store
        stats = store.stats()
        info: dict[str, Any] = {
            "brokerVersionDesc": BROKER_VERSION_DESC,
            "brokerVersion": BROKER_VERSION,
            "bootTimestamp": self.started_at_ms,
            "runtime": _runtime_text(self.clock.now_ms() - self.started_at_ms),
            "startAcceptSendRequestTimeStamp": self.started_at_ms,
            "msgPutTotalTodayNow": stats.get("put_messages", 0),
            "msgGetTotalTodayNow": self.stats.get_messages,
            "commitLogMinOffset": store.min_physical_offset(),
            "commitLogMaxOffset": store.max_physical_offset(),
            "putMessageTimesTotal": stats.get("put_messages", 0),
            "putMessageSizeTotal": stats.get("put_bytes", 0),
            "dispatchBehindBytes": 0,
            "pullHeldRequests": self.pull_holds.held_count(),
            "flushDiskType": self.config.flush_disk_type,
            "txmqPid": os.getpid(),
        }
        info.update(self.tools_admin.runtime_info())
        for key, value in stats.items():
            info.setdefault(f"store.{key}", value)
        info.update({f"tx.{key}": value for key, value in self.transactions.counter_values().items()})
        for source in self.sources:
            info.update(source())
        return info


def _runtime_text(ms: int) -> str:
    seconds = max(0, ms // 1000)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {secs} seconds ]"
