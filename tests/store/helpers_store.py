"""Helpers for the message-store tests: small configurations, records, crash images and consistency checks."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from txmq.protocol.record import MessageRecord, Prop, decode_record
from txmq.store.config import StoreConfig
from txmq.store.message_store import MessageStore

SEGMENT = 64 * 1024


def small_config(root: Path | str, **overrides: Any) -> StoreConfig:
    """64 KiB segments, small consume-queue and index files: rolls happen after a few dozen records."""
    values: dict[str, Any] = {
        "store_path_root_dir": str(root),
        "mapped_file_size_commit_log": SEGMENT,
        "mapped_file_size_consume_queue": 20 * 256,
        "max_hash_slot_num": 1024,
        "max_index_num": 4096,
        "flush_interval_consume_queue": 60_000,  # checkpoints only when a test asks (or on close)
    }
    values.update(overrides)
    return StoreConfig(**values)


def make_record(
    topic: str = "T",
    queue_id: int = 0,
    body: bytes = b"hello",
    *,
    tags: str | None = None,
    keys: str | None = None,
    uniq: str | None = None,
    sys_flag: int = 0,
    **props: str,
) -> MessageRecord:
    properties = dict(props)
    if tags is not None:
        properties[Prop.TAGS] = tags
    if keys is not None:
        properties[Prop.KEYS] = keys
    if uniq is not None:
        properties[Prop.UNIQ_KEY] = uniq
    return MessageRecord(
        topic=topic,
        body=body,
        queue_id=queue_id,
        sys_flag=sys_flag,
        born_timestamp=1_700_000_000_000,
        born_host=("10.1.2.3", 40000),
        store_host=("10.9.8.7", 10911),
        properties=properties,
    )


def body_hash(body: bytes) -> str:
    return hashlib.sha1(body).hexdigest()


def crash_image(store: MessageStore, dest: Path) -> Path:
    """Copy a running store's files: what a kill -9 leaves on disk (abort marker, periodic checkpoint, page cache)."""
    shutil.copytree(store.root, dest)
    return dest


def segment_names(root: Path | str) -> list[str]:
    """The commit-log segment files (not a ``.alloc`` file being prepared), oldest first."""
    return sorted(n for n in os.listdir(os.path.join(root, "commitlog")) if len(n) == 20 and n.isdigit())


def last_segment(root: Path | str) -> Path:
    return Path(root, "commitlog", segment_names(root)[-1])


def queue_contents(store: MessageStore) -> dict[tuple[str, int], list[tuple[int, int, int]]]:
    """Every visible consume-queue entry, per queue, from its min offset."""
    out: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for topic, qid in sorted(store.queues()):
        lo = store.min_offset(topic, qid)
        hi = store.max_offset(topic, qid)
        entries: list[tuple[int, int, int]] = []
        while lo + len(entries) < hi:
            chunk = store.read_consume_queue(topic, qid, lo + len(entries), 500)
            assert chunk, f"{topic}:{qid} has a hole at {lo + len(entries)} below max {hi}"
            entries.extend(chunk)
        out[(topic, qid)] = entries
    return out


def assert_consistent(store: MessageStore) -> dict[tuple[str, int], list[MessageRecord]]:
    """Every visible CQ entry points at a valid record of that queue with that queue offset, offsets are dense,
    and nothing is visible past the end of the commit log. Returns the records per queue."""
    end = store.max_physical_offset()
    records: dict[tuple[str, int], list[MessageRecord]] = {}
    for (topic, qid), entries in queue_contents(store).items():
        first = store.min_offset(topic, qid)
        recs = []
        for i, (phys, size, _tags) in enumerate(entries):
            assert phys + size <= end, f"{topic}:{qid} offset {first + i} points past the log end {end}"
            data = store.read_record(phys, size)
            assert data is not None and len(data) == size
            rec = decode_record(data)  # checks the body CRC and the layout
            assert (rec.topic, rec.queue_id, rec.queue_offset, rec.physical_offset) == (topic, qid, first + i, phys)
            recs.append(rec)
        records[(topic, qid)] = recs
    return records
