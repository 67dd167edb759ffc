"""Listeners shared by tests that consume with txmq's PushConsumer."""

from __future__ import annotations

import threading
from collections import Counter

from txmq.client import ConsumeStatus, MessageExt


class Collector:
    """A concurrent listener that records every message it is given (thread-safe)."""

    def __init__(self) -> None:
        self.messages: list[MessageExt] = []
        self.lock = threading.Lock()

    def __call__(self, msgs: list[MessageExt]) -> ConsumeStatus:
        with self.lock:
            self.messages.extend(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.messages]

    def body_counts(self) -> Counter[bytes]:
        """How often each body was delivered: a duplicate shows as a count above 1."""
        with self.lock:
            return Counter(m.body for m in self.messages)
