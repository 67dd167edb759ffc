"""What the append pipeline tells the consume queues and the key index about each stored record."""

from __future__ import annotations

from dataclasses import dataclass

from txmq._hotpath import reduce_by_fields


@dataclass(slots=True, init=False)
class DispatchRequest:
    """One stored record, as the consume-queue and index builders see it (read only, never changed once built).

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

    # Written out rather than generated (and not frozen, whose generated __init__ sets each field through
    # object.__setattr__): mypyc compiles this one, while a dataclass's generated __init__ runs interpreted, about
    # 3 us per record on the writer thread. tests/protocol/test_constructors.py holds it to the fields.
    def __init__(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        physical_offset: int,
        size: int,
        tags_code: int,
        store_timestamp: int,
        sys_flag: int,
        keys: str | None = None,
        uniq_key: str | None = None,
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.physical_offset = physical_offset
        self.size = size
        self.tags_code = tags_code
        self.store_timestamp = store_timestamp
        self.sys_flag = sys_flag
        self.keys = keys
        self.uniq_key = uniq_key

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return reduce_by_fields(self)  # copy and pickle (the written-out __init__ needs its arguments)

    @property
    def has_consume_queue(self) -> bool:
        """NOT and COMMIT transaction types get consume-queue entries; PREPARED and ROLLBACK do not."""
        return self.sys_flag & 0xC in (0x0, 0x8)

    @property
    def indexed(self) -> bool:
        """The key index skips ROLLBACK records."""
        return self.sys_flag & 0xC != 0xC
