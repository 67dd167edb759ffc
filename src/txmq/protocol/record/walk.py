"""Walking the records of a commit-log segment buffer, stopping cleanly at its end, a blank, or a torn tail.

One loop serves crash recovery (verify everything, yield the fields the consume queues and index need), the Spark
store source (views of every record in a byte range, skipping a record whose CRC alone fails) and tests. Where and
why the walk stopped lands in a :class:`WalkResult`: zeros and blanks are a clean end, anything else is not.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from txmq.protocol.record.layout import (
    BLANK_HEADER_SIZE,
    BLANK_MAGIC_CODE,
    BODY_CRC_POS,
    BORN_V6,
    HEAD_TO_SYS_FLAG,
    I32,
    I64,
    MAGIC_CODE,
    MAX_TOPIC_BYTES,
    MIN_RECORD_SIZE,
    PHYSICAL_OFFSET_POS,
    SIZE_MAGIC,
    STORE_TIMESTAMP_POS_BY_BORN_V6,
    STORE_V6,
    SYS_FLAG_POS,
    U16,
    V6_EXTRA,
    body_len_pos,
)
from txmq.protocol.record.view import RecordView

# (phys, size, queue_id, queue_offset, sys_flag, store_timestamp, topic bytes, properties bytes)
ScannedRecord = tuple[int, int, int, int, int, int, bytes, bytes]

_BODY_LEN_POS_V4: Final = body_len_pos(0)


@dataclass(slots=True)
class WalkResult:
    """Where a walk stopped and why. ``end`` is the first offset (``base``-relative, like PHYSICALOFFSET) that is
    not a verified record."""

    start: int = 0
    end: int = 0
    reason: str = "end of data"
    clean_end: bool = True  # stopped at zeros, a well-formed blank, the end of the buffer or of the range
    blank: bool = False  # stopped at a well-formed end-of-file blank: the log continues in the next segment
    records: int = 0
    bytes: int = 0
    skipped: int = 0  # records passed over because their body CRC failed (``skip_bad_crc``)


def walk_segment(
    buf: Any,
    *,
    base: int = 0,
    start: int = 0,
    limit: int | None = None,
    check_crc: bool = True,
    check_physical_offset: bool = True,
    tail_room: int = BLANK_HEADER_SIZE,
    yield_from: int = 0,
    hop_to: int = 0,
    stop_at: int | None = None,
    skip_bad_crc: bool = False,
    on_skip: Callable[[int, int, str], None] | None = None,  # (phys, size, why)
    views: bool = False,
    result: WalkResult | None = None,
) -> Iterator[Any]:
    """Walk the records of ``buf[start:limit]``, a segment whose first byte is commit-log offset ``base``.

    Yields a :data:`ScannedRecord` per verified record at or past ``yield_from`` (``base``-relative), or a
    :class:`RecordView` when ``views``. Records before ``yield_from`` are verified only; records before ``hop_to``
    are chained by TOTALSIZE without verification (a partition that starts mid-segment). The walk stops before
    ``stop_at``, at zeros, at a blank, or at the first record that is not valid: a bad magic, an impossible size
    (a record leaves ``tail_room`` bytes for the blank a writer puts after it), a PHYSICALOFFSET that disagrees
    with its position, field lengths that do not add up, or a body CRC mismatch (skipped instead when
    ``skip_bad_crc``: its size still chains to the next record).
    """
    res = result if result is not None else WalkResult()
    res.start = res.end = base + start
    view = memoryview(buf)
    if limit is None:
        limit = len(view)
    stop = limit if stop_at is None else min(limit, stop_at - base)
    head = HEAD_TO_SYS_FLAG.unpack_from
    head_size = HEAD_TO_SYS_FLAG.size
    size_magic = SIZE_MAGIC.unpack_from
    i32 = I32.unpack_from
    i64 = I64.unpack_from
    u16 = U16.unpack_from
    crc32 = zlib.crc32
    ts_by_v6 = STORE_TIMESTAMP_POS_BY_BORN_V6
    yield_pos = max(yield_from - base, hop_to - base)
    pos = start
    records = nbytes = skipped = 0
    reason = ""  # why the walk stopped; "" while it goes on (a str from the start: see the ``finally``)
    clean = True
    try:
        if pos < hop_to - base:
            pos, reason = _hop(view, pos, hop_to - base, limit, base)
        while not reason:
            phys = base + pos
            if pos >= stop:
                reason = "end of the range" if stop < limit else "end of the buffer"
                break
            remaining = limit - pos
            if remaining < BLANK_HEADER_SIZE:
                reason, clean = f"only {remaining} bytes left in the segment at {phys}", False
                break
            if remaining >= head_size:
                size, magic, crc, queue_id, _flag, queue_offset, rec_phys, sys_flag = head(view, pos)
            else:
                size, magic = size_magic(view, pos)
            if magic != MAGIC_CODE:
                if magic == BLANK_MAGIC_CODE:
                    if size != remaining:
                        reason = f"end-of-file blank at {phys} says {size} bytes but {remaining} are left"
                        clean = False
                    else:
                        reason = f"end-of-file blank at {phys}"
                        res.blank = True
                elif size != 0 or magic != 0:
                    reason, clean = f"garbage header at {phys} (size {size}, magic 0x{magic:08X})", False
                else:
                    reason = "end of data"
                break
            if size < MIN_RECORD_SIZE or size + tail_room > remaining:
                reason = f"impossible record size {size} at {phys} ({remaining} bytes left in the segment)"
                clean = False
                break
            if check_physical_offset and rec_phys != phys:
                reason, clean = f"record at {phys} says its PHYSICALOFFSET is {rec_phys}", False
                break
            end = pos + size
            body_len_at = pos + _BODY_LEN_POS_V4
            if sys_flag & BORN_V6:
                body_len_at += V6_EXTRA
            if sys_flag & STORE_V6:
                body_len_at += V6_EXTRA
            if body_len_at + 4 > end:
                reason, clean = f"record at {phys}: hosts do not fit in TOTALSIZE {size}", False
                break
            (body_len,) = i32(view, body_len_at)
            body_start = body_len_at + 4
            topic_len_at = body_start + body_len
            if body_len < 0 or topic_len_at + 1 > end:
                reason = f"record at {phys}: body length {body_len} does not fit in TOTALSIZE {size}"
                clean = False
                break
            topic_len = view[topic_len_at]
            props_len_at = topic_len_at + 1 + topic_len
            if topic_len == 0 or topic_len > MAX_TOPIC_BYTES or props_len_at + 2 > end:
                reason, clean = f"record at {phys}: topic length {topic_len} is invalid", False
                break
            (props_len,) = u16(view, props_len_at)
            if props_len_at + 2 + props_len != end:
                reason, clean = f"record at {phys}: field lengths do not add up to TOTALSIZE {size}", False
                break
            if check_crc and crc32(view[body_start:topic_len_at]) & 0x7FFFFFFF != crc:
                why = f"body CRC mismatch in record at {phys}"
                if not skip_bad_crc:
                    reason, clean = why, False
                    break
                skipped += 1
                if on_skip is not None:
                    on_skip(phys, size, why)
                pos = end
                continue
            records += 1
            nbytes += size
            if pos >= yield_pos:
                if views:
                    yield RecordView.trusted(
                        buf,
                        pos,
                        (
                            size,
                            sys_flag,
                            body_start - pos,
                            body_len,
                            topic_len_at + 1 - pos,
                            topic_len,
                            props_len_at + 2 - pos,
                            props_len,
                        ),
                    )
                else:
                    (store_ts,) = i64(view, pos + ts_by_v6[(sys_flag >> 4) & 1])
                    yield (
                        phys,
                        size,
                        queue_id,
                        queue_offset,
                        sys_flag,
                        store_ts,
                        bytes(view[topic_len_at + 1 : props_len_at]),
                        bytes(view[props_len_at + 2 : end]),
                    )
            pos = end
    finally:
        view.release()
        res.end = base + pos
        # A walk closed early (GeneratorExit at a yield) gets here with ``reason`` still "". It was once
        # ``str | None``, which mypyc's generator read back as a ``str`` here and raised TypeError on None.
        res.reason = reason or "closed by its reader"
        res.clean_end = clean
        res.records += records
        res.bytes += nbytes
        res.skipped += skipped


def _hop(view: memoryview, pos: int, target: int, limit: int, base: int) -> tuple[int, str]:
    """From the record at ``pos``, chain by TOTALSIZE (magic and size checked, nothing else) to the first record
    starting at or past ``target``: its position, and ""; or where the chain broke, and why."""
    size_magic = SIZE_MAGIC.unpack_from
    while pos < target:
        if limit - pos < BLANK_HEADER_SIZE:
            return pos, "end of the buffer before the range"
        size, magic = size_magic(view, pos)
        if magic != MAGIC_CODE or size < MIN_RECORD_SIZE:
            return pos, f"no record chain to the range at {base + pos}"
        pos += size
    return pos, ""


_STARTS_CHUNK: Final = 16 << 20  # record_starts copies a buffer (an mmap) in pieces of this size


def record_starts(buf: Any, points: list[int], *, start: int = 0) -> list[int]:
    """For each of ``points`` (buffer positions, ascending), where the first record starting at or past it begins,
    chaining by TOTALSIZE from the record at ``start`` the way :func:`walk_segment` hops to ``hop_to``; -1 for a
    point the chain does not reach (zeros, a blank or garbage before it). One pass over the buffer for all points:
    a reader that splits a segment into ranges finds every range's first record at once, so each range's walk
    starts right there instead of hopping from the segment's start.

    The buffer (``bytes``, an mmap or any buffer) is read in ``bytes`` pieces, whose headers compiled code reads
    byte by byte: a hop costs a few array reads instead of a struct call, which matters when a store of millions
    of records is split on the driver before any task runs."""
    size = len(buf)
    whole = isinstance(buf, bytes)
    data: bytes = buf if whole else b""
    at = 0
    out: list[int] = []
    pos = start
    broken = False
    for point in points:
        while not broken and pos < point:
            if size - pos < BLANK_HEADER_SIZE:
                broken = True  # the end of the buffer before the point
                break
            if pos + 8 > at + len(data):
                at = pos
                data = bytes(buf[pos : min(size, pos + _STARTS_CHUNK)])  # an mmap's slice is bytes already
            q = pos - at
            rec_size = _be32(data, q)
            if rec_size & 0x80000000:
                rec_size -= 0x100000000
            if _be32(data, q + 4) != MAGIC_CODE or rec_size < MIN_RECORD_SIZE:
                broken = True  # no record chain to the point
                break
            pos += rec_size
        out.append(-1 if broken else pos)
    return out


def iter_views(buf: Any, **options: Any) -> Iterator[RecordView]:
    """:func:`walk_segment` yielding a :class:`RecordView` per record."""
    return walk_segment(buf, views=True, **options)  # type: ignore[no-any-return]


_MAGIC_BYTES = MAGIC_CODE.to_bytes(4, "big")
_SYS_FLAG_LOW_BYTE: Final = SYS_FLAG_POS + 3  # the last byte of the big-endian SYSFLAG: the host bits live there


def _be32(buf: bytes, at: int) -> int:
    return (buf[at] << 24) | (buf[at + 1] << 16) | (buf[at + 2] << 8) | buf[at + 3]


def record_damage(buf: bytes, pos: int, size: int, phys: int) -> str | None:
    """Why ``buf[pos:pos + size]`` is not the sound record the store put at commit-log offset ``phys``, or None.

    Checks what a served record must satisfy: its TOTALSIZE, magic and PHYSICALOFFSET, field lengths that add up,
    and the body CRC (RocketMQ's layout covers only the body with a CRC; damage to the topic or properties that
    leaves the lengths intact cannot be seen). Called for every record a read serves, so fields are read byte by
    byte (no struct tuples) and the CRC, about three quarters of the cost for a 1 KiB body, dominates.
    """
    if size < MIN_RECORD_SIZE or pos < 0 or pos + size > len(buf):
        return f"record at {phys}: {size} bytes do not fit the read"
    magic = _be32(buf, pos + 4)
    if magic != MAGIC_CODE:
        return f"no record at {phys} (magic 0x{magic:08X})"
    rec_size = _be32(buf, pos)
    if rec_size != size:
        return f"record at {phys} says TOTALSIZE {rec_size}, its queue entry {size}"
    rec_phys = (_be32(buf, pos + PHYSICAL_OFFSET_POS) << 32) | _be32(buf, pos + PHYSICAL_OFFSET_POS + 4)
    if rec_phys != phys:
        return f"record at {phys} says its PHYSICALOFFSET is {rec_phys}"
    end = pos + size
    sys_flag = buf[pos + _SYS_FLAG_LOW_BYTE]
    body_len_at = pos + _BODY_LEN_POS_V4
    if sys_flag & BORN_V6:
        body_len_at += V6_EXTRA
    if sys_flag & STORE_V6:
        body_len_at += V6_EXTRA
    if body_len_at + 4 > end:
        return f"record at {phys}: hosts do not fit in TOTALSIZE {size}"
    body_len = _be32(buf, body_len_at)
    body_start = body_len_at + 4
    topic_len_at = body_start + body_len
    if body_len >= 0x80000000 or topic_len_at + 1 > end:
        return f"record at {phys}: body length {body_len} does not fit in TOTALSIZE {size}"
    topic_len = buf[topic_len_at]
    props_len_at = topic_len_at + 1 + topic_len
    if topic_len == 0 or topic_len > MAX_TOPIC_BYTES or props_len_at + 2 > end:
        return f"record at {phys}: topic length {topic_len} is invalid"
    props_len = (buf[props_len_at] << 8) | buf[props_len_at + 1]
    if props_len_at + 2 + props_len != end:
        return f"record at {phys}: field lengths do not add up to TOTALSIZE {size}"
    if zlib.crc32(buf[body_start:topic_len_at]) & 0x7FFFFFFF != _be32(buf, pos + BODY_CRC_POS):
        return f"body CRC mismatch in record at {phys}"
    return None


def check_records(buffers: list[bytes], located: list[tuple[int, int]]) -> tuple[int, list[tuple[int, str]]]:
    """Check the records ``located`` (commit-log offset, size), read back to back into ``buffers`` (a run of
    neighbours per buffer, as the store's merged reads return them). Returns how many of them the buffers hold and
    ``(index, why)`` for each damaged one; the list is empty in the normal case."""
    damaged: list[tuple[int, str]] = []
    nbuf = len(buffers)
    bi = 0
    pos = 0
    count = 0
    for phys, size in located:
        if bi >= nbuf:
            break
        buf = buffers[bi]
        why = record_damage(buf, pos, size, phys)
        if why is not None:
            damaged.append((count, why))
        count += 1
        pos += size
        if pos >= len(buf):
            bi += 1
            pos = 0
    return count, damaged


def find_record(buf: Any, base: int, start: int, limit: int) -> int:
    """The first position at or after ``start`` (and before ``limit``) where a sound record begins, or -1.

    How a walk gets past damage: a record carries its own commit-log offset (PHYSICALOFFSET), so a magic number
    at the right distance from a matching offset, in a record whose lengths add up and whose body CRC holds, is a
    record boundary and not a coincidence inside some body.
    """
    view = memoryview(buf)
    try:
        at = start + 4
        while True:
            found = buf.find(_MAGIC_BYTES, at, limit)
            if found < 0:
                return -1
            pos = found - 4
            at = found + 1
            if pos < start or pos + MIN_RECORD_SIZE > limit:
                continue
            (rec_phys,) = I64.unpack_from(view, pos + PHYSICAL_OFFSET_POS)
            if rec_phys != base + pos:
                continue
            (size,) = I32.unpack_from(view, pos)
            if size < MIN_RECORD_SIZE or pos + size > limit:
                continue
            if record_damage(bytes(view[pos : pos + size]), 0, size, base + pos) is None:
                return pos
    finally:
        view.release()
