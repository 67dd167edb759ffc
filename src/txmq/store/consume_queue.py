"""Consume queues: per (topic, queueId) arrays of 20-byte entries pointing into the commit log.

Layout as RocketMQ 4.x: ``<root>/<topic>/<queueId>/<20-digit start byte offset>``, each entry
``int64 commitLogOffset | int32 size | int64 tagsCode`` (big-endian); logical offset = byte position / 20.
One writer thread appends; any thread may read.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

from txmq.errors import CorruptStoreError, DiskFullError, StoreClosedError, StoreError
from txmq.store.cq_plan import ENTRY, Plan, plan_puts
from txmq.store.dispatch import DispatchRequest

log = logging.getLogger("txmq.store")

ENTRY_SIZE = 20
DEFAULT_ENTRIES_PER_FILE = 300_000
_ZERO_ENTRY = bytes(ENTRY_SIZE)
# Appended entries wait in memory until this many bytes, a read that reaches them, or the next flush: one pwrite per
# few hundred entries instead of one per group (a single synchronous appender makes a group per record).
_SPILL_BYTES = 16 * 1024
# Durable point of the whole store: every dispatch ending at or below it has its entry on disk.
DURABLE_MARKER_NAME = ".cq_durable"  # a dot cannot occur in a RocketMQ topic name
_MARKER = struct.Struct(">qI")
# translate() table: a size byte with the sign bit set becomes 0 so find(0) locates negative sizes.
_NON_NEGATIVE = bytes(0 if b >= 0x80 else 1 for b in range(256))

Entry = tuple[int, int, int]


def _file_name(start_entry: int) -> str:
    return f"{start_entry * ENTRY_SIZE:020d}"


def _first_invalid(data: bytes, start: int, count: int) -> int:
    """Index of the first entry in ``data[start:count]`` whose size is <= 0, or ``count``.

    Works on strided byte slices so that checking a 6 MB file costs a few C-level passes, not 300 000 unpacks.
    """
    if start >= count:
        return count
    lo, hi = start * ENTRY_SIZE, count * ENTRY_SIZE
    b0, b1, b2, b3 = (data[lo + 8 + k : hi : ENTRY_SIZE] for k in range(4))
    n = count - start
    first_negative = b0.translate(_NON_NEGATIVE).find(0)
    any_bit = (
        int.from_bytes(b0, "big") | int.from_bytes(b1, "big") | int.from_bytes(b2, "big") | int.from_bytes(b3, "big")
    )
    first_zero = any_bit.to_bytes(n, "big").find(0)
    hits = [i for i in (first_negative, first_zero) if i >= 0]
    return start + min(hits) if hits else count


def _fdatasync(fd: int) -> None:
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _CqFile:
    __slots__ = ("fd", "path", "start")

    def __init__(self, path: Path, start: int, fd: int | None) -> None:
        self.path = path
        self.start = start  # logical offset of the file's first slot
        self.fd = fd  # kept open only for the tail file; older files are opened per read


class _Queue:
    """One consume queue. ``lock`` guards the file list, ``min``, ``max`` and ``pending``; readers hold it while
    reading. ``max`` counts the ``pending`` entries, which are not in the files yet (see :meth:`spill`)."""

    __slots__ = ("dir", "epf", "files", "key", "lock", "max", "min", "pending")

    def __init__(self, key: tuple[str, int], directory: Path, entries_per_file: int) -> None:
        self.key = key
        self.dir = directory
        self.epf = entries_per_file
        self.files: list[_CqFile] = []  # contiguous, each starting at a multiple of epf
        self.min = 0
        self.max = 0
        self.pending = bytearray()  # entries [max - len(pending) / 20, max), appended but not written yet
        self.lock = threading.Lock()

    # -- reading (caller holds lock) -------------------------------------------------------------------------

    def read_raw(self, offset: int, count: int) -> bytes:
        """Bytes of entries [offset, offset+count), all of which must lie in files on disk."""
        parts = []
        first = self.files[0].start
        while count > 0:
            f = self.files[(offset - first) // self.epf]
            n = min(count, f.start + self.epf - offset)
            want = n * ENTRY_SIZE
            pos = (offset - f.start) * ENTRY_SIZE
            if f.fd is not None:
                data = os.pread(f.fd, want, pos)
            else:
                fd = os.open(f.path, os.O_RDONLY)
                try:
                    data = os.pread(fd, want, pos)
                finally:
                    os.close(fd)
            if len(data) != want:
                raise CorruptStoreError(f"consume queue file {f.path} is shorter than its entries")
            parts.append(data)
            offset += n
            count -= n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def pin(self, offset: int, count: int) -> list[tuple[Path, int | None, int, int]]:
        """Plan a read of entries [offset, offset+count) to run outside the lock.

        Returns (path, fd or None, byte position, byte count) per file; the tail file's fd is dup'ed, so a
        rollover closing it cannot hand its number to another file while the reader still uses it.
        """
        plan = []
        first = self.files[0].start
        while count > 0:
            f = self.files[(offset - first) // self.epf]
            n = min(count, f.start + self.epf - offset)
            fd = os.dup(f.fd) if f.fd is not None else None
            plan.append((f.path, fd, (offset - f.start) * ENTRY_SIZE, n * ENTRY_SIZE))
            offset += n
            count -= n
        return plan

    def entry(self, offset: int) -> Entry:
        return ENTRY.unpack(self.read_raw(offset, 1))

    def bisect_phys(self, phys: int, lo: int, hi: int) -> int:
        """First offset in [lo, hi) whose commit-log offset is >= phys (entries grow with the commit log)."""
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[0] < phys:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # -- writing (caller holds lock) -------------------------------------------------------------------------

    def spill(self, dirty: set[_CqFile], new_dirs: set[Path]) -> None:
        """Write the entries held in memory to the files. They stay pending when the write fails."""
        pending = self.pending
        if pending:
            # A copy is written: a failed write's exception holds its frame, and with it views of what it wrote,
            # for as long as some thread handles it; views of ``pending`` itself would make the writer's next
            # append to it fail (a bytearray with exports cannot grow).
            self.write(self.max - len(pending) // ENTRY_SIZE, bytes(pending), dirty, new_dirs)
            self.pending = bytearray()

    def write(self, offset: int, data: bytes | bytearray, dirty: set[_CqFile], new_dirs: set[Path]) -> None:
        """Write whole entries at ``offset``, creating files as the queue grows."""
        view = memoryview(data)
        while view:
            if not self.files or offset >= self.files[-1].start + self.epf:
                self._add_file(offset - offset % self.epf, new_dirs)
            f = self.files[(offset - self.files[0].start) // self.epf]
            n = min(len(view) // ENTRY_SIZE, f.start + self.epf - offset)
            chunk = view[: n * ENTRY_SIZE]
            pos = (offset - f.start) * ENTRY_SIZE
            assert f.fd is not None  # only the tail file is written
            while chunk:
                written = os.pwrite(f.fd, chunk, pos)
                chunk = chunk[written:]
                pos += written
            dirty.add(f)
            view = view[n * ENTRY_SIZE :]
            offset += n

    def _add_file(self, start: int, new_dirs: set[Path]) -> None:
        if self.files and start != self.files[-1].start + self.epf:
            raise StoreError(f"consume queue {self.key}: new file at {start} would leave a hole")
        if not self.dir.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            new_dirs.update((self.dir.parent, self.dir.parent.parent))
        path = self.dir / _file_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if self.files:
            tail = self.files[-1]
            if tail.fd is not None:
                os.close(tail.fd)
                tail.fd = None
        self.files.append(_CqFile(path, start, fd))
        new_dirs.add(self.dir)

    def truncate_to(self, offset: int) -> None:
        """Drop entries at and after ``offset`` on disk; keeps one (possibly empty) file to remember max."""
        if self.files:
            offset = max(offset, self.files[0].start)
            while len(self.files) > 1 and self.files[-1].start > offset:
                self._drop_tail_file()
            tail = self.files[-1]
            if tail.fd is None:
                tail.fd = os.open(tail.path, os.O_RDWR)
            os.ftruncate(tail.fd, (offset - tail.start) * ENTRY_SIZE)
            os.fsync(tail.fd)
        self.max = offset
        self.min = min(self.min, offset)

    def _drop_tail_file(self) -> None:
        f = self.files.pop()
        if f.fd is not None:
            os.close(f.fd)
            f.fd = None
        f.path.unlink(missing_ok=True)

    def drop_head_files(self, below: int) -> None:
        """Delete files whose every slot is below logical offset ``below``; the tail file always stays."""
        while len(self.files) > 1 and self.files[0].start + self.epf <= below:
            f = self.files.pop(0)
            if f.fd is not None:
                os.close(f.fd)
                f.fd = None
            f.path.unlink(missing_ok=True)
            log.info("consume queue %s: deleted %s (below min offset %d)", self.key, f.path.name, below)

    def reset(self, offset: int) -> None:
        """Forget every file and restart the (empty) queue at ``offset``."""
        while self.files:
            self._drop_tail_file()
        self.min = self.max = offset

    def close(self) -> None:
        for f in self.files:
            if f.fd is not None:
                os.close(f.fd)
                f.fd = None


class ConsumeQueueStore:
    """Every consume queue under ``root_dir``.

    ``put`` is called by the single writer thread. ``read``, ``max_offset`` and friends may be called from any
    thread at any time and only ever see whole entries.
    """

    def __init__(self, root_dir: str | Path, entries_per_file: int = DEFAULT_ENTRIES_PER_FILE) -> None:
        if entries_per_file <= 0:
            raise ValueError("entries_per_file must be positive")
        self.root = Path(root_dir)
        self.entries_per_file = entries_per_file
        self.root.mkdir(parents=True, exist_ok=True)
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._queues_lock = threading.Lock()  # guards adding queues (readers iterate)
        self._dirty: set[tuple[_Queue, _CqFile]] = set()
        self._new_dirs: set[Path] = set()
        self._unspilled: set[_Queue] = set()  # queues with pending entries
        self._dirty_lock = threading.Lock()
        self._flush_lock = threading.Lock()  # serialises flush() and truncate_after() around the marker
        self._closed = False
        self._marker_path = self.root / DURABLE_MARKER_NAME
        self._marker_fd = os.open(self._marker_path, os.O_RDWR | os.O_CREAT, 0o644)
        self._durable = self._read_marker()
        # End (phys + size) of the highest record handled by a completed put(); after a reopen it starts at the
        # durable point, so recovery re-dispatches everything past it (identical entries are skipped).
        self._progress = self._durable
        self._load()

    # ------------------------------------------------------------------------------------------------ loading

    def _read_marker(self) -> int:
        data = os.pread(self._marker_fd, _MARKER.size, 0)
        if len(data) != _MARKER.size:
            return 0
        value, crc = _MARKER.unpack(data)
        if crc != zlib.crc32(data[:8]) or value < 0:
            log.warning("consume queue durable marker %s is damaged; recovery will rebuild", self._marker_path)
            return 0
        return value

    def _write_marker(self, value: int) -> None:
        head = value.to_bytes(8, "big", signed=True)
        os.pwrite(self._marker_fd, head + zlib.crc32(head).to_bytes(4, "big"), 0)
        _fdatasync(self._marker_fd)
        self._durable = value

    def _load(self) -> None:
        for topic_dir in sorted(self.root.iterdir()):
            if not topic_dir.is_dir():
                continue
            for queue_dir in sorted(topic_dir.iterdir()):
                if not (queue_dir.is_dir() and queue_dir.name.lstrip("-").isdigit()):
                    log.warning("consume queue: ignoring %s (not a queue directory)", queue_dir)
                    continue
                key = (topic_dir.name, int(queue_dir.name))
                queue = _Queue(key, queue_dir, self.entries_per_file)
                self._load_queue(queue)
                self._queues[key] = queue

    def _load_queue(self, q: _Queue) -> None:
        epf, file_bytes = q.epf, q.epf * ENTRY_SIZE
        starts: list[int] = []
        for child in q.dir.iterdir():
            name = child.name
            if len(name) != 20 or not name.isdigit() or not child.is_file():
                log.warning("consume queue %s: ignoring stray file %s", q.key, child)
                continue
            start_byte = int(name)
            if start_byte % file_bytes:
                raise CorruptStoreError(
                    f"{child}: start offset is not a multiple of {file_bytes}; the store was written with a "
                    f"different entries_per_file"
                )
            starts.append(start_byte // ENTRY_SIZE)
        starts.sort()
        for i in range(1, len(starts)):
            if starts[i] != starts[i - 1] + epf:
                # A missing file: keep the contiguous prefix; recovery re-dispatches the rest from the commit log.
                log.warning("consume queue %s: file missing after %s; dropping later files", q.key, starts[i - 1])
                for s in starts[i:]:
                    (q.dir / _file_name(s)).unlink(missing_ok=True)
                del starts[i:]
                break
        if not starts:
            return
        q.files = [_CqFile(q.dir / _file_name(s), s, None) for s in starts]

        # Leading all-zero slots only occur in the first file of a queue that started mid-file.
        first = q.files[0]
        q.min = first.start
        with open(first.path, "rb") as fh:
            head = fh.read(ENTRY_SIZE)
            if head == _ZERO_ENTRY:
                fh.seek(0)
                data = fh.read()
                q.min += (len(data) - len(data.lstrip(b"\0"))) // ENTRY_SIZE

        # Only the last two files (and any short one) can hold entries the OS had not written back when a crash
        # hit; older files were complete before their successor was created.
        end = None
        for i, f in enumerate(q.files):
            length = f.path.stat().st_size
            if length > file_bytes:
                raise CorruptStoreError(f"{f.path}: longer than {file_bytes} bytes")
            if i < len(q.files) - 2 and length == file_bytes:
                continue
            with open(f.path, "rb") as fh:
                data = fh.read()
            count = len(data) // ENTRY_SIZE
            lead = q.min - f.start if i == 0 else 0
            valid = _first_invalid(data, min(lead, count), count)
            if valid < epf:
                end = f.start + max(valid, lead)
                if length != (end - f.start) * ENTRY_SIZE:
                    log.warning(
                        "consume queue %s: truncating %s from %d to %d entries (partial or unwritten tail)",
                        q.key,
                        f.path.name,
                        length / ENTRY_SIZE,
                        end - f.start,
                    )
                    os.truncate(f.path, (end - f.start) * ENTRY_SIZE)
                for extra in q.files[i + 1 :]:
                    log.warning("consume queue %s: dropping %s past the valid end", q.key, extra.path.name)
                    extra.path.unlink(missing_ok=True)
                del q.files[i + 1 :]
                break
        if end is None:
            end = q.files[-1].start + epf
        if end <= q.min:
            q.min = end
        q.max = end
        q.files[-1].fd = os.open(q.files[-1].path, os.O_RDWR)

    # ------------------------------------------------------------------------------------------------ writing

    def put(self, dispatches: list[DispatchRequest]) -> None:
        """Append the entries of ``dispatches`` (single writer thread only).

        Entries below a queue's max are re-dispatches during recovery: identical ones are skipped; a different
        one means the consume queue disagrees with the commit log, which wins (the queue is cut there). An entry
        beyond max is a gap and raises :class:`StoreError` before anything is written, except in an empty queue,
        which then simply starts at that offset.
        """
        self._check_open()
        plans: dict[tuple[str, int], Plan] = {}
        batch_end = plan_puts(dispatches, plans, self._queue_for_write, self._plan_unusual)
        for plan in plans.values():
            if plan.entries or plan.truncate or plan.reset:
                self._apply(plan)
        if batch_end > self._progress:
            self._progress = batch_end

    def _plan_unusual(self, plan: Plan, offset: int, raw: bytes, next_offset: int) -> None:
        q = plan.queue
        if offset > next_offset:
            empty = q.min == q.max and not plan.entries and not plan.truncate
            if not empty:
                raise StoreError(
                    f"consume queue {q.key[0]}:{q.key[1]}: offset {offset} leaves a gap after {next_offset}"
                )
            log.warning("consume queue %s: empty queue restarts at offset %d (was %d)", q.key, offset, q.max)
            plan.base, plan.reset = offset, True
            plan.entries = [raw]
            return
        if offset < 0:
            raise StoreError(f"consume queue {q.key}: negative queue offset {offset}")
        if offset >= plan.base:  # repeated inside this batch
            current: bytes | None = plan.entries[offset - plan.base]
        else:
            with q.lock:
                self._spill(q)
                current = q.read_raw(offset, 1) if q.min <= offset < q.max else None
            if current is None:  # already retired by retention: nothing to compare or rewrite
                return
        if current == raw:
            return
        log.warning(
            "consume queue %s: entry %d differs from the commit log (%s != %s); cutting the queue there",
            q.key,
            offset,
            ENTRY.unpack(current),
            ENTRY.unpack(raw),
        )
        if offset >= plan.base:
            del plan.entries[offset - plan.base :]
            plan.entries.append(raw)
        else:
            plan.base, plan.truncate = offset, True
            plan.entries = [raw]

    def _queue_for_write(self, key: tuple[str, int]) -> _Queue:
        q = self._queues.get(key)
        if q is None:
            q = _Queue(key, self.root / key[0] / str(key[1]), self.entries_per_file)
            with self._queues_lock:
                self._queues[key] = q
        return q

    def _apply(self, plan: Plan) -> None:
        q = plan.queue
        try:
            with q.lock:
                if plan.reset:
                    q.pending = bytearray()  # they belonged to the files reset() deletes
                    q.reset(plan.base)
                elif plan.truncate:
                    self._spill(q)
                    q.truncate_to(plan.base)
                # plan.base == q.max here: the entries are appended to the pending ones, which readers see as
                # soon as max says so (a read reaching them writes them out first).
                q.pending += b"".join(plan.entries)
                q.max = plan.base + len(plan.entries)
                if len(q.pending) >= _SPILL_BYTES:
                    try:
                        self._spill(q)
                    except DiskFullError:
                        pass  # they stay pending (readers get them from memory); a later spill writes them
        except OSError as exc:
            raise StoreError(f"consume queue {q.key[0]}:{q.key[1]}: write failed: {exc}") from exc
        finally:
            if q.pending:
                with self._dirty_lock:
                    self._unspilled.add(q)

    def _spill(self, q: _Queue) -> None:
        """Write ``q``'s pending entries now (caller holds ``q.lock``)."""
        if not q.pending:
            return
        dirty: set[_CqFile] = set()
        new_dirs: set[Path] = set()
        try:
            q.spill(dirty, new_dirs)
        except OSError as exc:
            error = DiskFullError if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StoreError
            raise error(f"consume queue {q.key[0]}:{q.key[1]}: write failed: {exc}") from exc
        finally:
            with self._dirty_lock:
                self._dirty.update((q, f) for f in dirty)
                self._new_dirs |= new_dirs

    def flush(self) -> None:
        """fdatasync every file written since the last flush, then record the new durable point."""
        self._check_open()
        with self._flush_lock:
            progress = self._progress  # read before taking the dirty set: its files cover this progress
            with self._dirty_lock:
                unspilled, self._unspilled = self._unspilled, set()
            try:
                while unspilled:
                    q = unspilled.pop()
                    with q.lock:
                        self._spill(q)
            except BaseException:
                with self._dirty_lock:
                    self._unspilled |= unspilled
                    self._unspilled.add(q)
                raise
            with self._dirty_lock:
                dirty, self._dirty = self._dirty, set()
                new_dirs, self._new_dirs = self._new_dirs, set()
            for q, f in dirty:
                fd = self._open_for_sync(q, f)
                if fd is None:
                    continue
                try:
                    _fdatasync(fd)
                finally:
                    os.close(fd)
            for d in sorted(new_dirs, key=lambda p: len(p.parts), reverse=True):
                _fsync_dir(d)
            if progress != self._durable:
                self._write_marker(progress)

    @staticmethod
    def _open_for_sync(q: _Queue, f: _CqFile) -> int | None:
        # dup under the queue lock so that a concurrent truncation cannot close the fd (and the number be
        # reused) while we sync it.
        with q.lock:
            if f.fd is not None:
                return os.dup(f.fd)
            try:
                return os.open(f.path, os.O_RDONLY)
            except FileNotFoundError:
                return None

    # ------------------------------------------------------------------------------------------------ reading

    def max_offset(self, topic: str, queue_id: int) -> int:
        q = self._queues.get((topic, queue_id))
        return q.max if q is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        q = self._queues.get((topic, queue_id))
        return q.min if q is not None else 0

    def read(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[Entry]:
        """Up to ``max_count`` entries from ``offset`` as (commitLogOffset, size, tagsCode); [] if out of range."""
        self._check_open()
        q = self._queues.get((topic, queue_id))
        if q is None or max_count <= 0:
            return []
        with q.lock:
            if not q.min <= offset < q.max:
                return []
            count = min(max_count, q.max - offset)
            in_files = q.max - len(q.pending) // ENTRY_SIZE
            from_memory = b""
            if q.pending and offset + count > in_files:
                try:
                    self._spill(q)
                except DiskFullError:
                    # A full disk: serve the entries not written yet from memory.
                    first = max(offset, in_files)
                    from_memory = bytes(
                        q.pending[(first - in_files) * ENTRY_SIZE : (offset + count - in_files) * ENTRY_SIZE]
                    )
                    count = max(0, in_files - offset)
            plan = q.pin(offset, count) if count else []
        # The disk reads run without the lock: a lagging consumer on a cold file must not stall the writer.
        # Appends never touch published entries; retention or truncation racing with us only shortens the read.
        parts: list[bytes] = []
        done = 0  # plan items whose fd is closed already; each fd is closed exactly once
        try:
            for path, fd, pos, want in plan:
                done += 1
                if fd is None:
                    try:
                        fd = os.open(path, os.O_RDONLY)
                    except FileNotFoundError:
                        break
                try:
                    data = os.pread(fd, want, pos)
                finally:
                    os.close(fd)
                parts.append(data[: len(data) - len(data) % ENTRY_SIZE])
                if len(data) < want:
                    from_memory = b""  # a short read: what follows in memory is not contiguous with it
                    break
        finally:
            for _, fd, _, _ in plan[done:]:
                if fd is not None:
                    os.close(fd)
        return list(ENTRY.iter_unpack(b"".join(parts) + from_memory))

    def earliest_entry(self, topic: str, queue_id: int) -> Entry | None:
        """The entry at the min offset, or None for an empty or unknown queue."""
        entries = self.read(topic, queue_id, self.min_offset(topic, queue_id), 1)
        return entries[0] if entries else None

    def queues(self) -> list[tuple[str, int]]:
        with self._queues_lock:
            return list(self._queues)

    def max_physical_offset(self) -> int:
        """Commit-log offset up to which every dispatched record has its entry here; 0 when empty.

        While running: the end (phys + size) of the highest record passed to a completed put(). After reopening:
        the durable point recorded by the last flush(), so a crash between flushes (or in the middle of a put
        that touched several queues) never hides a missing entry from recovery.
        """
        return self._progress

    def search_by_timestamp(
        self, topic: str, queue_id: int, timestamp: int, store_time_of: Callable[[int, int], int]
    ) -> int:
        """Logical offset of the entry whose store time is nearest ``timestamp`` (SEARCH_OFFSET_BY_TIMESTAMP).

        An exact hit gives the first entry with that store time; otherwise the nearer of the two neighbours (the
        earlier one on a tie), or the only neighbour at either end. 0 for an unknown or empty queue.
        ``store_time_of(phys, size)`` reads a record's store time; a negative answer (record already deleted)
        counts as older than everything, and such an entry is never the answer (with none left: max offset).
        """
        self._check_open()
        q = self._queues.get((topic, queue_id))
        if q is None:
            return 0
        with q.lock:
            lo, hi = q.min, q.max
        if lo >= hi:
            return 0
        cache: dict[int, int] = {}

        def time_at(offset: int) -> int:
            t = cache.get(offset)
            if t is None:
                # Retention may have moved min past this offset meanwhile: then it counts as too old.
                found = self.read(topic, queue_id, offset, 1)
                t = store_time_of(found[0][0], found[0][1]) if found else -1
                cache[offset] = t
            return t

        first, last = lo, hi - 1
        left, right = lo, hi  # bisect_left: first offset whose store time >= timestamp
        while left < right:
            mid = (left + right) // 2
            if time_at(mid) < timestamp:
                left = mid + 1
            else:
                right = mid
        if left <= last and time_at(left) == timestamp:
            return left
        if left > last:
            # Every entry is older; if even the newest record is gone, the next message is the answer.
            return last if time_at(last) >= 0 else hi
        if left == first:
            return first
        before, after = time_at(left - 1), time_at(left)
        if before < 0:  # the older neighbour's record is gone: never hand it out
            return left
        return left if abs(timestamp - before) > abs(after - timestamp) else left - 1

    # ------------------------------------------------------------------------------------------ maintenance

    def truncate_after(self, phys_offset: int) -> None:
        """Drop every entry whose commit-log offset is >= ``phys_offset``, in every queue, on disk too."""
        self._check_open()
        with self._flush_lock:
            # Lower the durable point first: if we crash halfway, recovery simply redoes more.
            if self._durable > phys_offset:
                self._write_marker(phys_offset)
            self._progress = min(self._progress, phys_offset)
            for q in list(self._queues.values()):
                with q.lock:
                    self._spill(q)
                    if q.max <= q.min or q.entry(q.max - 1)[0] < phys_offset:
                        continue
                    cut = q.bisect_phys(phys_offset, q.min, q.max)
                    log.info("consume queue %s: truncating from offset %d (phys >= %d)", q.key, cut, phys_offset)
                    try:
                        q.truncate_to(cut)
                    except OSError as exc:
                        raise StoreError(f"consume queue {q.key}: truncate failed: {exc}") from exc

    def correct_min_offset(self, min_phys: int) -> None:
        """After commit-log retention: each queue's min becomes its first entry with phys >= ``min_phys``.

        Files lying wholly below the new min are deleted, except a queue's tail file, which keeps its max.
        """
        self._check_open()
        with self._queues_lock:
            queues = list(self._queues.items())
        for (topic, queue_id), q in queues:
            # Search without the lock (reads may hit cold files); published entries do not change under us.
            with q.lock:
                lo, hi = q.min, q.max
            while lo < hi:
                mid = (lo + hi) // 2
                found = self.read(topic, queue_id, mid, 1)
                if not found or found[0][0] < min_phys:  # not found: min moved past mid meanwhile
                    lo = mid + 1
                else:
                    hi = mid
            with q.lock:
                if lo > q.min:
                    q.min = min(lo, q.max)
                try:
                    q.drop_head_files(q.min)
                except OSError as exc:
                    raise StoreError(f"consume queue {q.key}: deleting old files failed: {exc}") from exc

    def close(self) -> None:
        """Flush and release every file. Further calls raise StoreClosedError."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        for q in self._queues.values():
            with q.lock:
                q.close()
        os.close(self._marker_fd)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("consume queue store is closed")
