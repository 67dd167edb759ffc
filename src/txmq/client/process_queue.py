"""A consumer's local view of one message queue: messages pulled but not yet consumed, and its lock state.

The committed offset of a queue is the smallest offset still held here (or one past the largest ever held when
nothing is left), so a message is never skipped however consumption interleaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from txmq.client.message import MessageExt

# A broker lock lives 60 s; a client treats its own as stale after 30 s without a successful re-lock.
LOCK_MAX_LIVE_SECONDS = 30.0


class ProcessQueue:
    def __init__(self) -> None:
        # Offsets arrive in increasing order from one queue, so insertion order is offset order and the first key
        # is the smallest. Re-inserting at the front (orderly retry) rebuilds the dict to keep that true.
        self._msgs: dict[int, MessageExt] = {}
        self._consuming: dict[int, MessageExt] = {}  # orderly: taken by the listener, not committed yet
        self.cached_bytes = 0
        self.max_offset_seen = -1
        self.dropped = False
        self.locked = False
        self.last_lock_time = float("-inf")
        self.consume_lock = asyncio.Lock()
        self._space = asyncio.Event()
        self._space.set()
        self._has_messages = asyncio.Event()

    # -- bookkeeping ----------------------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._msgs) + len(self._consuming)

    def is_empty(self) -> bool:
        return not self._msgs and not self._consuming

    def put(self, msgs: Iterable[MessageExt]) -> list[MessageExt]:
        """Add pulled messages; returns those that were not held already (the ones to hand to the listener)."""
        added = []
        for m in msgs:
            if m.queue_offset in self._msgs or m.queue_offset in self._consuming:
                continue
            self._msgs[m.queue_offset] = m
            self.cached_bytes += len(m.body)
            self.max_offset_seen = max(self.max_offset_seen, m.queue_offset)
            added.append(m)
        if self._msgs:
            self._has_messages.set()
        return added

    def remove(self, msgs: Iterable[MessageExt]) -> int:
        """Forget consumed messages; returns the offset now safe to commit, or -1 if nothing was ever held."""
        for m in msgs:
            if self._msgs.pop(m.queue_offset, None) is not None:
                self.cached_bytes -= len(m.body)
        self._space.set()
        return self.commit_offset()

    def commit_offset(self) -> int:
        if self._consuming:
            return min(self._consuming)
        if self._msgs:
            return next(iter(self._msgs))
        return self.max_offset_seen + 1 if self.max_offset_seen >= 0 else -1

    def clear(self) -> None:
        """Forget everything (the queue's offset was moved by the broker)."""
        self._msgs.clear()
        self._consuming.clear()
        self.cached_bytes = 0
        self.max_offset_seen = -1
        self._has_messages.clear()
        self._space.set()

    # -- orderly --------------------------------------------------------------------------------------------------

    def take(self, n: int) -> list[MessageExt]:
        """Move the ``n`` oldest messages to the consuming set and return them in offset order."""
        out: list[MessageExt] = []
        while self._msgs and len(out) < n:
            offset = next(iter(self._msgs))
            m = self._msgs.pop(offset)
            self._consuming[offset] = m
            out.append(m)
        if not self._msgs:
            self._has_messages.clear()
        return out

    def commit(self) -> int:
        """The taken messages were consumed: drop them; returns the next offset to consume from."""
        if not self._consuming:
            return self.commit_offset()
        next_offset = max(self._consuming) + 1
        for m in self._consuming.values():
            self.cached_bytes -= len(m.body)
        self._consuming.clear()
        self._space.set()
        return next_offset

    def put_back(self) -> list[MessageExt]:
        """The taken messages must be consumed again: return them to the front, order unchanged."""
        taken = sorted(self._consuming.values(), key=lambda m: m.queue_offset)
        self._consuming.clear()
        rebuilt = {m.queue_offset: m for m in taken}
        rebuilt.update(self._msgs)
        self._msgs = rebuilt
        if self._msgs:
            self._has_messages.set()
        return taken

    async def wait_for_messages(self) -> None:
        await self._has_messages.wait()

    def wake(self) -> None:
        """Wake whoever waits on this queue (used when it is dropped)."""
        self._has_messages.set()
        self._space.set()

    # -- flow control ---------------------------------------------------------------------------------------------

    def over_threshold(self, max_count: int, max_bytes: int) -> bool:
        return self.count > max_count or self.cached_bytes > max_bytes

    async def wait_for_space(self) -> None:
        self._space.clear()
        await self._space.wait()

    # -- locks ----------------------------------------------------------------------------------------------------

    def lock_expired(self, now: float) -> bool:
        return now - self.last_lock_time > LOCK_MAX_LIVE_SECONDS
