"""The pop consumption service: receive (with long polling), ack, change invisible duration, dead-letter, and the
revive loop that turns expired leases into retry or dead-letter copies. Door-neutral; the state lives in
:mod:`txmq.broker.pop.state`, on disk through :mod:`txmq.broker.pop.journal`.

Retries use the 4.x door's topics: an expired lease becomes a copy on ``%RETRY%<group>`` with ``reconsumeTimes``
one higher (the invisible duration was the back-off, so the copy is visible at once), and past the group's
``retryMaxTimes`` a copy on ``%DLQ%<group>``. The group's position is also committed to the consumer offsets (the
lowest offset not finished), so the 4.x admin tools show its progress.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from txmq.broker.pop.journal import PopJournal
from txmq.broker.pop.state import Entry, IllegalPopTransition, Lease, LeaseState, PopTable, QueueKey
from txmq.broker.schedule import PROP_DLQ_REASON, PROP_LAST_FAILURE, clip_reason, reconsume_copy
from txmq.protocol.record import MessageRecord, Prop
from txmq.protocol.topics import PERM_READ, PERM_WRITE, dlq_topic, is_retry_topic, retry_topic
from txmq.store.message_store import PutStatus

if TYPE_CHECKING:
    from txmq.broker.config import BrokerConfig
    from txmq.broker.offsets import ConsumerOffsetManager
    from txmq.broker.runtime import BrokerStats
    from txmq.broker.subscriptions import SubscriptionGroupManager
    from txmq.broker.topics import TopicConfigManager
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker.pop")

REVIVE_TICK_SECONDS = 1.0
COMPACT_JOURNAL_BYTES = 16 * 1024 * 1024
SCAN_LIMIT = 256  # consume-queue entries looked at per queue per receive (filtered ones included)
HANDLE_VERSION = "p1"


class PopProblem(enum.Enum):
    BAD_REQUEST = "bad request"
    INVALID_HANDLE = "invalid receipt handle"
    NOT_FOUND = "not found"
    FORBIDDEN = "forbidden"
    INTERNAL = "internal"


class PopError(Exception):
    def __init__(self, problem: PopProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    topic: str  # the stored topic (the group's retry topic for a retry copy)
    queue_id: int
    offset: int
    generation: int

    def text(self) -> str:
        return f"{HANDLE_VERSION}.{self.generation:x}.{self.queue_id}.{self.offset}.{self.topic}"

    @classmethod
    def parse(cls, text: str) -> ReceiptHandle:
        try:
            version, generation, queue_id, offset, topic = text.split(".", 4)
            if version != HANDLE_VERSION or not topic:
                raise ValueError(version)
            return cls(topic, int(queue_id), int(offset), int(generation, 16))
        except ValueError:
            raise PopError(PopProblem.INVALID_HANDLE, f"receipt handle {text[:80]!r} is not one txmq made") from None


@dataclass(slots=True)
class Received:
    record: MessageRecord
    handle: str
    delivery_attempt: int
    invisible_ms: int


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int
    backoff_ms: list[int]


class PopService:
    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        store_host: tuple[str, int],
        store: MessageStore,
        topics: TopicConfigManager,
        subscriptions: SubscriptionGroupManager,
        offsets: ConsumerOffsetManager,
        topic_changed: Callable[[], None],
        delay_levels_ms: list[int],
        folder: Path,
        stats: BrokerStats | None = None,
    ) -> None:
        self.stats = stats  # messages and bytes handed out, for /metrics
        self.config = config
        self.clock = clock
        self.store_host = store_host
        self.store = store
        self.topics = topics
        self.subscriptions = subscriptions
        self.offsets = offsets
        self.topic_changed = topic_changed
        self.delay_levels_ms = delay_levels_ms
        self.journal = PopJournal(folder, sync=config.flush_disk_type == "SYNC_FLUSH")
        self.table = PopTable()
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._kick: asyncio.Event | None = None
        self._backlog: list[tuple[QueueKey, Lease, bool, str | None]] = []
        self._random = random.Random()
        self._turn = 0
        self.revived = 0

    # -- life cycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.table = self.journal.load()
        self.store.on_new_messages(self._on_new_messages)
        self._kick = asyncio.Event()
        self._task = asyncio.create_task(self._revive_loop(), name="txmq-pop-revive")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.done():
                    w.set_result(None)
        await self.journal.drain()
        self.journal.close()

    @property
    def idle(self) -> bool:
        return self.journal.idle and not self._backlog

    # -- policy ---------------------------------------------------------------------------------------------------

    def retry_policy(self, group: str) -> RetryPolicy:
        """Attempts = the group's retryMaxTimes + 1; back-off = the delay levels from level 3, as the 4.x door's
        send-back uses them (10s, 30s, 1m, ... by default)."""
        sub = self.subscriptions.get(group)
        retries = sub.retry_max_times if sub is not None else 16
        levels = self.delay_levels_ms or [1000]
        backoff = [levels[min(2 + i, len(levels) - 1)] for i in range(max(1, retries))]
        return RetryPolicy(retries + 1, backoff)

    # -- receive ----------------------------------------------------------------------------------------------------

    def _initial_offset(self, group: str, topic: str, queue_id: int) -> int:
        committed = self.offsets.query(group, topic, queue_id)
        if committed is not None and committed >= 0:
            return committed
        low = self.store.min_offset(topic, queue_id)
        if is_retry_topic(topic) or low == 0:
            return low
        return self.store.max_offset(topic, queue_id)

    def _sources(self, group: str, topic: str) -> list[tuple[str, int]]:
        cfg = self.topics.get(topic)
        if cfg is None:
            raise PopError(PopProblem.NOT_FOUND, f"topic {topic} does not exist on broker {self.config.broker_name}")
        if not cfg.readable:
            raise PopError(PopProblem.FORBIDDEN, f"the topic {topic} is not readable")
        sources = [(topic, q) for q in range(cfg.read_queue_nums)]
        retry = self.topics.get(retry_topic(group))
        if retry is not None:
            sources += [(retry.topic_name, q) for q in range(retry.read_queue_nums)]
        self._turn += 1
        shift = self._turn % len(sources) if sources else 0
        return sources[shift:] + sources[:shift]

    def _take(
        self, group: str, topic: str, tags: Collection[str] | None, batch: int, invisible_ms: int, fifo: bool
    ) -> tuple[list[Received], list[Entry]]:
        """Lease up to ``batch`` messages at once (no await: nothing else can lease them meanwhile). A FIFO group
        takes nothing from a queue while it holds a message of it, and gets messages due again in place first."""
        deadline = self.clock.now_ms() + invisible_ms
        out: list[Received] = []
        entries: list[Entry] = []
        table = self.table
        for source, queue_id in self._sources(group, topic):
            if len(out) >= batch:
                break
            key = (group, source, queue_id)
            progress = table.progress(key)
            if progress is None:
                entries.append(table.start(key, self._initial_offset(group, source, queue_id)))
                progress = table.progress(key)
                assert progress is not None
            if fifo:
                if progress.held():
                    continue
                again = sorted(o for o, lease in progress.leases.items() if lease.state is LeaseState.VISIBLE)
                for at in again[: batch - len(out)]:
                    self._lease(key, at, deadline, invisible_ms, out, entries)
                if again:
                    continue  # the rest of the queue waits until these are done
            low = self.store.min_offset(source, queue_id)
            if progress.next_offset < low:
                entries.append(table.advance(key, low))
            offset = progress.next_offset
            scanned = self.store.read_consume_queue(source, queue_id, offset, SCAN_LIMIT)
            skipped_to = offset
            for i, (phys, size, _tags_code) in enumerate(scanned):
                if len(out) >= batch:
                    break
                at = offset + i
                record = self.store.read_message(phys, size)
                if record is None or (tags is not None and (record.tags or "") not in tags):
                    skipped_to = at + 1
                    continue
                self._lease(key, at, deadline, invisible_ms, out, entries, record)
                skipped_to = at + 1
            if skipped_to > progress.next_offset:
                entries.append(table.advance(key, skipped_to))
        return out, entries

    def _lease(
        self,
        key: QueueKey,
        at: int,
        deadline: int,
        invisible_ms: int,
        out: list[Received],
        entries: list[Entry],
        record: MessageRecord | None = None,
    ) -> None:
        _group, source, queue_id = key
        if record is None:
            located = self.store.read_consume_queue(source, queue_id, at, 1)
            record = self.store.read_message(located[0][0], located[0][1]) if located else None
            if record is None:  # gone from the store (retention) while due again: nothing left to deliver
                entries.append(self.table.stored(key, at))
                return
        record.queue_offset = at
        entry = self.table.receive(key, at, deadline)
        entries.append(entry)
        handle = ReceiptHandle(source, queue_id, at, entry.handle).text()
        out.append(Received(record, handle, record.reconsume_times + entry.attempt, invisible_ms))

    async def receive(
        self,
        group: str,
        topic: str,
        *,
        tags: Collection[str] | None,
        batch: int,
        invisible_ms: int,
        wait_seconds: float,
    ) -> list[Received]:
        """Up to ``batch`` messages of ``topic`` (and of the group's retry topic) whose tag is in ``tags`` (None:
        any), each hidden from the group for ``invisible_ms``; waits up to ``wait_seconds`` when there is none."""
        sub = self.subscriptions.get(group)
        if sub is None:
            raise PopError(PopProblem.NOT_FOUND, f"consumer group {group} does not exist")
        if not sub.consume_enable:
            raise PopError(PopProblem.FORBIDDEN, f"consumer group {group} may not consume (consumeEnable=false)")
        give_up = self.clock.monotonic() + wait_seconds
        while True:
            out, entries = self._take(group, topic, tags, max(1, batch), invisible_ms, sub.consume_message_orderly)
            if entries:
                await self._persist(entries)
            if out:
                if self.stats is not None:
                    for received in out:
                        self.stats.count_popped(received.record.topic, group, received.record.store_size)
                return out
            remaining = give_up - self.clock.monotonic()
            if remaining <= 0:
                return []
            await self._wait_for_messages((topic, retry_topic(group)), remaining)

    async def _wait_for_messages(self, topics: tuple[str, ...], seconds: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for t in topics:
            self._waiters.setdefault(t, set()).add(waiter)
        timer = self.clock.call_later(seconds, lambda: waiter.done() or waiter.set_result(None))
        try:
            await waiter
        finally:
            timer.cancel()
            for t in topics:
                waiting = self._waiters.get(t)
                if waiting is not None:
                    waiting.discard(waiter)
                    if not waiting:
                        del self._waiters[t]

    def _on_new_messages(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        for waiter in self._waiters.pop(topic, ()):
            if not waiter.done():
                waiter.set_result(None)

    # -- ack, change, dead letter -------------------------------------------------------------------------------

    def _key(self, group: str, handle: str) -> tuple[QueueKey, ReceiptHandle]:
        parsed = ReceiptHandle.parse(handle)
        return (group, parsed.topic, parsed.queue_id), parsed

    async def ack(self, group: str, handle: str) -> None:
        key, parsed = self._key(group, handle)
        try:
            entry = self.table.ack(key, parsed.offset, parsed.generation)
        except IllegalPopTransition as exc:
            raise PopError(PopProblem.INVALID_HANDLE, f"ack refused: {exc}") from None
        await self._persist([entry])

    async def change_invisible(self, group: str, handle: str, invisible_ms: int) -> str:
        key, parsed = self._key(group, handle)
        try:
            entry, generation = self.table.change(
                key, parsed.offset, parsed.generation, self.clock.now_ms() + invisible_ms
            )
        except IllegalPopTransition as exc:
            raise PopError(PopProblem.INVALID_HANDLE, f"change of invisible duration refused: {exc}") from None
        await self._persist([entry])
        if invisible_ms < REVIVE_TICK_SECONDS * 1000:
            self._kick_reviver()  # sooner than the loop's next look (which is at most a tick away)
        return ReceiptHandle(parsed.topic, parsed.queue_id, parsed.offset, generation).text()

    async def dead_letter(self, group: str, handle: str, reason: str) -> None:
        key, parsed = self._key(group, handle)
        try:
            lease = self.table.dead_letter(key, parsed.offset, parsed.generation)
        except IllegalPopTransition as exc:
            raise PopError(PopProblem.INVALID_HANDLE, f"forwarding to the DLQ refused: {exc}") from None
        if not await self._revive(key, lease, to_dlq=True, reason=reason):
            self._backlog.append((key, lease, True, reason))
            raise PopError(PopProblem.INTERNAL, "storing the dead-letter copy failed; it will be retried")

    async def _persist(self, entries: list[Entry]) -> None:
        await self.journal.append(entries)
        for group, topic, queue_id in {e.key for e in entries}:
            progress = self.table.progress((group, topic, queue_id))
            if progress is not None:
                self.offsets.commit(group, topic, queue_id, progress.low_water())
        if self.journal.size > COMPACT_JOURNAL_BYTES and self.journal.idle:
            # In the loop, not a thread: no append may start while the journal is swapped for a snapshot.
            self.journal.compact(self.table)

    # -- revive ---------------------------------------------------------------------------------------------------

    def _kick_reviver(self) -> None:
        if self._kick is not None:
            self._kick.set()

    async def _revive_loop(self) -> None:
        assert self._kick is not None
        while True:
            try:
                backlog, self._backlog = self._backlog, []
                for key, lease, to_dlq, reason in backlog:
                    if not await self._revive(key, lease, to_dlq=to_dlq, reason=reason):
                        self._backlog.append((key, lease, to_dlq, reason))
                now = self.clock.now_ms()
                for key, lease in self.table.expire_due(now):
                    if not await self._revive(key, lease, to_dlq=False, reason=None):
                        self._backlog.append((key, lease, False, None))
                next_deadline = self.table.next_deadline_ms()
                wait = REVIVE_TICK_SECONDS
                if next_deadline is not None:
                    wait = min(wait, max(0.0, (next_deadline - self.clock.now_ms()) / 1000))
                if wait > 0:
                    self._kick.clear()
                    timer = self.clock.call_later(wait, self._kick.set)
                    try:
                        await self._kick.wait()
                    finally:
                        timer.cancel()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reviving expired pop leases failed; retrying in 1s")
                await self.clock.sleep(1.0)

    async def _revive(self, key: QueueKey, lease: Lease, *, to_dlq: bool, reason: str | None) -> bool:
        """Store the retry or dead-letter copy of an expired lease, then forget the lease; False: try again."""
        group, topic, queue_id = key
        located = self.store.read_consume_queue(topic, queue_id, lease.offset, 1)
        record = self.store.read_message(located[0][0], located[0][1]) if located else None
        if record is None:
            log.warning(
                "pop: %s queue %d offset %d is gone from the store; its lease ends", topic, queue_id, lease.offset
            )
            await self._persist([self.table.stored(key, lease.offset)])
            return True
        sub = self.subscriptions.get(group)
        if sub is not None and sub.consume_message_orderly and not to_dlq:
            # FIFO: the message comes back at its place, before the rest of its queue (the client forwards it to
            # the DLQ once it has used up its attempts).
            await self._persist([self.table.in_place(key, lease.offset)])
            self._on_new_messages(topic, queue_id, 0)
            self.revived += 1
            return True
        limit = sub.retry_max_times if sub is not None else 16
        props = dict(record.properties)
        props.setdefault(Prop.RETRY_TOPIC, topic)
        if not props.get(Prop.ORIGIN_MESSAGE_ID):
            props[Prop.ORIGIN_MESSAGE_ID] = record.offset_msg_id
        failure = clip_reason(reason)
        if failure:
            props[PROP_LAST_FAILURE] = failure
        if to_dlq or record.reconsume_times >= limit:
            target, target_queue = dlq_topic(group), 0
            props[PROP_DLQ_REASON] = (
                f"the consumer forwarded it to the DLQ after {record.reconsume_times + lease.attempt} attempt(s)"
                if to_dlq
                else f"not acknowledged after {record.reconsume_times + 1} attempts, the limit is {limit + 1}"
            )
            queues = 1
        else:
            target = retry_topic(group)
            queues = max(1, sub.retry_queue_nums if sub is not None else 1)
            target_queue = self._random.randrange(queues)
        if self.topics.ensure(target, queues, PERM_READ | PERM_WRITE)[1]:
            self.topic_changed()
        copy = reconsume_copy(record, target, target_queue, self.store_host, props)
        result = await self.store.put(copy)
        if result.status not in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            log.error("pop: storing the %s copy of %s failed: %s", target, record.offset_msg_id, result.status.value)
            return False
        await self._persist([self.table.stored(key, lease.offset)])
        self.revived += 1
        if target != retry_topic(group):
            log.info(
                "message %s of group %s went to %s: %s", props.get(Prop.UNIQ_KEY), group, target, props[PROP_DLQ_REASON]
            )
        return True
