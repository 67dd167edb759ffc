"""Key index for QUERY_MESSAGE: ``topic#UNIQ_KEY`` and ``topic#<KEYS token>`` -> commit-log offsets.

Our own on-disk form, in the spirit of RocketMQ's index files: segment files, each a hash-slot table plus
append-only entries chained newest-first per slot, written through mmap by the single writer thread. A segment
file ``<root>/<20-digit sequence>`` (little-endian, 8-byte aligned regions) is:

* header (64 bytes): magic, version, slot count, max entries, entry count, then store-time range and
  commit-log range of the entries, and a CRC of the header;
* slots: uint32 per slot, the newest entry number in the slot (0 = empty);
* four arrays indexed by entry number 1..max: uint64 key hash, int64 commit-log offset, int64 store time (ms),
  uint32 previous entry in the same slot.

The key hash is crc32 (high half, also picks the slot) joined with adler32 (low half), so distinct keys meet only
on a 64-bit collision. Everything can be rebuilt from the commit log, so after a crash the index drops whatever
lies past its durable point and recovery re-dispatches it. Segment files are sparse; disk blocks are reserved
(fallocate) ahead of the entries written through the mapping, so a full disk fails an append with ENOSPC instead of
killing the process with SIGBUS.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
import sys
import threading
import zlib
from collections.abc import Iterable
from pathlib import Path

from txmq.errors import CorruptStoreError, DiskFullError, StoreClosedError, StoreError
from txmq.store.dispatch import DispatchRequest
from txmq.store.key_entries import key_entries, key_hash, write_entries

log = logging.getLogger("txmq.store")

DEFAULT_SLOT_COUNT = 5_000_000
DEFAULT_MAX_ENTRIES = 20_000_000
HEADER_SIZE = 64
_MAGIC = 0x54584958  # "TXIX"
_VERSION = 1
# magic, version, slot_count, max_entries, count, pad, min_ts, max_ts, first_phys, last_phys, crc, pad
_HEADER = struct.Struct("<IIIIII qqqq I 4x")
_MARKER = struct.Struct("<qI")
DURABLE_MARKER_NAME = ".durable"
_RESERVE_ENTRIES = 65_536  # entries given disk blocks at a time
_KEEP_OPEN = 4  # newest segments kept mapped; older ones are mapped only while a query reads them

if sys.byteorder != "little":  # pragma: no cover - the arrays are accessed through native memoryview casts
    raise ImportError("txmq.store.key_index needs a little-endian host")


def _fdatasync(fd: int) -> None:
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


def _align8(n: int) -> int:
    return (n + 7) & ~7


class _Segment:
    """One segment file. Entry numbers start at 1 so that 0 can mean "no entry" in slots and chains."""

    def __init__(self, path: Path, seq: int, slot_count: int, max_entries: int) -> None:
        self.path = path
        self.seq = seq
        self.slot_count = slot_count
        self.max_entries = max_entries
        self.count = 0  # entries visible to queries
        self.min_ts = 0
        self.max_ts = 0
        self.first_phys = -1  # -1: no entry yet
        self.last_phys = -1
        self.refs = 0  # queries reading it right now
        self.retired = False  # deleted from disk; unmap once no query reads it
        self.fd: int | None = None
        self._mm: mmap.mmap | None = None
        self._views: list[memoryview] = []
        self.reserved = 0  # entry numbers below this have disk blocks (see reserve)
        n = max_entries + 1
        self._slots_at = HEADER_SIZE
        self._hash_at = _align8(self._slots_at + 4 * slot_count)
        self._phys_at = self._hash_at + 8 * n
        self._ts_at = self._phys_at + 8 * n
        self._prev_at = self._ts_at + 8 * n
        self.file_size = _align8(self._prev_at + 4 * n)

    # -- mapping -----------------------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._mm is not None

    def open(self, create: bool = False) -> None:
        if self._mm is not None:
            return
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o644)
        try:
            if create:
                os.ftruncate(fd, self.file_size)  # sparse: blocks are reserved before writes (see reserve)
            elif os.fstat(fd).st_size != self.file_size:
                raise CorruptStoreError(f"{self.path}: size does not match its header")
            mm = mmap.mmap(fd, self.file_size)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self._mm = fd, mm
        base = memoryview(mm)
        n = self.max_entries + 1
        self.slots = base[self._slots_at : self._slots_at + 4 * self.slot_count].cast("I")
        self.hashes = base[self._hash_at : self._hash_at + 8 * n].cast("Q")
        self.phys = base[self._phys_at : self._phys_at + 8 * n].cast("q")
        self.times = base[self._ts_at : self._ts_at + 8 * n].cast("q")
        self.prev = base[self._prev_at : self._prev_at + 4 * n].cast("I")
        self._views = [self.slots, self.hashes, self.phys, self.times, self.prev, base]

    def close(self) -> None:
        for view in self._views:
            view.release()
        self._views = []
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    # -- header ------------------------------------------------------------------------------------------------

    def header_bytes(self, count: int, min_ts: int, max_ts: int, first_phys: int, last_phys: int) -> bytes:
        raw = bytearray(
            _HEADER.pack(
                _MAGIC, _VERSION, self.slot_count, self.max_entries, count, 0, min_ts, max_ts, first_phys, last_phys, 0
            )
        )
        struct.pack_into("<I", raw, 56, zlib.crc32(raw[:56]))
        return bytes(raw)

    def write_header(self, count: int, min_ts: int, max_ts: int, first_phys: int, last_phys: int) -> None:
        assert self.fd is not None
        os.pwrite(self.fd, self.header_bytes(count, min_ts, max_ts, first_phys, last_phys), 0)

    @staticmethod
    def read_header(path: Path) -> tuple[int, ...] | None:
        """(slot_count, max_entries, count, min_ts, max_ts, first_phys, last_phys), or None if not valid."""
        with open(path, "rb") as fh:
            raw = fh.read(HEADER_SIZE)
        if len(raw) < _HEADER.size:
            return None
        magic, version, slots, max_entries, count, _, min_ts, max_ts, first, last, crc = _HEADER.unpack(
            raw[: _HEADER.size]
        )
        if magic != _MAGIC or version != _VERSION or crc != zlib.crc32(raw[:56]):
            return None
        if slots <= 0 or max_entries <= 0 or count > max_entries:
            return None
        return slots, max_entries, count, min_ts, max_ts, first, last

    # -- entries (writer holds the index lock) -----------------------------------------------------------------

    def reserve(self, upto: int) -> None:
        """Give entry numbers below ``upto`` disk blocks before they are written through the mapping.

        Storing into a hole of a sparse file when the disk is full kills the process with SIGBUS; fallocate
        fails with ENOSPC instead, which the store turns into a refused append.
        """
        if upto <= self.reserved:
            return
        assert self.fd is not None
        old = self.reserved
        if old == 0:
            os.posix_fallocate(self.fd, 0, self._hash_at)  # the header and the slots, which take writes anywhere
        new = min(self.max_entries + 1, upto + _RESERVE_ENTRIES)
        for at, width in ((self._hash_at, 8), (self._phys_at, 8), (self._ts_at, 8), (self._prev_at, 4)):
            os.posix_fallocate(self.fd, at + width * old, width * (new - old))
        self.reserved = new

    def append(self, entries: list[tuple[int, int, int]], start: int) -> int:
        """Write ``entries[start:]`` (hash, phys, store time) while room lasts; returns where it stopped.

        Each entry is complete before its slot points at it, so a concurrent query never reads half of one.
        """
        stop = min(len(entries), start + self.max_entries - self.count)
        if stop <= start:
            return start
        self.reserve(self.count + stop - start + 1)
        if self.first_phys < 0:
            self.first_phys, self.min_ts, self.max_ts = entries[start][1], entries[start][2], entries[start][2]
        arrays = (self.slots, self.hashes, self.phys, self.times, self.prev)
        self.count, self.min_ts, self.max_ts = write_entries(
            arrays, self.slot_count, entries, start, stop, self.count, self.min_ts, self.max_ts
        )
        self.last_phys = entries[stop - 1][1]
        return stop

    def first_at_or_after(self, phys: int) -> int:
        """First entry number whose commit-log offset is >= phys (count + 1 if none): entries grow with phys."""
        lo, hi = 1, self.count + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.phys[mid] < phys:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def cut(self, count: int) -> None:
        """Keep entries 1..count: re-point slots that refer to later entries, refresh the ranges."""
        self.reserve(count + 1)  # the slot writes below must not land in holes
        self.count = count
        self.repair_slots()
        # The time range stays as it was: a superset only costs a query a wasted look at this segment.
        if count == 0:
            self.first_phys = self.last_phys = -1
            self.min_ts = self.max_ts = 0
        else:
            self.first_phys, self.last_phys = self.phys[1], self.phys[count]

    def repair_slots(self) -> None:
        """Make every slot point at an entry <= count (after a crash or a truncation)."""
        count, slots = self.count, self.slots
        if count == 0:
            slots.obj[self._slots_at : self._slots_at + 4 * self.slot_count] = bytes(4 * self.slot_count)
            return
        if max(slots) <= count:
            return
        stale = [s for s, v in enumerate(slots) if v > count]
        for s in stale:
            v = slots[s]
            while v > count:
                # Entries past count were written by the same process before a kill, so their chains are
                # normally intact; anything odd means the OS lost pages, and we relink from scratch.
                if v > self.max_entries or (self.hashes[v] >> 32) % self.slot_count != s or self.prev[v] >= v:
                    self._relink()
                    return
                v = self.prev[v]
            slots[s] = v
        log.info("key index %s: re-pointed %d slots past entry %d", self.path.name, len(stale), count)

    def _relink(self) -> None:
        log.warning("key index %s: rebuilding the slot table from %d entries", self.path.name, self.count)
        slots, prev, hashes, n = self.slots, self.prev, self.hashes, self.slot_count
        slots.obj[self._slots_at : self._slots_at + 4 * n] = bytes(4 * n)
        for i in range(1, self.count + 1):
            slot = (hashes[i] >> 32) % n
            prev[i] = slots[slot]
            slots[slot] = i

    def lookup(self, h: int, begin_ts: int, end_ts: int, limit: int, out: list[int], seen: set[int]) -> None:
        """Append offsets of entries with hash h and store time in range, newest first, up to ``limit``."""
        # Entries past a count read earlier are complete too: the writer fills an entry before its slot.
        top, hashes, times, prev = self.max_entries, self.hashes, self.times, self.prev
        i = self.slots[(h >> 32) % self.slot_count]
        while 0 < i <= top and len(out) < limit:
            t = times[i]
            if t < begin_ts:
                break  # a chain runs newest first and store times only grow
            if hashes[i] == h and t <= end_ts:
                phys = self.phys[i]
                if phys not in seen:
                    seen.add(phys)
                    out.append(phys)
            nxt = prev[i]
            if nxt >= i:
                break  # never loop on a damaged chain
            i = nxt


class KeyIndex:
    """Persistent key -> commit-log offset index.

    ``put`` runs on the single writer thread and only touches memory (mmap); ``flush`` makes it durable.
    ``query`` may run on any thread.
    """

    def __init__(
        self,
        root_dir: str | Path,
        slot_count: int = DEFAULT_SLOT_COUNT,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        if slot_count <= 0 or max_entries <= 0 or max_entries >= 2**32 - 1:
            raise ValueError("slot_count and max_entries must be positive (max_entries < 2**32 - 1)")
        self.root = Path(root_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.slot_count = slot_count
        self.max_entries = max_entries
        self._lock = threading.Lock()  # segment list, active segment, progress
        self._flush_lock = threading.Lock()  # header and marker writes
        self._segments: list[_Segment] = []
        self._next_seq = 0
        self._active: _Segment | None = None
        self._dirty: set[_Segment] = set()
        self._closed = False
        self._marker_fd = os.open(self.root / DURABLE_MARKER_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        self._durable = self._read_marker()
        self._progress = self._durable  # end of the highest record handled by a completed put()
        self._load()

    # ------------------------------------------------------------------------------------------------ loading

    def _read_marker(self) -> int:
        raw = os.pread(self._marker_fd, _MARKER.size, 0)
        if len(raw) != _MARKER.size:
            return 0
        value, crc = _MARKER.unpack(raw)
        if crc != zlib.crc32(raw[:8]) or value < 0:
            log.warning("key index durable marker is damaged; recovery will rebuild the index")
            return 0
        return value

    def _write_marker(self, value: int) -> None:
        head = value.to_bytes(8, "little", signed=True)
        os.pwrite(self._marker_fd, head + zlib.crc32(head).to_bytes(4, "little"), 0)
        _fdatasync(self._marker_fd)
        self._durable = value

    def _load(self) -> None:
        names = sorted(p.name for p in self.root.iterdir() if len(p.name) == 20 and p.name.isdigit())
        self._next_seq = int(names[-1]) + 1 if names else 0
        for pos, name in enumerate(names):
            path = self.root / name
            header = _Segment.read_header(path)
            if header is None:
                # A segment is created without a sync; a flush syncs its header before the marker moves, so an
                # unreadable last segment holds nothing below the durable point.
                if pos != len(names) - 1:
                    self._drop_damaged(names[pos:])
                    break
                log.warning("key index: dropping segment %s with an unreadable header", name)
                path.unlink()
                break
            slots, max_entries, count, min_ts, max_ts, first, last = header
            seg = _Segment(path, int(name), slots, max_entries)
            seg.count, seg.min_ts, seg.max_ts, seg.first_phys, seg.last_phys = (
                count,
                min_ts,
                max_ts,
                first,
                last,
            )
            self._segments.append(seg)
        # Entries past the durable point may be incomplete (or duplicated by the coming replay): drop them.
        self._cut_at(self._durable)
        for seg in self._segments[:-_KEEP_OPEN]:
            seg.close()
        if self._segments and self._segments[-1].count < self._segments[-1].max_entries:
            self._active = self._segments[-1]

    def _drop_damaged(self, names: list[str]) -> None:
        log.error("key index: segment %s has an unreadable header; dropping it and every later segment", names[0])
        for name in names:
            (self.root / name).unlink(missing_ok=True)
        # Replay from the last surviving entry's record so nothing that lived in the dropped files is lost.
        last = next((s.last_phys for s in reversed(self._segments) if s.count), -1)
        self._write_marker(min(self._durable, max(last, 0)))
        self._progress = self._durable

    def _cut_at(self, phys: int) -> None:
        """Drop entries whose commit-log offset is >= phys (caller holds the locks or is the constructor)."""
        while self._segments:
            seg = self._segments[-1]
            seg.open()
            if seg.count and seg.phys[1] < phys:
                keep = seg.first_at_or_after(phys) - 1
                needs_repair = keep < seg.count or seg.count < seg.max_entries
                if needs_repair:
                    # A non-full last segment may have slots pointing past its header count (unflushed puts).
                    seg.cut(keep)
                    seg.write_header(keep, seg.min_ts, seg.max_ts, seg.first_phys, seg.last_phys)
                    _fdatasync(seg.fd)  # type: ignore[arg-type]
                break
            self._segments.pop()
            self._retire(seg)
        if self._active is not None and self._active not in self._segments:
            self._active = None
        if self._segments and self._segments[-1].count < self._segments[-1].max_entries:
            self._active = self._segments[-1]

    def _retire(self, seg: _Segment) -> None:
        seg.retired = True
        self._dirty.discard(seg)
        seg.path.unlink(missing_ok=True)
        if seg.refs == 0:
            seg.close()

    # ------------------------------------------------------------------------------------------------ writing

    def put(self, dispatches: Iterable[DispatchRequest]) -> None:
        """Index the keys of ``dispatches`` (single writer thread). Records already indexed are skipped."""
        self._check_open()
        entries: list[tuple[int, int, int]] = []
        with self._lock:
            progress = key_entries(dispatches, self._progress, entries)
            done = 0
            while done < len(entries):
                seg = self._active
                if seg is None or seg.count >= seg.max_entries:
                    seg = self._roll()
                try:
                    done = seg.append(entries, done)
                except OSError as exc:
                    raise _index_error(f"key index: cannot grow segment {seg.path}: {exc}", exc) from exc
                finally:
                    self._dirty.add(seg)
            self._progress = progress

    def _roll(self) -> _Segment:
        """Start a new segment (the previous one is full); its header is synced by the next flush."""
        seq = self._next_seq
        self._next_seq += 1
        seg = _Segment(self.root / f"{seq:020d}", seq, self.slot_count, self.max_entries)
        try:
            seg.open(create=True)
            seg.write_header(0, 0, 0, -1, -1)
        except OSError as exc:
            raise _index_error(f"key index: cannot create segment {seg.path}: {exc}", exc) from exc
        self._segments.append(seg)
        self._dirty.add(seg)
        self._active = seg
        # Keep only the newest segments mapped; older ones are mapped again by queries that need them.
        for old in self._segments[-_KEEP_OPEN - 1 :: -1]:
            if not old.is_open:
                break
            if old.refs == 0 and old not in self._dirty:
                old.close()
        log.info("key index: new segment %s", seg.path.name)
        return seg

    def flush(self) -> None:
        """Sync every segment written since the last flush, then its header, then the durable point."""
        self._check_open()
        with self._flush_lock:
            with self._lock:
                progress = self._progress
                snapshot = [
                    (seg, seg.header_bytes(seg.count, seg.min_ts, seg.max_ts, seg.first_phys, seg.last_phys))
                    for seg in sorted(self._dirty, key=lambda s: s.seq)
                ]
                self._dirty.clear()
                for seg, _ in snapshot:
                    seg.refs += 1  # keep it mapped while we sync outside the lock
            try:
                for seg, header in snapshot:
                    if seg.retired:
                        continue
                    assert seg.fd is not None
                    _fdatasync(seg.fd)  # entries before the header that counts them
                    os.pwrite(seg.fd, header, 0)
                    _fdatasync(seg.fd)
                if progress != self._durable:
                    self._write_marker(progress)
            finally:
                with self._lock:
                    for seg, _ in snapshot:
                        self._release(seg)

    # ------------------------------------------------------------------------------------------------ reading

    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> list[int]:
        """Commit-log offsets of records indexed under ``topic#key`` with store time in [begin_ts, end_ts].

        Newest first, at most ``max_num``. A 64-bit hash collision could add a foreign offset; callers check
        the record's keys anyway.
        """
        self._check_open()
        if max_num <= 0 or begin_ts > end_ts:
            return []
        h = key_hash(f"{topic}#{key}")
        with self._lock:
            candidates = [s for s in self._segments if s.count and s.min_ts <= end_ts and s.max_ts >= begin_ts]
            for seg in candidates:
                seg.refs += 1
        out: list[int] = []
        # put() never indexes a record twice; the set only guards max_num against a damaged file.
        seen: set[int] = set()
        try:
            for seg in reversed(candidates):
                if len(out) >= max_num:
                    break
                if not seg.is_open:
                    with self._lock:
                        if seg.retired:
                            continue
                        seg.open()
                seg.lookup(h, begin_ts, end_ts, max_num, out, seen)
        finally:
            with self._lock:
                for seg in candidates:
                    self._release(seg)
        return out

    def _release(self, seg: _Segment) -> None:
        seg.refs -= 1
        if seg.refs:
            return
        if seg.retired or (seg.is_open and seg not in self._segments[-_KEEP_OPEN:] and seg not in self._dirty):
            seg.close()

    def max_physical_offset(self) -> int:
        """Commit-log offset up to which every record is indexed; 0 when empty.

        While running: the end of the highest record passed to a completed put(). After reopening: the durable
        point of the last flush (recovery re-dispatches from there; older records are skipped by put).
        """
        return self._progress

    # ------------------------------------------------------------------------------------------ maintenance

    def truncate_after(self, phys: int) -> None:
        """Forget every entry whose commit-log offset is >= phys (the commit log was cut there)."""
        self._check_open()
        with self._flush_lock, self._lock:
            if self._durable > phys:
                self._write_marker(phys)  # first, so a crash halfway only means more replay
            self._progress = min(self._progress, phys)
            try:
                self._cut_at(phys)
            except OSError as exc:
                raise StoreError(f"key index: truncate failed: {exc}") from exc

    def delete_before(self, phys: int) -> None:
        """Delete whole segments whose every entry points below ``phys`` (the commit log no longer has them)."""
        self._check_open()
        with self._lock:
            while self._segments and 0 <= self._segments[0].last_phys < phys:
                seg = self._segments.pop(0)
                if seg is self._active:
                    self._active = None
                log.info("key index: deleting segment %s (entries below %d)", seg.path.name, phys)
                self._retire(seg)

    def close(self) -> None:
        """Flush and unmap everything. Further calls raise StoreClosedError."""
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
            for seg in self._segments:
                seg.close()
            self._segments = []
            self._active = None
        os.close(self._marker_fd)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("key index is closed")


def _index_error(message: str, exc: OSError) -> StoreError:
    """A full disk is :class:`DiskFullError` (the indexer waits and tries again); anything else is a store failure.
    Nothing of the failed append was written (room is reserved first), so trying the same records again is safe."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(message)
    return StoreError(message)
