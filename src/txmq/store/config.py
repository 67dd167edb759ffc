"""Store configuration: :class:`StoreConfig`, with RocketMQ's ``broker.conf`` key names and defaults."""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from txmq.errors import ConfigError


class FlushDiskType(enum.Enum):
    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


class Preallocate(enum.Enum):
    """How a new commit-log segment gets its blocks before the first write."""

    FALLOCATE = "fallocate"  # posix_fallocate when needed: fast, but each first write converts an unwritten extent
    ZERO = "zero"  # the next segment is zero-filled in the background (RocketMQ's warm-up); fallocate as fallback
    NONE = "none"  # ftruncate only: a sparse file


CONSUME_QUEUE_ENTRY_SIZE = 20

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"


def _default_root() -> str:
    return os.path.join(os.path.expanduser("~"), "store")


@dataclass(slots=True)
class StoreConfig:
    """Message-store settings. Defaults equal RocketMQ 4.x's ``MessageStoreConfig`` unless noted.

    Deviation: ``flush_disk_type`` defaults to SYNC_FLUSH (RocketMQ: ASYNC_FLUSH) because txmq is durable by default.
    """

    store_path_root_dir: str = field(default_factory=_default_root)
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * CONSUME_QUEUE_ENTRY_SIZE  # bytes, 20 per entry
    flush_disk_type: FlushDiskType = FlushDiskType.SYNC_FLUSH
    flush_interval_commit_log: int = 500  # ms, ASYNC_FLUSH only
    flush_interval_consume_queue: int = 1000  # ms; also how often the checkpoint is written
    # ms, txmq only: a checkpoint flushes the key index when this long has passed since its last flush, or once
    # 100 000 records were indexed since then. Its pages are scattered (one hash slot per key), so each flush is
    # random IO that competes with the commit log's fdatasync; after a crash the index is replayed from the log.
    flush_interval_index: int = 10_000
    file_reserved_time: int = 72  # hours
    delete_when: str = "04"  # hours of the day (local time), ';'-separated
    disk_max_used_space_ratio: int = 75  # percent
    disk_space_clean_forcibly_ratio: int = 85  # percent; RocketMQ's -Drocketmq.broker.diskSpaceCleanForciblyRatio
    # RocketMQ's default: above the forcibly ratio the oldest segments go even before fileReservedTime, consumed or
    # not. False keeps every unexpired message; a full disk then refuses sends until space is freed.
    clean_file_forcibly_enable: bool = True
    clean_resource_interval: int = 10_000  # ms between retention checks
    delete_commit_log_files_batch_max: int = 10  # segments deleted per retention run
    max_message_size: int = 1024 * 1024 * 4  # body bytes
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    check_crc_on_recover: bool = True
    scrub_commit_log_on_start: bool = True  # txmq only: verify every segment in the background after a start
    check_crc_on_read: bool = True  # txmq only: check every record a read serves (frame and body CRC)
    warm_mapped_file_enable: bool = False  # True selects Preallocate.ZERO
    preallocate: Preallocate = Preallocate.ZERO  # txmq only
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    # us, txmq only, SYNC_FLUSH: the group-commit wait. When the last group held several requests and fewer have
    # come since, the writer waits up to this long for as many before it writes and syncs the next group (their
    # answers just went out, so their clients' next requests are on their way). It ends as soon as they are there.
    # Concurrent clients then share one fdatasync instead of missing it by a few microseconds; a lone client (one
    # request per group) never waits. Like MySQL's binlog_group_commit_sync_delay with its no-delay count taken
    # from the last group. 0 turns it off.
    group_commit_wait_us: int = 300
    max_hash_slot_num: int = 5_000_000  # key index slots per index file
    max_index_num: int = 20_000_000  # key index entries per index file

    def __post_init__(self) -> None:
        if isinstance(self.flush_disk_type, str):
            self.flush_disk_type = FlushDiskType(self.flush_disk_type)
        if isinstance(self.preallocate, str):
            self.preallocate = Preallocate(self.preallocate)
        if self.mapped_file_size_commit_log < 4096:
            raise ConfigError(f"mappedFileSizeCommitLog must be at least 4096, got {self.mapped_file_size_commit_log}")
        if self.mapped_file_size_consume_queue % CONSUME_QUEUE_ENTRY_SIZE:
            raise ConfigError("mappedFileSizeConsumeQueue must be a multiple of 20 (the entry size)")
        if not 0 <= self.group_commit_wait_us <= 100_000:
            raise ConfigError(f"groupCommitWaitMicros must be within 0..100000, got {self.group_commit_wait_us}")
        if not 1 <= self.disk_max_used_space_ratio <= 95:
            raise ConfigError("diskMaxUsedSpaceRatio must be within 1..95 (RocketMQ clamps to that range)")
        self.delay_levels_ms()  # validate

    @property
    def sync_flush(self) -> bool:
        return self.flush_disk_type is FlushDiskType.SYNC_FLUSH

    @property
    def consume_queue_entries_per_file(self) -> int:
        return self.mapped_file_size_consume_queue // CONSUME_QUEUE_ENTRY_SIZE

    @property
    def effective_preallocate(self) -> Preallocate:
        return Preallocate.ZERO if self.warm_mapped_file_enable else self.preallocate

    def delete_hours(self) -> set[int]:
        hours: set[int] = set()
        for part in self.delete_when.split(";"):
            part = part.strip()
            if part:
                hours.add(int(part))
        return hours

    def delay_levels_ms(self) -> list[int]:
        """messageDelayLevel as milliseconds; level ``n`` is element ``n - 1``."""
        units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
        out: list[int] = []
        for token in self.message_delay_level.split():
            unit = units.get(token[-1:])
            if unit is None or not token[:-1].isdigit():
                raise ConfigError(f"messageDelayLevel entry {token!r} is not <number><s|m|h|d>")
            out.append(int(token[:-1]) * unit)
        return out

    # -- RocketMQ key names ------------------------------------------------------------------------------------

    @classmethod
    def from_properties(cls, props: Mapping[str, Any], **overrides: Any) -> StoreConfig:
        """Build from ``broker.conf``-style keys; keys the store does not know are ignored."""
        kwargs: dict[str, Any] = {}
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for key, value in props.items():
            name = ROCKETMQ_KEYS.get(key)
            if name is None:
                continue
            kwargs[name] = _coerce(key, value, types[name])
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **overrides: Any) -> StoreConfig:
        """Load a RocketMQ ``broker.conf`` (``key=value`` lines, ``#`` comments)."""
        props: dict[str, str] = {}
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line or line.startswith("#") or "=" not in line:
                    continue
                key, _, value = line.partition("=")
                props[key.strip()] = value.strip()
        return cls.from_properties(props, **overrides)

    def to_properties(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, name in ROCKETMQ_KEYS.items():
            value = getattr(self, name)
            if isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, bool):
                value = "true" if value else "false"
            out[key] = str(value)
        return out


