"""What the append pipeline tells the consume queues and the key index about each stored record."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class DispatchRequest:
    """One stored record, as the consume-queue and index builders see it.

    Built by the single writer after the record's offsets are assigned, and again by recovery when it rebuilds the
    consume queues and the index from the commit log.
    """

    topic: str
    queue_id: int
    queue_offset: int  # logical offset in its consume queue (meaningful only when has_consume_queue)
    physical_offset: int  # commit-log offset of the record
    size: int  # TOTALSIZE
    tags_code: int  # CQ tagsCode: the tag hash, or the delivery time for SCHEDULE_TOPIC_XXXX
    store_timestamp: int  # ms
    sys_flag: int
    keys: str | None = None  # raw KEYS property (space-separated)
    uniq_key: str | None = None  # UNIQ_KEY property

    @property
    def has_consume_queue(self) -> bool:
        """NOT and COMMIT transaction types get consume-queue entries; PREPARED and ROLLBACK do not."""
        return self.sys_flag & 0xC in (0x0, 0x8)

    @property
    def indexed(self) -> bool:
        """The key index skips ROLLBACK records."""
        return self.sys_flag & 0xC != 0xC
