"""The store's reads: PULL's getMessage with tag and record filters, records by offset, queries by key and by time,
and the positions readers may see. Readers never take the writer's locks: they read what the writer published."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txmq.errors import RecordDecodeError, StoreClosedError
from txmq.protocol.record import (
    MIN_RECORD_SIZE,
    MessageRecord,
    RecordView,
    check_records,
    decode_record,
    read_store_timestamp,
    record_damage,
)
from txmq.store.background import KeyIndexer
from txmq.store.commit_log import CommitLog, segment_name
from txmq.store.config import StoreConfig
from txmq.store.damage import DamageLog
from txmq.store.state import Health, Published

if TYPE_CHECKING:
    from txmq.store.message_store import ConsumeQueueLike, KeyIndexLike


class GetStatus(enum.Enum):
    """RocketMQ's GetMessageStatus."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(slots=True)
class GetMessageResult:
    """A PULL's worth of records: ``buffers`` joined is the response body (stored bytes, unchanged)."""

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffers: list[bytes] = field(default_factory=list)
    message_count: int = 0
    total_size: int = 0

    @property
    def body(self) -> bytes:
        return self.buffers[0] if len(self.buffers) == 1 else b"".join(self.buffers)


class Reads:
    """Reads over the commit log, the consume queues and the key index, bounded by the published positions."""

    def __init__(
        self,
        commit_log: CommitLog,
        indexer: KeyIndexer,
        config: StoreConfig,
        published: Published,
        health: Health,
        damage: DamageLog | None = None,
    ) -> None:
        self.consume_queue: ConsumeQueueLike = None  # type: ignore[assignment]  # set when the store opens
        self.key_index: KeyIndexLike = None  # type: ignore[assignment]
        self._commit_log = commit_log
        self._indexer = indexer
        self._published = published
        self._health = health
        self._config = config
        self._damage = damage if damage is not None else DamageLog(None)

    def _refuse(self, phys: int, why: str) -> None:
        """A damaged record is never served: counted, and logged once with its offset and file."""
        seg = self._commit_log.find_segment(phys)
        where = seg.path if seg is not None else segment_name(phys - phys % self._commit_log.segment_size)
        self._damage.read_refused(phys, where, why)

    def _sound(self, data: bytes, phys: int) -> bool:
        if self._damage.contains(phys):
            self._refuse(phys, "in a damaged range on record")
            return False
        if not self._config.check_crc_on_read:
            return True
        why = record_damage(data, 0, len(data), phys)
        if why is not None:
            self._refuse(phys, why)
            return False
        return True

    def _check_readable(self) -> None:
        state = self._health.state
        if state not in ("open", "closing"):
            raise StoreClosedError(f"the store is {state}")

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._published.visible.get((topic, queue_id), 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        self._check_readable()
        return self.consume_queue.min_offset(topic, queue_id)

    def queues(self) -> list[tuple[str, int]]:
        return list(self._published.visible)

    def read_consume_queue(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[tuple[int, int, int]]:
        self._check_readable()
        count = min(max_count, self._published.visible.get((topic, queue_id), 0) - offset)
        if count <= 0:
            return []
        return self.consume_queue.read(topic, queue_id, offset, count)

    def read_bytes(self, phys: int, size: int) -> bytes | None:
        self._check_readable()
        if phys < 0 or size <= 0 or phys + size > self._published.confirmed:
            return None
        return self._commit_log.read(phys, size)

    def read_record(self, phys: int, size: int | None = None) -> bytes | None:
        self._check_readable()
        confirmed = self._published.confirmed
        if phys < 0 or phys >= confirmed:
            return None
        if self._damage.contains(phys):
            self._refuse(phys, "in a damaged range on record")
            return None
        data = self._commit_log.read_record_bytes(phys, size)
        if data is None or phys + len(data) > self._published.confirmed:
            return None
        return data if self._sound(data, phys) else None

    def read_message(self, phys: int, size: int | None = None) -> MessageRecord | None:
        data = self.read_record(phys, size)
        if data is None:
            return None
        try:
            return decode_record(data)
        except RecordDecodeError as exc:  # topic or properties that are not text: damaged outside the body
            self._refuse(phys, str(exc))
            return None

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int | None,
        max_bytes: int | None,
        tags_codes: Iterable[int] | None,
        message_filter: Callable[[bytes], bool] | None,
    ) -> GetMessageResult:
        self._check_readable()
        cfg = self._config
        max_count = cfg.max_transfer_count_on_message_in_memory if max_count is None else max(1, max_count)
        max_bytes = cfg.max_transfer_bytes_on_message_in_memory if max_bytes is None else max_bytes
        codes = None if tags_codes is None else set(tags_codes)
        max_off = self.max_offset(topic, queue_id)
        min_off = self.consume_queue.min_offset(topic, queue_id)
        if max_off == 0:
            return GetMessageResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, min_off, max_off)
        if offset < min_off:
            return GetMessageResult(GetStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if offset == max_off:
            return GetMessageResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
        if offset > max_off:
            nxt = min_off if min_off == 0 else max_off
            return GetMessageResult(GetStatus.OFFSET_OVERFLOW_BADLY, nxt, min_off, max_off)
        if message_filter is not None:  # RocketMQ reads at most 16 000 bytes of consume queue (800 entries)
            scan = max(800, max_count)
        else:
            scan = max_count if codes is None else max(16000, max_count * 20)
        entries = self.read_consume_queue(topic, queue_id, offset, scan)
        if not entries:
            return GetMessageResult(GetStatus.OFFSET_FOUND_NULL, offset, min_off, max_off)
        commit_log = self._commit_log
        log_min = commit_log.min_offset
        damage = self._damage
        picked: list[tuple[int, int]] = []
        total = 0
        consumed = 0
        for phys, size, code in entries:
            if len(picked) >= max_count or (picked and total + size > max_bytes):
                break
            consumed += 1
            if phys < log_min:  # its segment was deleted by retention
                continue
            if codes is not None and code not in codes:
                continue
            if damage.contains(phys):
                self._refuse(phys, "in a damaged range on record")
                continue
            if message_filter is not None:
                data = commit_log.read(phys, size)
                if data is None or not message_filter(data):
                    continue
            picked.append((phys, size))
            total += size
        buffers = commit_log.read_many(picked) if picked else []
        # Every served record is checked (frame and body CRC) where it lies in the buffers read; a damaged one is
        # left out and the consumer moves past it, as RocketMQ treats a message it cannot decode.
        if cfg.check_crc_on_read:
            count, damaged = check_records(buffers, picked)  # count < len(picked): a segment vanished mid-read
        else:
            count, damaged = _covered(buffers, picked), []
        if damaged:
            for i, why in damaged:
                self._refuse(picked[i][0], why)
            bad = {i for i, _why in damaged}
            buffers = self._without(buffers, picked[:count], bad)
            count -= len(bad)
            read = sum(len(b) for b in buffers)
        else:
            read = total if count == len(picked) else sum(size for _phys, size in picked[:count])
        if not buffers:
            status = GetStatus.NO_MATCHED_MESSAGE if consumed else GetStatus.OFFSET_FOUND_NULL
            return GetMessageResult(status, offset + consumed, min_off, max_off)
        return GetMessageResult(GetStatus.FOUND, offset + consumed, min_off, max_off, buffers, count, read)

    @staticmethod
    def _without(buffers: list[bytes], picked: list[tuple[int, int]], bad: set[int]) -> list[bytes]:
        """``buffers`` (``picked``'s records back to back) without the records whose index is in ``bad``."""
        out: list[bytes] = []
        bi = 0
        pos = 0
        for i, (_phys, size) in enumerate(picked):
            buf = buffers[bi]
            if i not in bad:
                out.append(buf[pos : pos + size])
            pos += size
            if pos >= len(buf):
                bi += 1
                pos = 0
        return out

    def store_time_of(self, phys: int, size: int) -> int:
        """STORETIMESTAMP of the record at ``phys``, or -1 when it is gone."""
        commit_log = self._commit_log
        head = commit_log.read(phys, MIN_RECORD_SIZE) if phys >= commit_log.min_offset else None
        if head is None:
            return -1
        return read_store_timestamp(head)

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        entries = self.read_consume_queue(topic, queue_id, offset, 1)
        if not entries:
            return None
        ts = self.store_time_of(entries[0][0], entries[0][1])
        return ts if ts >= 0 else None

    def earliest_store_time(self, topic: str, queue_id: int) -> int | None:
        return self.store_time_at(topic, queue_id, self.min_offset(topic, queue_id))

    def last_store_time(self, topic: str, queue_id: int) -> int | None:
        max_off = self.max_offset(topic, queue_id)
        return self.store_time_at(topic, queue_id, max_off - 1) if max_off > 0 else None

    def earliest_message_time(self) -> int | None:
        self._check_readable()
        segs = self._commit_log.segments
        if not segs or self._published.confirmed <= segs[0].start:
            return None
        return self._commit_log.first_store_timestamp(segs[0])

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        self._check_readable()
        offset = self.consume_queue.search_by_timestamp(topic, queue_id, timestamp, self.store_time_of)
        return min(offset, self.max_offset(topic, queue_id))

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> list[int]:
        self._check_readable()
        self._indexer.drain()  # acknowledged records the indexer has not reached yet
        hits = self.key_index.query(topic, key, max_num, begin_ts, end_ts)
        topic_bytes = topic.encode()
        confirmed = self._published.confirmed
        out: list[int] = []
        for phys in hits:
            if phys >= confirmed:
                continue
            data = self._commit_log.read_record_bytes(phys)
            if data is None or not self._sound(data, phys):
                continue
            try:
                record = RecordView(data)
                if record.topic_bytes != topic_bytes or not begin_ts <= record.store_timestamp <= end_ts:
                    continue
                found = key == record.uniq_key or key in record.keys
            except RecordDecodeError:
                continue
            if found:
                out.append(phys)
                if len(out) >= max_num:
                    break
        return out


def _covered(buffers: list[bytes], picked: list[tuple[int, int]]) -> int:
    """How many of ``picked`` the merged reads ``buffers`` hold (fewer when a segment vanished mid-read)."""
    left = sum(len(b) for b in buffers)
    count = 0
    for _phys, size in picked:
        if size > left:
            break
        left -= size
        count += 1
    return count
