"""The commit log as a replica sees it: a master reads whole records to ship (:func:`read_chunk`); a slave appends
the master's bytes verbatim, at the same offsets (:meth:`txmq.store.writer.Writer.append_replicated`)."""

from __future__ import annotations

from txmq.errors import StoreError
from txmq.protocol.record import BLANK_MAGIC_CODE, MAGIC_CODE
from txmq.protocol.record.layout import SIZE_MAGIC
from txmq.store.commit_log import CommitLog


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


def truncate_tail_offline(store_root: str, segment_size: int, offset: int) -> int:
    """Cut a closed store's commit log at ``offset`` (a record boundary) before it is opened: zero what follows,
    delete later segments, and leave the abort marker so that opening it runs crash recovery, which cuts the consume
    queues and the key index to the new end. Returns how many bytes of records were dropped (0: nothing was there)."""
    import os

    from txmq.store.checkpoint import AbortMarker

    commit_log = CommitLog(os.path.join(store_root, "commitlog"), segment_size)
    commit_log.load()
    try:
        segs = commit_log.segments
        if not segs:
            return 0
        end = segs[-1].start + commit_log.last_nonzero(segs[-1], 0)
        if end <= offset:
            return 0
        commit_log.truncate(offset)
    finally:
        commit_log.close()
    AbortMarker(os.path.join(store_root, "abort")).create()
    return end - offset
