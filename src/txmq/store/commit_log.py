"""Commit-log segment files: naming, preallocation, positional writes, lock-free reads, verification scans, truncation.

The append pipeline (:mod:`txmq.store.message_store`) is the only writer. Readers take no lock and never block the
writer: they read with ``pread`` on the segment's descriptor, so the pages they touch stay in the kernel's page cache
and are not counted in the broker's resident memory. Each segment is also mapped read-only for the start-up scan,
whose pages are released from the map when the scan has passed them.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import mmap
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from txmq.errors import CorruptStoreError, DiskFullError, StoreClosedError
from txmq.protocol.record import (
    MAGIC_CODE,
    MIN_RECORD_SIZE,
    MessageRecord,
    ScannedRecord,
    WalkResult,
    decode_record,
    encode_blank,
    find_record,
    read_record_size,
    read_store_timestamp,
    walk_segment,
)
from txmq.store.config import Preallocate

log = logging.getLogger("txmq.store")

SEGMENT_NAME_RE = re.compile(r"^\d{20}$")
ALLOC_SUFFIX = ".alloc"  # a segment being zero-filled in the background; renamed into place when needed
IOV_MAX = 1024
_ZERO_CHUNK = bytes(1 << 20)
# Zero-ahead in a segment that was fallocate'd (Preallocate.ZERO's foreground path, and segments opened at start-up):
# the zeroer keeps between ZERO_AHEAD_MIN and ZERO_AHEAD_MAX bytes past the last write zero-filled, one chunk
# (pwrite + fdatasync) at a time, so that the writer's fdatasync never converts an unwritten extent.
ZERO_AHEAD_CHUNK = 1 << 20
ZERO_AHEAD_MIN = 1 << 20
ZERO_AHEAD_MAX = 16 << 20


def segment_name(start: int) -> str:
    return f"{start:020d}"


class Segment:
    """One commit-log file ``[start, start + size)``: its descriptor (readers ``pread`` it) and a read-only map used by
    scans. ``closed`` is set before the descriptor is closed, so a reader that raced a close (and may have read a
    reused descriptor) sees it afterwards and discards what it read."""

    __slots__ = ("closed", "fd", "high", "mm", "path", "size", "start", "zero_target", "zeroed")

    def __init__(self, start: int, size: int, path: str, fd: int, mm: mmap.mmap) -> None:
        self.start = start
        self.size = size
        self.path = path
        self.fd = fd
        self.mm = mm
        self.closed = False
        # Positions in the file, guarded by CommitLog's zero lock: the end of the bytes written through
        # CommitLog.write (the zeroer never writes below it), how far the blocks are known to hold written zeros or
        # data (the whole file for a segment zero-filled in the background), and how far the zeroer is asked to go.
        self.high = 0
        self.zeroed = 0
        self.zero_target = 0

    @property
    def end(self) -> int:
        return self.start + self.size

    def __repr__(self) -> str:
        return f"Segment({segment_name(self.start)})"


@dataclass(slots=True)
class ScanResult:
    """Where a verification scan stopped and why."""

    start: int
    end: int = 0  # first offset that is not a verified record: the end of the valid log
    reason: str = "end of data"
    clean_end: bool = True  # True when the scan stopped at zeros / the end of the last segment
    records: int = 0
    bytes: int = 0
    notes: list[str] = field(default_factory=list)


class CommitLog:
    """The segment files under ``<root>/commitlog``.

    Segment tuple replacement is copy-on-write: readers take ``self._segments`` once and work on that snapshot, so
    retention can drop a segment while a read of it is in flight (its map stays valid until the snapshot is gone).
    """

    def __init__(self, directory: str, segment_size: int, preallocate: Preallocate = Preallocate.FALLOCATE) -> None:
        self.directory = directory
        self.segment_size = segment_size
        self.preallocate = preallocate
        self._segments: tuple[Segment, ...] = ()
        self._lock = threading.Lock()  # serialises segment-list changes (writer roll vs retention), never reads
        self._prepared: dict[int, str] = {}  # segment start -> zero-filled file ready to be renamed into place
        self._preparing: dict[int, threading.Thread] = {}
        # Half of the active segment: short-lived stores (tests) never pay for zero-filling a segment they do not use.
        self._prepare_at = 1 << 62
        self._closed = False
        # Zero-ahead (Preallocate.ZERO): serialises the zeroer's pwrite of zeros with the writer's claim of the range
        # it writes next (Segment.high) and with closing a segment's descriptor.
        self._zero_lock = threading.Lock()
        self._zeroer: threading.Thread | None = None
        self.zero_ahead_chunks = 0  # chunks the zeroer wrote (tests, benchmarks)
        self.zero_ahead_behind = 0  # writes that reached past the zero-filled part (tests, benchmarks)
        # write(durable=True)'s flag for pwritev2; 0 (no such flag here, or the kernel refused it once): fdatasync.
        self._dsync: int = getattr(os, "RWF_DSYNC", 0)

    # -- opening ----------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Open the existing segments. Raises :class:`CorruptStoreError` when the set of files cannot be trusted."""
        os.makedirs(self.directory, exist_ok=True)
        starts: list[int] = []
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if SEGMENT_NAME_RE.match(name):
                starts.append(int(name))
            elif name.endswith(ALLOC_SUFFIX):
                log.info("commit log: removing unfinished preallocated segment %s", path)
                os.unlink(path)
            elif name.isdigit():
                raise CorruptStoreError(f"commit-log file {path} has a numeric name that is not 20 digits")
            else:
                log.warning("commit log: ignoring unexpected file %s", path)
        starts.sort()
        if len(starts) > 1:
            first_size = os.path.getsize(os.path.join(self.directory, segment_name(starts[0])))
            if first_size != self.segment_size:
                raise CorruptStoreError(
                    f"commit-log segment {segment_name(starts[0])} is {first_size} bytes but "
                    f"mappedFileSizeCommitLog is {self.segment_size}; was the segment size changed?"
                )
        segments: list[Segment] = []
        for i, start in enumerate(starts):
            path = os.path.join(self.directory, segment_name(start))
            if start % self.segment_size:
                raise CorruptStoreError(
                    f"commit-log segment {path} starts at {start}, not a multiple of mappedFileSizeCommitLog "
                    f"({self.segment_size}); was the segment size changed?"
                )
            if i and start != starts[i - 1] + self.segment_size:
                raise CorruptStoreError(
                    f"commit-log segments are not contiguous: {segment_name(starts[i - 1])} is followed by "
                    f"{segment_name(start)}; a segment is missing"
                )
            size = os.path.getsize(path)
            last = i == len(starts) - 1
            if size > self.segment_size:
                raise CorruptStoreError(
                    f"commit-log segment {path} is {size} bytes, larger than mappedFileSizeCommitLog "
                    f"({self.segment_size}); was the segment size changed?"
                )
            if size < self.segment_size and not last:
                raise CorruptStoreError(
                    f"commit-log segment {path} is {size} bytes but is not the last segment; it should be "
                    f"{self.segment_size}: commit-log offsets [{start + size}, {start + self.segment_size}) are "
                    "missing (the file was cut short). `txmq admin store verify` lists the damage; see "
                    "docs/reliability.md for the choices"
                )
            fd = os.open(path, os.O_RDWR)
            if size < self.segment_size:
                # A truncated last segment (a crash while creating it, or outside damage). Extending it with zeros is
                # safe: recovery treats zeros as the end of data.
                log.warning("commit log: last segment %s is %d bytes; extending to %d", path, size, self.segment_size)
                os.ftruncate(fd, self.segment_size)
                os.fsync(fd)
            segments.append(self._open_segment(start, path, fd))
        self._set_segments(tuple(segments))
        if segments:
            self._prepare_at = segments[-1].start + self.segment_size // 2

    def _open_segment(self, start: int, path: str, fd: int) -> Segment:
        mm = mmap.mmap(fd, self.segment_size, prot=mmap.PROT_READ)
        return Segment(start, self.segment_size, path, fd, mm)

    def _set_segments(self, segments: tuple[Segment, ...]) -> None:
        self._segments = segments

    # -- properties -------------------------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._segments

    @property
    def min_offset(self) -> int:
        """First offset still on disk (0 for an empty log)."""
        segs = self._segments
        return segs[0].start if segs else 0

    @property
    def last_segment(self) -> Segment | None:
        segs = self._segments
        return segs[-1] if segs else None

    def segment_start(self, phys: int) -> int:
        return phys - phys % self.segment_size

    # -- writer side ------------------------------------------------------------------------------------------

    def segment_for_write(self, phys: int) -> Segment:
        """The segment holding ``phys``, created if it does not exist: from the zero-filled file prepared in the
        background when it is ready, else preallocated on the spot; fsynced, and its directory entry too."""
        segs = self._segments
        if segs and segs[-1].start <= phys < segs[-1].end:
            return segs[-1]
        found = self.find_segment(phys)
        if found is not None:
            return found
        start = self.segment_start(phys)
        if segs and start != segs[-1].end:
            raise CorruptStoreError(f"cannot create commit-log segment at {start}: the last one ends at {segs[-1].end}")
        path = os.path.join(self.directory, segment_name(start))
        with self._lock:
            prepared = self._prepared.pop(start, None)
        if prepared is not None:
            os.rename(prepared, path)
            fd = os.open(path, os.O_RDWR)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if prepared is None:
                self._preallocate(fd)
                os.fsync(fd)
            _fsync_dir(self.directory)
            seg = self._open_segment(start, path, fd)
            if prepared is not None:
                seg.zeroed = seg.size  # zero-filled in the background: nothing left to convert
        except BaseException as exc:
            os.close(fd)
            if prepared is None:
                # No byte was written to it: leave no short file that the next start would take for a damaged one.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(
                    f"the disk is full: cannot create commit-log segment {path} ({exc.strerror}); "
                    "writes resume once space is freed"
                ) from exc
            raise
        with self._lock:
            self._set_segments((*self._segments, seg))
        self._prepare_at = start + self.segment_size // 2
        return seg

    def maybe_prepare(self, write_pos: int) -> None:
        """Called by the writer after each group: once the active segment is half full, prepare the next one."""
        if write_pos >= self._prepare_at:
            self._prepare_at = 1 << 62
            self.prepare_next()

    def prepare_next(self) -> None:
        """Zero-fill the segment after the last one on a background thread (Preallocate.ZERO only).

        Writing into blocks that already hold zeros lets fdatasync skip the extent conversion that writing into
        fallocate'd (unwritten) blocks costs on ext4: measured ~25 % more SYNC throughput on this project's VM.
        """
        if self.preallocate is not Preallocate.ZERO or self._closed:
            return
        segs = self._segments
        start = segs[-1].end if segs else 0
        with self._lock:
            if start in self._prepared or start in self._preparing:
                return
            thread = threading.Thread(target=self._prepare, args=(start,), name="txmq-store-prealloc", daemon=True)
            self._preparing[start] = thread
        thread.start()

    def _prepare(self, start: int) -> None:
        path = os.path.join(self.directory, segment_name(start) + ALLOC_SUFFIX)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                pos = 0
                chunk = memoryview(_ZERO_CHUNK)
                while pos < self.segment_size and not self._closed:
                    n = os.pwrite(fd, chunk[: min(len(chunk), self.segment_size - pos)], pos)
                    pos += n
                    if pos % (64 << 20) == 0:
                        os.fdatasync(fd)  # write back as we go: no 1 GiB burst of dirty pages at the end
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning(
                "commit log: preparing segment %s failed (%s); it will be fallocate'd", segment_name(start), exc
            )
            pos = -1
        with self._lock:
            self._preparing.pop(start, None)
            usable = pos == self.segment_size and not self._closed and self.find_segment(start) is None
            if usable:
                self._prepared[start] = path
        if not usable:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def wait_prepared(self, timeout: float | None = None) -> bool:
        """Wait for background preparations (tests, benchmarks); True when none is left running."""
        with self._lock:
            threads = list(self._preparing.values())
        for thread in threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in threads)

    def _preallocate(self, fd: int) -> None:
        mode = self.preallocate
        if mode is not Preallocate.NONE:  # ZERO's foreground path: fallocate now, the next one is zero-filled
            try:
                os.posix_fallocate(fd, 0, self.segment_size)
                return
            except OSError as exc:  # filesystems without fallocate (EOPNOTSUPP): fall back to a sparse file
                if exc.errno in DISK_FULL_ERRNOS:
                    # A sparse file would only move the failure to a write in the middle of a group.
                    raise
                log.info("commit log: posix_fallocate unavailable (%s); using ftruncate", exc)
        os.ftruncate(fd, self.segment_size)

    def write(
        self, seg: Segment, seg_pos: int, buffers: list[bytearray | bytes | memoryview], durable: bool = False
    ) -> None:
        """Write ``buffers`` back to back at ``seg_pos`` in ``seg`` with as few ``pwritev`` calls as possible.

        ``durable``: the bytes are on disk when this returns, as after :meth:`flush`. Where Linux has it, that is
        one ``pwritev2`` with ``RWF_DSYNC`` (O_DSYNC for this write alone: the data and the metadata needed to read
        it back), so a writer thread gives up and takes back the GIL once per group instead of twice; elsewhere it
        is ``pwritev`` followed by ``fdatasync``.

        The range is claimed first (``seg.high``, under the zero lock), so the zeroer never writes zeros over it; in
        ZERO mode this also keeps the zeroer ahead of the writer."""
        fd = seg.fd
        n = len(buffers)
        end = seg_pos + (len(buffers[0]) if n == 1 else sum(map(len, buffers)))
        with self._zero_lock:
            if end > seg.high:
                seg.high = end
            if self.preallocate is Preallocate.ZERO and seg.zeroed < seg.size:
                if end > seg.zeroed:
                    self.zero_ahead_behind += 1
                self._keep_zeroed_ahead(seg, end)
        flags = self._dsync if durable else 0
        sync_after = durable and not flags
        i = 0
        while i < n:
            chunk = buffers if n <= IOV_MAX else buffers[i : i + IOV_MAX]
            want = end - seg_pos if n <= IOV_MAX else sum(map(len, chunk))
            if flags:
                try:
                    done = os.pwritev(fd, chunk, seg_pos, flags)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
                    log.info("commit log: pwritev2 with RWF_DSYNC unavailable (%s); using fdatasync", exc)
                    self._dsync = flags = 0
                    sync_after = True
                    done = os.pwritev(fd, chunk, seg_pos)
            else:
                done = os.pwritev(fd, chunk, seg_pos)
            if done != want:  # short write: finish this chunk the slow way (and sync it, if it must be durable)
                _finish_short_write(fd, chunk, seg_pos, done)
                sync_after = durable
            seg_pos += want
            i += IOV_MAX
        if sync_after:
            os.fdatasync(fd)

    @staticmethod
    def flush(seg: Segment) -> None:
        os.fdatasync(seg.fd)

    # -- zero-ahead -------------------------------------------------------------------------------------------

    def _keep_zeroed_ahead(self, seg: Segment, end: int) -> None:
        """Holder of the zero lock, after a write up to ``end``: when fewer than half the wanted bytes past it are
        zero-filled, ask the zeroer for more. The distance grows with what the segment holds (a short-lived store
        zero-fills 1 MiB, a busy broker 16 MiB), so a test pays little and a broker's writes stay ahead."""
        ahead = min(ZERO_AHEAD_MAX, max(ZERO_AHEAD_MIN, end))
        if seg.zeroed - end >= ahead // 2 or self._closed:
            return
        target = min(seg.size, end + ahead)
        if target > seg.zero_target:
            seg.zero_target = target
        zeroer = self._zeroer
        if zeroer is None:
            zeroer = threading.Thread(target=self._zero_ahead, args=(seg,), name="txmq-store-zero-ahead", daemon=True)
            self._zeroer = zeroer
            zeroer.start()

    def _zero_ahead(self, seg: Segment) -> None:
        """The zeroer: zero-fill ``seg`` past the writer's claimed end, one chunk at a time (pwrite under the zero
        lock, then fdatasync outside it, so that the writer's own fdatasync rarely meets these pages dirty)."""
        fd = seg.fd
        while True:
            with self._zero_lock:
                start = max(seg.zeroed, seg.high)
                segs = self._segments
                if self._closed or seg.closed or start >= seg.zero_target or not segs or segs[-1] is not seg:
                    self._zeroer = None
                    return
                stop = min(seg.size, (start // ZERO_AHEAD_CHUNK + 1) * ZERO_AHEAD_CHUNK)
                try:
                    _pwrite_zeros(fd, start, stop - start)
                except OSError as exc:  # ENOSPC in a sparse segment (one extended at start-up), or an IO error:
                    seg.zeroed = seg.size  # give up on this segment for good; the writer converts as it goes
                    self._zeroer = None
                    log.warning("commit log: zero-ahead in %s stopped: %s", seg, exc)
                    return
                seg.zeroed = stop
                self.zero_ahead_chunks += 1
            try:
                os.fdatasync(fd)
            except OSError:  # closed under us (the next round sees seg.closed), or an IO error the writer will meet
                pass

    def wait_zeroed(self, timeout: float | None = None) -> bool:
        """Wait for the zeroer (tests, benchmarks); True when it is not running."""
        with self._zero_lock:
            zeroer = self._zeroer
        if zeroer is not None:
            zeroer.join(timeout)
            return not zeroer.is_alive()
        return True

    # -- readers ----------------------------------------------------------------------------------------------

    def find_segment(self, phys: int) -> Segment | None:
        segs = self._segments
        if not segs:
            return None
        i = (phys - segs[0].start) // self.segment_size
        if 0 <= i < len(segs):
            seg = segs[i]
            if seg.start <= phys < seg.end:
                return seg
        # Lists change only at the ends, so the arithmetic above normally hits; bisect guards odd cases.
        starts = [s.start for s in segs]
        j = bisect.bisect_right(starts, phys) - 1
        if j >= 0 and segs[j].start <= phys < segs[j].end:
            return segs[j]
        return None

    def read(self, phys: int, size: int) -> bytes | None:
        """``size`` bytes at ``phys`` (within one segment), or None when that range is not on disk."""
        if self._closed:
            raise StoreClosedError("the commit log is closed")
        seg = self.find_segment(phys)
        if seg is None or size < 0:
            return None
        pos = phys - seg.start
        if pos + size > seg.size:
            return None
        try:
            data = os.pread(seg.fd, size, pos)
        except OSError:
            data = b""
        if seg.closed:  # closed under us: by retention (the range is gone) or by the store closing
            if self._closed:
                raise StoreClosedError("the commit log is closed")
            return None
        if len(data) != size:  # the file is shorter than its segment size (outside damage)
            return None
        return data

    def read_size(self, phys: int) -> int | None:
        """TOTALSIZE of the message record at ``phys``, or None when there is no message record there."""
        head = self.read(phys, 8)
        if head is None:
            return None
        size, magic = read_record_size(head)
        if magic != MAGIC_CODE or size < MIN_RECORD_SIZE:
            return None
        return size

    def read_record_bytes(self, phys: int, size: int | None = None) -> bytes | None:
        if size is None:
            size = self.read_size(phys)
            if size is None:
                return None
        return self.read(phys, size)

    def read_record(self, phys: int, size: int | None = None, *, check_crc: bool = True) -> MessageRecord | None:
        data = self.read_record_bytes(phys, size)
        return None if data is None else decode_record(data, check_crc=check_crc)

    def read_many(self, locations: list[tuple[int, int]]) -> list[bytes]:
        """Read records given as (phys, size), merging neighbours that are contiguous in one segment into one read."""
        out: list[bytes] = []
        i = 0
        n = len(locations)
        while i < n:
            start, size = locations[i]
            end = start + size
            seg_end = self.segment_start(start) + self.segment_size
            j = i + 1
            while j < n and locations[j][0] == end and end + locations[j][1] <= seg_end:
                end += locations[j][1]
                j += 1
            data = self.read(start, end - start)
            if data is None:
                break
            out.append(data)
            i = j
        return out

    # -- recovery ---------------------------------------------------------------------------------------------

    def scan(
        self,
        start: int,
        *,
        check_crc: bool = True,
        result: ScanResult | None = None,
        yield_from: int = 0,
        on_damaged: Callable[[int, int, str], None] | None = None,
    ) -> Iterator[ScannedRecord]:
        """Verify records from ``start`` (a record boundary); yield the fields of those at or past ``yield_from``.

        Each yielded tuple is ``(phys, size, queue_id, queue_offset, sys_flag, store_timestamp, topic bytes,
        properties bytes)``. The scan stops at the first thing that is not a valid record: zeros (the normal end),
        a bad magic, an impossible size, a PHYSICALOFFSET that disagrees with the position, field lengths that do not
        add up, or a body CRC mismatch; ``result`` receives where and why. Blank fillers lead to the next segment.
        Records below ``yield_from`` are only verified, in a loop that stays out of the caller's way (recovery
        speed is this loop's speed). With ``on_damaged``, a record whose frame is sound but whose body CRC fails is
        passed to it as ``(phys, size, why)`` and the scan goes on after it.
        """
        res = result if result is not None else ScanResult(start)
        res.start = res.end = start
        segs = self._segments
        if not segs:
            res.reason = "empty log"
            return
        phys = max(start, segs[0].start)
        idx = (phys - segs[0].start) // self.segment_size
        if idx >= len(segs):
            res.end = phys
            res.reason = "start is past the last segment"
            return
        records = 0
        nbytes = 0
        try:
            while True:
                seg = segs[idx]
                walk = WalkResult()
                try:
                    yield from walk_segment(
                        seg.mm,
                        base=seg.start,
                        start=phys - seg.start,
                        limit=seg.size,
                        check_crc=check_crc,
                        yield_from=yield_from,
                        skip_bad_crc=on_damaged is not None,
                        on_skip=on_damaged,
                        result=walk,
                    )
                finally:
                    records += walk.records
                    nbytes += walk.bytes
                    _release_pages(seg)
                if walk.blank:
                    phys = seg.end
                    idx += 1
                    if idx < len(segs):
                        continue
                    res.end, res.reason, res.clean_end = phys, "end of the last segment", True
                    return
                res.end = walk.end
                res.reason = walk.reason
                res.clean_end = walk.clean_end
                return
        finally:
            res.records += records
            res.bytes += nbytes

    def next_sound_record(self, phys: int) -> int:
        """The commit-log offset of the first sound record at or after ``phys`` (in any later segment), or -1."""
        for seg in self._segments:
            if seg.end <= phys:
                continue
            pos = find_record(seg.mm, seg.start, max(0, phys - seg.start), seg.size)
            if pos >= 0:
                return seg.start + pos
        return -1

    def last_nonzero(self, seg: Segment, start_pos: int) -> int:
        """One past the last non-zero byte of ``seg`` at or after ``start_pos`` (``start_pos`` if all zero)."""
        pos = seg.size
        chunk = len(_ZERO_CHUNK)
        while pos > start_pos:
            lo = max(start_pos, pos - chunk)
            data = seg.mm[lo:pos]
            if data != _ZERO_CHUNK[: pos - lo]:
                return lo + len(data.rstrip(b"\x00"))
            pos = lo
        return start_pos

    def truncate(self, end: int) -> tuple[int, int, list[str]]:
        """Zero everything from ``end`` to the end of its segment and delete later segments.

        Returns ``(first zeroed offset, bytes zeroed, deleted segment paths)``. ``end`` may equal a segment's end.
        """
        zeroed = 0
        deleted: list[str] = []
        with self._lock:
            segs = list(self._segments)
            keep: list[Segment] = []
            for seg in segs:
                if seg.start < end or (seg.start == end and seg is segs[0]):
                    keep.append(seg)
                else:
                    deleted.append(seg.path)
            if keep and keep[-1].start <= end < keep[-1].end:
                seg = keep[-1]
                pos = end - seg.start
                stop = self.last_nonzero(seg, pos)
                if stop > pos:
                    zeroed = stop - pos
                    _pwrite_zeros(seg.fd, pos, zeroed)
                    os.fdatasync(seg.fd)
            dropped = [s for s in segs if s.path in deleted]
            self._set_segments(tuple(keep))
        for seg in dropped:
            self._close(seg)
            os.unlink(seg.path)
        if dropped:
            _fsync_dir(self.directory)
        return end, zeroed, deleted

    # -- retention --------------------------------------------------------------------------------------------

    def delete_segment(self, seg: Segment) -> None:
        """Remove a segment that is not the last one. A reader racing it gets None, never another file's bytes."""
        with self._lock:
            segs = self._segments
            if not segs or seg is segs[-1] or seg not in segs:
                raise ValueError(f"cannot delete {seg}: it is the active segment or not in the log")
            self._set_segments(tuple(s for s in segs if s is not seg))
        self._close(seg)
        os.unlink(seg.path)
        _fsync_dir(self.directory)

    def first_store_timestamp(self, seg: Segment) -> int | None:
        """STORETIMESTAMP of the first record of ``seg`` (None when it does not start with a record)."""
        head = self.read(seg.start, MIN_RECORD_SIZE)
        if head is None:
            return None
        size, magic = read_record_size(head)
        if magic != MAGIC_CODE or size < MIN_RECORD_SIZE:
            return None
        return read_store_timestamp(head)

    # -- closing ----------------------------------------------------------------------------------------------

    def _close(self, seg: Segment) -> None:
        """Close ``seg`` under the zero lock: the zeroer checks ``seg.closed`` under it before each write, so it never
        writes to a descriptor number that was closed (and perhaps reused)."""
        with self._zero_lock:
            _close_segment(seg)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # preparations and the zeroer stop at their next chunk
        self.wait_prepared()
        self.wait_zeroed()
        with self._lock:
            segs = self._segments
            self._set_segments(())
            prepared, self._prepared = list(self._prepared.values()), {}
        for seg in segs:
            self._close(seg)
        for path in prepared:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def blank_for(remaining: int) -> bytes:
    """The end-of-file filler for the ``remaining`` bytes of a segment."""
    return encode_blank(remaining)


def _release_pages(seg: Segment) -> None:
    """Drop the scan's pages from the map (they stay in the page cache), so they no longer count as resident."""
    try:
        seg.mm.madvise(mmap.MADV_DONTNEED)
    except (ValueError, OSError):  # closed under us, or the kernel refused: only memory accounting is at stake
        pass


def release_scan_pages(seg: Segment) -> None:
    """What a scan outside this module (the start-up scrub) calls when it is done with a segment's map."""
    _release_pages(seg)


def _close_segment(seg: Segment) -> None:
    seg.closed = True  # before the descriptor goes: see Segment
    try:
        seg.mm.close()
    except BufferError:  # a scan view still exports it; the map goes away with the last reference
        pass
    try:
        os.close(seg.fd)
    except OSError:
        pass


def _finish_short_write(fd: int, chunk: list[bytearray | bytes | memoryview], pos: int, done: int) -> None:
    data = memoryview(b"".join(chunk))[done:]
    pos += done
    while data:
        n = os.pwrite(fd, data, pos)
        data = data[n:]
        pos += n


def _pwrite_zeros(fd: int, pos: int, count: int) -> None:
    while count > 0:
        n = os.pwrite(fd, memoryview(_ZERO_CHUNK)[: min(count, len(_ZERO_CHUNK))], pos)
        pos += n
        count -= n


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """fsync a directory so that created, renamed or removed entries survive a crash."""
    _fsync_dir(path)