ROCKETMQ_KEYS: dict[str, str] = {
    "storePathRootDir": "store_path_root_dir",
    "mappedFileSizeCommitLog": "mapped_file_size_commit_log",
    "mappedFileSizeConsumeQueue": "mapped_file_size_consume_queue",
    "flushDiskType": "flush_disk_type",
    "flushIntervalCommitLog": "flush_interval_commit_log",
    "flushIntervalConsumeQueue": "flush_interval_consume_queue",
    "flushIntervalIndex": "flush_interval_index",
    "fileReservedTime": "file_reserved_time",
    "deleteWhen": "delete_when",
    "diskMaxUsedSpaceRatio": "disk_max_used_space_ratio",
    "cleanFileForciblyEnable": "clean_file_forcibly_enable",
    "cleanResourceInterval": "clean_resource_interval",
    "deleteCommitLogFilesBatchMax": "delete_commit_log_files_batch_max",
    "maxMessageSize": "max_message_size",
    "maxTransferBytesOnMessageInMemory": "max_transfer_bytes_on_message_in_memory",
    "maxTransferCountOnMessageInMemory": "max_transfer_count_on_message_in_memory",
    "checkCRCOnRecover": "check_crc_on_recover",
    "scrubCommitLogOnStart": "scrub_commit_log_on_start",
    "checkCRCOnRead": "check_crc_on_read",
    "warmMapedFileEnable": "warm_mapped_file_enable",
    "messageDelayLevel": "message_delay_level",
    "groupCommitWaitMicros": "group_commit_wait_us",
    "maxHashSlotNum": "max_hash_slot_num",
    "maxIndexNum": "max_index_num",
}


def _coerce(key: str, value: Any, type_name: Any) -> Any:
    text = str(type_name)
    try:
        if "bool" in text:
            if isinstance(value, bool):
                return value
            lowered = str(value).strip().lower()
            if lowered not in ("true", "false"):
                raise ValueError(value)
            return lowered == "true"
        if text == "int":
            return int(value)
        if "FlushDiskType" in text:
            return FlushDiskType(str(value).strip())
        return str(value)
    except ValueError as exc:
        raise ConfigError(f"{key}={value!r} is not a valid value") from exc
