"""The commit log as a replica sees it: a master reads whole records to ship (:func:`read_chunk`), a slave appends
the master's bytes verbatim, at the same offsets, and dispatches them into its consume queues and key index with the
same fields recovery replays (:func:`append_replicated`, run by the writer under its append lock)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from txmq.errors import StoreError
from txmq.protocol.record import BLANK_MAGIC_CODE, MAGIC_CODE, WalkResult, walk_segment
from txmq.protocol.record.layout import SIZE_MAGIC
from txmq.store.commit_log import CommitLog
from txmq.store.dispatch import DispatchRequest
from txmq.store.entry import dispatch_from_fields

if TYPE_CHECKING:
    from txmq.store.writer import Writer

log = logging.getLogger("txmq.store")


class ReplicaError(StoreError):
    """Bytes from a master that cannot continue this replica's commit log; nothing of them was written."""


def read_chunk(commit_log: CommitLog, start: int, end: int, confirmed: int) -> bytes:
    """Stored bytes from ``start`` (a record boundary) that end on a record boundary, within one segment, before
    ``min(end, confirmed)``; a record longer than the range is returned whole. Empty when nothing is there yet."""
    seg = commit_log.find_segment(start)
    if seg is None:
        return b""
    stop = min(end, confirmed, seg.end)
    if stop <= start:
        return b""
    data = commit_log.read(start, stop - start)
    if not data:
        return b""
    pos, n = 0, len(data)
    while pos + 8 <= n:
        size, magic = SIZE_MAGIC.unpack_from(data, pos)
        if magic == BLANK_MAGIC_CODE:
            if pos + size == n:  # the blank runs to the segment's end, which this range reaches
                pos = n
            break
        if magic != MAGIC_CODE or size <= 0:
            raise StoreError(f"commit log at {start + pos} holds no record (size {size}, magic 0x{magic:08X})")
        if pos + size > n:
            break
        pos += size
    if pos == 0:
        size, magic = SIZE_MAGIC.unpack_from(data, 0) if n >= 8 else (0, 0)
        if magic == BLANK_MAGIC_CODE or magic != MAGIC_CODE or start + size > min(confirmed, seg.end):
            return b""  # a blank whose end is not in the range yet, or the record is not all confirmed yet
        whole = commit_log.read(start, size)
        return whole or b""
    return data[:pos]


def append_replicated(writer: Writer, commit_log: CommitLog, offset: int, data: bytes) -> int:
    """Append ``data`` (whole records, maybe ending with a segment's end-of-file blank) at ``offset``, which must be
    this log's end; verify every record (magic, sizes, CRC, PHYSICALOFFSET, queue offsets in sequence), write,
    fdatasync, dispatch, publish. Returns the new end. Raises :class:`ReplicaError` and writes nothing on bad bytes."""
    published = writer._published
    if offset != published.written:
        raise ReplicaError(f"replicated bytes at {offset}, but this commit log ends at {published.written}")
    seg = commit_log.segment_for_write(offset)
    end = offset + len(data)
    if end > seg.end:
        raise ReplicaError(f"replicated bytes [{offset}, {end}) cross the segment end {seg.end}")
    result = WalkResult()
    records = list(walk_segment(data, base=offset, tail_room=0, check_crc=True, result=result))
    if result.blank:
        if end != seg.end:
            raise ReplicaError(f"an end-of-file blank at {result.end} that does not end at the segment end {seg.end}")
    elif result.end != end:
        raise ReplicaError(f"replicated bytes are not whole records: stopped at {result.end} ({result.reason})")
    next_offsets = writer._next_offsets
    touched: dict[tuple[str, int], int] = {}
    dispatches: list[DispatchRequest] = []
    delay_levels = writer._delay_levels
    last_ts = 0
    for phys, size, qid, qoff, sys_flag, ts, topic_raw, props_raw in records:
        d = dispatch_from_fields(phys, size, qid, qoff, sys_flag, ts, topic_raw, props_raw, delay_levels)
        if d.has_consume_queue:
            key = (d.topic, qid)
            want = touched.get(key, next_offsets.get(key, 0))
            if qoff != want:
                raise ReplicaError(f"record at {phys} has queue offset {qoff}, {d.topic}:{qid} expects {want}")
            touched[key] = qoff + 1
        dispatches.append(d)
        last_ts = ts
    health = writer._health
    try:
        commit_log.write(seg, offset - seg.start, [data])
        commit_log.flush(seg)  # a slave acknowledges only what is durable
    except BaseException as exc:
        health.fail(f"{type(exc).__name__}: {exc}")
        log.critical("replicated append failed; refusing further appends until restart", exc_info=True)
        raise
    writer._seg = None
    published.written = end
    commit_log.maybe_prepare(end)
    writer.consume_queue.put(dispatches)
    writer._indexer.enqueue(dispatches)
    next_offsets.update(touched)
    published.flushed = end
    if touched:
        published.visible.update(touched)
    published.confirmed = end
    if last_ts:
        published.snap = (end, last_ts, last_ts)
    else:
        published.snap = (end, published.snap[1], published.snap[2])
    stats = writer._stats
    stats.groups += 1
    stats.put_messages += len(dispatches)
    stats.put_bytes += len(data)
    writer._complete([], touched)
    return end
