"""Delay levels and consumer retries: ``SCHEDULE_TOPIC_XXXX``, its clock-driven delivery, CONSUMER_SEND_MSG_BACK.

A delayed record is stored in ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``; the store writes its delivery time as
the consume-queue tagsCode. One task per level reads that queue from its persisted offset and, when an entry is
due, stores a copy on ``REAL_TOPIC`` / ``REAL_QID`` (``DELAY`` removed, ``REAL_*`` kept).

Restart safety (no loss, no duplicate): before a batch is put, ``delayOffset.json`` records the batch's range as
*in flight*; after the put it records the new offset. Every delivered copy carries ``TXMQ_DELAY_FROM`` (the
commit-log offset of its schedule record). At start, an in-flight range left by a crash is checked against the
tail of each target queue: entries whose copy is already there are skipped, the others delivered.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from txmq.broker.refusal import BrokerRefusal
from txmq.broker.stored import put_status_code
from txmq.broker.topics import (
    PERM_READ,
    PERM_WRITE,
    SCHEDULE_TOPIC,
    TopicConfig,
    dlq_topic,
    retry_topic,
)
from txmq.errors import ProtocolError, RecordDecodeError
from txmq.protocol.codes import ResponseCode
from txmq.protocol.frame import RemotingCommand
from txmq.protocol.headers import ConsumerSendMsgBackRequestHeader
from txmq.protocol.record import MessageRecord, Prop
from txmq.store.message_store import PutStatus
from txmq.util import atomic_write_json

if TYPE_CHECKING:
    from txmq.broker.config import BrokerConfig
    from txmq.broker.subscriptions import SubscriptionGroupConfig, SubscriptionGroupManager
    from txmq.broker.topics import TopicConfigManager
    from txmq.clock import Clock
    from txmq.store.message_store import MessageStore

log = logging.getLogger("txmq.broker")

# Properties txmq adds (documented in README): where a delivered copy came from, why a message is in the DLQ, the
# last failure a consumer reported, and that an operator re-sent a DLQ message.
PROP_DELAY_FROM = "TXMQ_DELAY_FROM"
PROP_DLQ_REASON = "TXMQ_DLQ_REASON"
PROP_LAST_FAILURE = "TXMQ_LAST_FAILURE"
PROP_RESENT_FROM_DLQ = "TXMQ_RESENT_FROM_DLQ"

MAX_REASON_CHARS = 256
DELIVER_BATCH = 32
# Request version from which CONSUMER_SEND_MSG_BACK's and SEND's maxReconsumeTimes count (RocketMQ V3_4_9).
MAX_RECONSUME_TIMES_MIN_VERSION = 121
# How far back (ms of store time) the restart check looks for copies delivered just before a crash.
RECOVERY_SCAN_MARGIN_MS = 60_000
RECOVERY_SCAN_MAX_ENTRIES = 200_000
_REFUSED = (PutStatus.MESSAGE_ILLEGAL, PutStatus.PROPERTIES_SIZE_EXCEEDED)


def reconsume_limit(version: int, header_max: int | None, group: SubscriptionGroupConfig) -> int:
    """The retry limit of a send-back or a direct send to ``%RETRY%group`` (wire §2.3 step 5, §6 step 4)."""
    if header_max is not None and version >= MAX_RECONSUME_TIMES_MIN_VERSION:
        return header_max
    return group.retry_max_times


def reconsume_copy(
    original: MessageRecord, topic: str, queue_id: int, store_host: tuple[str, int], properties: dict[str, str]
) -> MessageRecord:
    """The copy of a message a consumer did not take that goes to ``%RETRY%group`` or ``%DLQ%group``: its body, flags
    and birth, one more reconsume, the given properties (each door's send-back says why)."""
    return MessageRecord(
        topic=topic,
        body=original.body,
        queue_id=queue_id,
        flag=original.flag,
        sys_flag=original.sys_flag,
        born_timestamp=original.born_timestamp,
        born_host=original.born_host,
        store_host=store_host,
        reconsume_times=original.reconsume_times + 1,
        properties=properties,
    )


def clip_reason(text: str | None) -> str | None:
    if not text:
        return None
    text = " ".join(text.split())
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


@dataclass(slots=True)
class _InFlight:
    begin: int
    end: int
    since_ms: int


class ScheduleService:
    """Delay levels (redirect + delivery) and CONSUMER_SEND_MSG_BACK for one broker."""

    def __init__(
        self,
        *,
        config: BrokerConfig,
        clock: Clock,
        store_host: tuple[str, int],
        store: MessageStore,
        levels_ms: list[int],
        topics: TopicConfigManager,
        subscriptions: SubscriptionGroupManager,
        topic_changed: Callable[[], None],
        config_dir: Path,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store_host = store_host
        self.store = store
        self.levels_ms = levels_ms
        self.topics = topics
        self.subscriptions = subscriptions
        self.topic_changed = topic_changed
        self.path = config_dir / "delayOffset.json"
        self.offsets: dict[int, int] = {}
        self.in_flight: dict[int, _InFlight] = {}
        self._skip: dict[int, set[int]] = {}  # level -> schedule record offsets already delivered (restart check)
        self._wake: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._persist_lock = asyncio.Lock()
        self._random = random.Random()
        self._running = False
        self.delivered = 0
        self.gate: Any = None  # txmq.broker.ha.gate.ReplicaGate: a SYNC_MASTER's re-puts wait for a slave

    # -- life cycle ---------------------------------------------------------------------------------------------

    def _load(self) -> None:
        self.offsets.clear()
        self.in_flight.clear()
        if not self.path.exists():
            return
        try:
            raw = orjson.loads(self.path.read_bytes())
            self.offsets = {int(k): int(v) for k, v in (raw.get("offsetTable") or {}).items()}
            for k, v in (raw.get("inFlight") or {}).items():
                self.in_flight[int(k)] = _InFlight(int(v["begin"]), int(v["end"]), int(v["sinceMs"]))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # Starting from 0 would re-deliver everything; refusing to start is the honest choice.
            raise RuntimeError(f"delay offsets {self.path} are unreadable: {exc}") from exc

    def _snapshot(self) -> dict[str, Any]:
        return {
            "offsetTable": {str(k): v for k, v in sorted(self.offsets.items())},
            "inFlight": {
                str(k): {"begin": f.begin, "end": f.end, "sinceMs": f.since_ms}
                for k, f in sorted(self.in_flight.items())
            },
        }

    def all_delay_offsets(self, _conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        """GET_ALL_DELAY_OFFSET (45): this master's delayOffset.json, for its slaves."""
        return cmd.response(body=orjson.dumps(self._snapshot()))

    async def _persist(self) -> None:
        async with self._persist_lock:
            snapshot = self._snapshot()  # taken under the lock, so files are written in snapshot order
            await asyncio.get_running_loop().run_in_executor(None, atomic_write_json, self.path, snapshot)

    async def start(self) -> None:
        store = self.store
        self._load()
        cfg = self.topics.get(SCHEDULE_TOPIC)
        if cfg is None or cfg.queue_count < len(self.levels_ms):
            n = len(self.levels_ms)
            self.topics.upsert(TopicConfig(SCHEDULE_TOPIC, n, n))
        for level in range(1, len(self.levels_ms) + 1):
            flight = self.in_flight.get(level)
            if flight is not None:
                self._skip[level] = self._already_delivered(level, flight)
                self.offsets[level] = flight.begin
        store.on_new_messages(self._on_new_messages)
        self._running = True
        for level in range(1, len(self.levels_ms) + 1):
            self._wake[level] = asyncio.Event()
            self._tasks.append(asyncio.create_task(self._level_loop(level), name=f"txmq-delay-level-{level}"))

    async def close(self) -> None:
        self._running = False
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks.clear()
        if self.offsets or self.in_flight:
            try:
                await self._persist()
            except OSError as exc:
                log.error("persisting delay offsets failed: %s", exc)

    def _on_new_messages(self, topic: str, queue_id: int, _max_offset: int) -> None:
        if topic == SCHEDULE_TOPIC:
            event = self._wake.get(queue_id + 1)
            if event is not None:
                event.set()

    # -- redirect -----------------------------------------------------------------------------------------------

    def parse_level(self, text: str) -> int:
        try:
            level = int(str(text).strip())
        except ValueError:
            raise BrokerRefusal(
                ResponseCode.MESSAGE_ILLEGAL,
                f"the DELAY property must be a delay level 1..{len(self.levels_ms)}, got {text!r}",
            ) from None
        return min(level, len(self.levels_ms))

    def redirect(self, record: MessageRecord, level_text: str | int) -> MessageRecord:
        """A delayed put: the record goes to ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1`` with its real destination
        in ``REAL_TOPIC`` / ``REAL_QID``. A level of 0 or below means no delay."""
        level = self.parse_level(str(level_text))
        props = dict(record.properties)
        if level <= 0:
            props.pop(Prop.DELAY, None)
            record.properties = props
            return record
        props[Prop.DELAY] = str(level)
        props[Prop.REAL_TOPIC] = record.topic
        props[Prop.REAL_QID] = str(record.queue_id)
        record.properties = props
        record.topic = SCHEDULE_TOPIC
        record.queue_id = level - 1
        return record

    # -- delivery -----------------------------------------------------------------------------------------------

    def delay_ms(self, level: int) -> int:
        return self.levels_ms[min(max(level, 1), len(self.levels_ms)) - 1]

    async def _level_loop(self, level: int) -> None:
        queue_id = level - 1
        wake = self._wake[level]
        store = self.store
        while self._running:
            try:
                offset = max(self.offsets.get(level, 0), store.min_offset(SCHEDULE_TOPIC, queue_id))
                entries = store.read_consume_queue(SCHEDULE_TOPIC, queue_id, offset, DELIVER_BATCH)
                if not entries:
                    wake.clear()
                    if store.max_offset(SCHEDULE_TOPIC, queue_id) > offset:
                        continue  # arrived between the read and the clear
                    await wake.wait()
                    continue
                now = self.clock.now_ms()
                due: list[tuple[int, int]] = []
                wait_ms = 0
                for phys, size, deliver_at in entries:
                    # A delivery time beyond now + delay means the clock went back: deliver after the delay from now.
                    deliver_at = min(deliver_at, now + self.delay_ms(level))
                    if deliver_at > now:
                        wait_ms = deliver_at - now
                        break
                    due.append((phys, size))
                if due:
                    await self._deliver(level, offset, due)
                    continue
                await self.clock.sleep(wait_ms / 1000)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("delivering delay level %d failed; retrying in 1s", level)
                await self.clock.sleep(1.0)

    def _delivery_copy(self, record: MessageRecord) -> MessageRecord | None:
        props = dict(record.properties)
        props.pop(Prop.DELAY, None)
        topic = props.get(Prop.REAL_TOPIC)
        try:
            queue_id = int(props.get(Prop.REAL_QID, ""))
        except ValueError:
            queue_id = -1
        if not topic or queue_id < 0:
            log.error("delayed record at %d has no usable REAL_TOPIC/REAL_QID; skipped", record.physical_offset)
            return None
        props[PROP_DELAY_FROM] = str(record.physical_offset)
        return MessageRecord(
            topic=topic,
            body=record.body,
            queue_id=queue_id,
            flag=record.flag,
            sys_flag=record.sys_flag,
            born_timestamp=record.born_timestamp,
            born_host=record.born_host,
            store_host=self.store_host,
            reconsume_times=record.reconsume_times,
            prepared_transaction_offset=record.prepared_transaction_offset,
            properties=props,
        )

    async def _deliver(self, level: int, offset: int, due: list[tuple[int, int]]) -> None:
        store = self.store
        skip = self._skip.get(level, set())
        copies: list[MessageRecord] = []
        for phys, size in due:
            if phys in skip:
                continue
            try:
                record = store.read_message(phys, size)
            except RecordDecodeError as exc:
                log.error("delayed record at %d is unreadable (%s); skipped", phys, exc)
                continue
            if record is None:
                log.error("delayed record at %d is gone from the commit log; skipped", phys)
                continue
            copy = self._delivery_copy(record)
            if copy is not None:
                copies.append(copy)
        end = offset + len(due)
        if copies:
            self.in_flight[level] = _InFlight(offset, end, self.clock.now_ms())
            await self._persist()
            results = await store.put_many(copies)
            if any(
                r.status is PutStatus.MESSAGE_ILLEGAL or r.status is PutStatus.PROPERTIES_SIZE_EXCEEDED for r in results
            ):
                results = [await store.put(c) for c in copies]  # find the bad one; the others go through
            for copy, result in zip(copies, results, strict=True):
                if result.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
                    self.delivered += 1
                elif result.status in _REFUSED:
                    log.error("delayed message for %s cannot be stored (%s); skipped", copy.topic, result.remark)
                else:
                    # The store is failing: keep the offset (the in-flight range makes the retry duplicate-free).
                    raise RuntimeError(f"storing a delayed message failed: {result.status.value} {result.remark}")
            if self.gate is not None and self.gate.waits:
                await self._until_replicated(level)
        self.in_flight.pop(level, None)
        self._skip.pop(level, None)
        self.offsets[level] = end
        await self._persist()

    async def _until_replicated(self, level: int) -> None:
        """A SYNC_MASTER moves a level's offset past its re-puts only once a slave has them durably: a slave copies
        the delay offsets, and an offset past a re-put it lacks would lose that message at a failover. Until then
        the range stays in flight (a restart or a promotion delivers what its target queue lacks, as after a crash).
        No slave in sync at all (without a controller): the master goes on alone, as its sends do."""
        while self._running:
            outcome = await self.gate.replicated()
            if outcome.value in ("PUT_OK", "SLAVE_NOT_AVAILABLE"):
                return
            log.warning(
                "delay level %d: no slave confirmed the delivered messages (%s); their offset waits",
                level,
                outcome.value,
            )
            if outcome.value == "FENCED":
                await self.clock.sleep(1.0)
        raise asyncio.CancelledError

    def _already_delivered(self, level: int, flight: _InFlight) -> set[int]:
        """Schedule records of an in-flight range whose copy reached its target queue before a crash."""
        store = self.store
        entries = store.read_consume_queue(SCHEDULE_TOPIC, level - 1, flight.begin, flight.end - flight.begin)
        targets: dict[tuple[str, int], set[int]] = {}
        for phys, size, _ in entries:
            record = store.read_message(phys, size)
            if record is None:
                continue
            try:
                key = (record.properties[Prop.REAL_TOPIC], int(record.properties[Prop.REAL_QID]))
            except (KeyError, ValueError):
                continue
            targets.setdefault(key, set()).add(phys)
        found: set[int] = set()
        since = flight.since_ms - RECOVERY_SCAN_MARGIN_MS
        for (topic, queue_id), wanted in targets.items():
            pos = store.max_offset(topic, queue_id)
            low = max(store.min_offset(topic, queue_id), pos - RECOVERY_SCAN_MAX_ENTRIES)
            while pos > low and wanted - found:
                start = max(low, pos - 64)
                chunk = store.read_consume_queue(topic, queue_id, start, pos - start)
                older = False
                for phys, size, _ in reversed(chunk):
                    record = store.read_message(phys, size)
                    if record is None:
                        continue
                    if record.store_timestamp < since:
                        older = True
                        break
                    src = record.properties.get(PROP_DELAY_FROM)
                    if src is not None and src.isdigit() and int(src) in wanted:
                        found.add(int(src))
                if older:
                    break
                pos = start
        if found:
            log.info(
                "delay level %d: %d message(s) were delivered just before a crash; not delivering again",
                level,
                len(found),
            )
        return found

    # -- CONSUMER_SEND_MSG_BACK ---------------------------------------------------------------------------------

    async def send_back(self, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        try:
            h = ConsumerSendMsgBackRequestHeader.from_ext(cmd.ext_fields)
        except ProtocolError as exc:
            return cmd.response(ResponseCode.SYSTEM_ERROR, str(exc))
        sub = self.subscriptions.get(h.group)
        if sub is None:
            return cmd.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {h.group}")
        if not self.config.broker_permission & PERM_WRITE:
            return cmd.response(
                ResponseCode.NO_PERMISSION, f"the broker[{self.config.broker_name}] sending message is forbidden"
            )
        if sub.retry_queue_nums <= 0:
            return cmd.response()
        rt = retry_topic(h.group)
        if self.topics.ensure(rt, sub.retry_queue_nums, PERM_READ | PERM_WRITE)[1]:
            self.topic_changed()
        store = self.store
        try:
            original = store.read_message(h.offset) if h.offset >= 0 else None
        except RecordDecodeError:
            original = None
        if original is None:
            return cmd.response(ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {h.offset}")
        props = dict(original.properties)
        props.pop(PROP_DELAY_FROM, None)
        props.pop(Prop.DELAY, None)
        props.setdefault(Prop.RETRY_TOPIC, original.topic)
        if not props.get(Prop.ORIGIN_MESSAGE_ID):
            props[Prop.ORIGIN_MESSAGE_ID] = original.offset_msg_id
        failure = clip_reason(cmd.remark)
        if failure:
            props[PROP_LAST_FAILURE] = failure
        limit = reconsume_limit(cmd.version, h.maxReconsumeTimes, sub)
        to_dlq = original.reconsume_times >= limit or h.delayLevel < 0
        if to_dlq:
            topic = dlq_topic(h.group)
            queue_id = 0
            if self.topics.ensure(topic, 1, PERM_READ | PERM_WRITE)[1]:
                self.topic_changed()
            props[PROP_DLQ_REASON] = (
                f"the consumer asked for the DLQ (delayLevel {h.delayLevel})"
                if h.delayLevel < 0
                else f"reconsumed {original.reconsume_times} times, the limit is {limit}"
            )
        else:
            topic = rt
            queue_id = self._random.randrange(sub.retry_queue_nums)
        record = reconsume_copy(original, topic, queue_id, self.store_host, props)
        if not to_dlq:
            record = self.redirect(record, h.delayLevel or 3 + original.reconsume_times)
        result = await store.put(record)
        code = put_status_code(result)
        if code not in (ResponseCode.SUCCESS, ResponseCode.FLUSH_DISK_TIMEOUT):
            return cmd.response(code, f"storing the retry message failed: {result.status.value}")
        if to_dlq:
            log.info(
                "message %s of group %s went to %s: %s",
                props.get(Prop.ORIGIN_MESSAGE_ID),
                h.group,
                topic,
                props[PROP_DLQ_REASON],
            )
        return cmd.response()
