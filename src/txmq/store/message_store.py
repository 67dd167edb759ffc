"""The message store: one append pipeline (group commit), reads, and the wiring of the commit log, consume queues,
key index, checkpoint, recovery (:mod:`txmq.store.recovery`) and retention.

One writer at a time assigns offsets, writes each group of pending appends with as few ``pwritev`` calls as possible,
dispatches consume-queue entries, fdatasyncs (SYNC_FLUSH), publishes what became visible and completes the waiting
requests, one ``call_soon_threadsafe`` per event loop per group. The writer is the writer thread, or a thread calling
the blocking ``put_sync`` while the writer is idle (it then writes its own group under the same append lock). Readers
never take the writer's locks.

Off the append path, on threads of their own: the key index (records are queued by the writer and indexed every
10 ms; a key query indexes what is still queued first), periodic checkpoints (consume-queue and index fdatasyncs,
then the checkpoint file), ASYNC_FLUSH's flusher, and zero-filling the next commit-log segment.
"""

from __future__ import annotations

import _thread
import asyncio
import enum
import fcntl
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.errors import RecordDecodeError, StoreClosedError, StoreError
from txmq.protocol.record import (
    MIN_RECORD_SIZE,
    Host,
    MessageRecord,
    RecordView,
    decode_record,
    encode_offset_msg_id,
    read_store_timestamp,
)
from txmq.protocol.record.layout import I64, QO_PO, QUEUE_OFFSET_POS
from txmq.store.checkpoint import AbortMarker, Checkpoint, CheckpointState
from txmq.store.commit_log import CommitLog, blank_for
from txmq.store.config import StoreConfig
from txmq.store.dispatch import DispatchRequest
from txmq.store.entry import (
    AppendEntry,
    EntryError,
    encode_entry,
    entry_from_bytes,
)
from txmq.store.recovery import Recovery, RecoveryInfo, cq_offset_sum
from txmq.store.retention import RetentionService
from txmq.store.stats import StoreStats

log = logging.getLogger("txmq.store")


class PutStatus(enum.Enum):
    """RocketMQ's PutMessageStatus values that txmq produces."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class GetStatus(enum.Enum):
    """RocketMQ's GetMessageStatus."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


class PutResult:
    """The outcome of one stored (or refused) record. ``physical_offset`` and ``store_host`` make the offsetMsgId."""

    __slots__ = ("physical_offset", "queue_offset", "remark", "size", "status", "store_host", "store_timestamp")

    def __init__(
        self,
        status: PutStatus,
        physical_offset: int = -1,
        queue_offset: int = -1,
        store_timestamp: int = 0,
        size: int = 0,
        store_host: Host | None = None,
        remark: str | None = None,
    ) -> None:
        self.status = status
        self.physical_offset = physical_offset
        self.queue_offset = queue_offset
        self.store_timestamp = store_timestamp
        self.size = size
        self.store_host = store_host
        self.remark = remark

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK

    @property
    def msg_id(self) -> str:
        """offsetMsgId: store host + commit-log offset."""
        if self.store_host is None or self.physical_offset < 0:
            raise StoreError(f"no offsetMsgId for a put that failed with {self.status.value}")
        return encode_offset_msg_id(self.store_host, self.physical_offset)

    def __repr__(self) -> str:
        if self.ok:
            return (
                f"PutResult(PUT_OK, phys={self.physical_offset}, queue_offset={self.queue_offset}, "
                f"size={self.size}, store_timestamp={self.store_timestamp})"
            )
        return f"PutResult({self.status.value}, {self.remark!r})"


@dataclass(slots=True)
class GetMessageResult:
    """A PULL's worth of records: ``buffers`` joined is the response body (stored bytes, unchanged)."""

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    buffers: list[bytes] = field(default_factory=list)
    message_count: int = 0
    total_size: int = 0

    @property
    def body(self) -> bytes:
        return self.buffers[0] if len(self.buffers) == 1 else b"".join(self.buffers)


class ConsumeQueueLike(Protocol):
    def put(self, dispatches: list[DispatchRequest]) -> None: ...
    def flush(self) -> None: ...
    def max_offset(self, topic: str, queue_id: int) -> int: ...
    def min_offset(self, topic: str, queue_id: int) -> int: ...
    def read(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[tuple[int, int, int]]: ...
    def queues(self) -> Iterable[tuple[str, int]]: ...
    def max_physical_offset(self) -> int: ...
    def truncate_after(self, phys_offset: int) -> None: ...
    def correct_min_offset(self, min_phys: int) -> None: ...
    def search_by_timestamp(
        self, topic: str, queue_id: int, timestamp: int, store_time_of: Callable[[int, int], int]
    ) -> int: ...
    def close(self) -> None: ...


class KeyIndexLike(Protocol):
    def put(self, dispatches: list[DispatchRequest]) -> None: ...
    def flush(self) -> None: ...
    def query(self, topic: str, key: str, max_num: int, begin_ts: int, end_ts: int) -> list[int]: ...
    def max_physical_offset(self) -> int: ...
    def truncate_after(self, phys_offset: int) -> None: ...
    def delete_before(self, phys_offset: int) -> None: ...
    def close(self) -> None: ...


NewMessagesCallback = Callable[[str, int, int], Any]


class _Request:
    """One put or put_many waiting for the writer."""

    __slots__ = ("entries", "future", "link", "loop", "result", "single", "waiter")

    def __init__(
        self,
        entries: list[AppendEntry],
        future: asyncio.Future[Any] | None,
        loop: asyncio.AbstractEventLoop | None,
        single: bool,
    ) -> None:
        self.entries = entries
        self.future = future
        self.loop = loop
        self.single = single
        self.result: Any = None
        self.waiter: Any = None
        # Byte positions in the last entry that receive the offsets (hex) of the entries before it, in order.
        self.link: list[int] | None = None


# The indexer takes what the writer queued every _INDEX_TICK seconds, or at once when _INDEX_WAKE_AT records wait.
# Nothing reads the index without first indexing what is queued, so the tick only bounds memory and catch-up work.
_INDEX_TICK = 0.01
_INDEX_WAKE_AT = 1024
_INDEX_CHUNK = 256  # records indexed per hold of the GIL (about a millisecond)
_INDEX_BACKLOG_MAX = 20_000  # the writer indexes itself past this many waiting records
# A checkpoint flushes the index once this many records were indexed since its last flush, or flushIntervalIndex
# has passed: a busy store keeps its post-crash index replay (and each flush) bounded, a quiet one flushes rarely.
_INDEX_FLUSH_RECORDS = 100_000


def _link_positions(entries: list[AppendEntry], prop: str) -> list[int]:
    """Where the 16 offset hex digits of each offsetMsgId placeholder in property ``prop`` of the last entry start.

    The value is a comma-separated list; empty items are skipped, and there must be one placeholder per entry
    before the last."""
    if len(entries) < 2:
        raise ValueError("a link needs a record before the linking one")
    buf = entries[-1][0]
    name = prop.encode() + b"\x01"
    start = buf.rfind(name)
    if start < 0:
        raise ValueError(f"the last record has no property {prop}")
    begin = start + len(name)
    end = buf.find(b"\x02", begin)
    if end < 0:
        end = len(buf)
    positions = []
    pos = begin
    for item in bytes(buf[begin:end]).split(b","):
        if item:
            if len(item) not in (32, 56):
                raise ValueError(f"property {prop} is not an offsetMsgId placeholder: {item!r}")
            positions.append(pos + len(item) - 16)
        pos += len(item) + 1
    if len(positions) != len(entries) - 1:
        raise ValueError(f"property {prop} has {len(positions)} placeholders for {len(entries) - 1} records before it")
    return positions


class _Task:
    """A function the writer thread runs between groups (retention, forced checkpoints)."""

    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = _thread.allocate_lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None


_STOP = object()


def _complete_on_loop(
    reqs: list[_Request], updates: list[tuple[tuple[str, int], int]] | None, hooks: list[NewMessagesCallback]
) -> None:
    """Runs on an event loop: resolve that loop's futures of one group, then tell the new-message hooks."""
    for req in reqs:
        fut = req.future
        if fut is not None and not fut.done():
            fut.set_result(req.result)
    if updates and hooks:
        for (topic, queue_id), max_offset in updates:
            for hook in hooks:
                try:
                    hook(topic, queue_id, max_offset)
                except Exception:
                    log.exception("new-message hook %r failed", hook)


class MessageStore:
    """Commit log + consume queues + key index behind one append pipeline.

    Blocking life cycle: ``open()`` / ``shutdown()`` (also a context manager). Asyncio: ``await start()`` /
    ``await close()`` (also ``async with``), which also runs the retention timer on the clock.
    """

    def __init__(
        self,
        config: StoreConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        consume_queue_factory: Callable[[str, StoreConfig], ConsumeQueueLike] | None = None,
        key_index_factory: Callable[[str, StoreConfig], KeyIndexLike] | None = None,
        disk_usage: Callable[[], float] | None = None,
    ) -> None:
        self.config = config if config is not None else StoreConfig()
        self.clock = clock
        cfg = self.config
        self.root = cfg.store_path_root_dir
        self.commit_log = CommitLog(
            os.path.join(self.root, "commitlog"), cfg.mapped_file_size_commit_log, cfg.effective_preallocate
        )
        self._cq_factory = consume_queue_factory or _default_consume_queue
        self._index_factory = key_index_factory or _default_key_index
        self.consume_queue: ConsumeQueueLike = None  # type: ignore[assignment]  # set by open()
        self.key_index: KeyIndexLike = None  # type: ignore[assignment]
        self._checkpoint = Checkpoint(os.path.join(self.root, "checkpoint"))
        self._abort = AbortMarker(os.path.join(self.root, "abort"))
        self.statistics = StoreStats()
        self.recovery: RecoveryInfo | None = None
        self.retention = RetentionService(self, disk_usage=disk_usage)

        self._max_body = cfg.max_message_size
        # A record must leave room for the end-of-file blank in an otherwise empty segment.
        self._max_record = cfg.mapped_file_size_commit_log - 8
        self._delay_levels = cfg.delay_levels_ms()
        self._sync = cfg.sync_flush
        self._state = "new"  # new -> open -> closing -> closed
        self._failure: str | None = None  # set when a write/flush failed: puts are refused until a restart
        self._writer_dead = False
        self._put_lock = threading.Lock()  # makes "check open + enqueue" atomic against shutdown()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._flusher: threading.Thread | None = None
        self._lock_fd: int | None = None
        self._flusher_stop = threading.Event()
        self._flush_lock = threading.Lock()
        # Held by whoever writes a group: the writer thread, or a blocking appender writing its own (put_many_sync).
        self._append_lock = threading.Lock()
        self._checkpointer: threading.Thread | None = None
        self._checkpoint_stop = threading.Event()
        self._checkpoint_lock = threading.Lock()  # one checkpoint at a time (periodic, forced, final)
        # The key index is built off the append path: the writer hands each group's dispatches to an indexer thread
        # (appends are acknowledged without waiting for it), and a key query first indexes whatever is still queued,
        # so a query always sees every acknowledged record.
        self._indexer: threading.Thread | None = None
        self._index_backlog: list[DispatchRequest] = []
        self._index_backlog_lock = threading.Lock()
        self._index_drain_lock = threading.Lock()  # one drain at a time, so the index gets records in log order
        self._index_wake = threading.Event()
        self._index_stop = False
        self._hooks: dict[asyncio.AbstractEventLoop | None, list[NewMessagesCallback]] = {}
        self._loop_batches: dict[asyncio.AbstractEventLoop, list[_Request]] = {}  # each touched by its loop only

        # Writer state (whoever holds the append lock: the writer thread or a blocking appender; after open()).
        self._seg: Any = None
        self._wpos = 0  # next physical offset to write
        self._next_offsets: dict[tuple[str, int], int] = {}
        self._checkpointed_pos = -1

        # Published state (written by the writer/flusher, read by anyone).
        self._flushed = 0  # commit-log bytes known to be fdatasync'ed
        self._confirmed = 0  # commit-log bytes whose records are visible
        self._visible: dict[tuple[str, int], int] = {}  # queue -> max offset readers may see
        self._index_ts = 0  # store time of the last record handed to the key index
        # (written position, last store time, last indexed store time) at the end of the last group: everything up
        # to that position is in the consume queues and the index, which is what a checkpoint may claim.
        self._snap = (0, 0, 0)
        self._index_flushed_at = 0.0  # monotonic time of the last key-index flush
        self._index_durable = (0, 0)  # (position, store time) the index was flushed up to
        self._index_queued = 0  # records ever handed to the indexer (writer)
        self._index_queued_at_flush = 0  # that count when the index was last flushed

    # ------------------------------------------------------------------------------------------ life cycle

    def open(self) -> MessageStore:
        """Recover (fast after a clean shutdown, verifying after a crash) and start the append pipeline."""
        if self._state != "new":
            raise StoreError(f"the store is {self._state}; open() runs once")
        os.makedirs(self.root, exist_ok=True)
        self._lock_root()
        cfg = self.config
        try:
            self.consume_queue = self._cq_factory(os.path.join(self.root, "consumequeue"), cfg)
            self.key_index = self._index_factory(os.path.join(self.root, "index"), cfg)
            self.recovery = self._recover()
        except BaseException:
            self._close_files()
            raise
        self._writer = threading.Thread(target=self._writer_main, name="txmq-store-writer", daemon=True)
        self._state = "open"
        self._writer.start()
        if not self._sync:
            self._flusher = threading.Thread(target=self._flusher_main, name="txmq-store-flusher", daemon=True)
            self._flusher.start()
        self._checkpointer = threading.Thread(target=self._checkpoint_main, name="txmq-store-checkpoint", daemon=True)
        self._checkpointer.start()
        self._indexer = threading.Thread(target=self._indexer_main, name="txmq-store-indexer", daemon=True)
        self._indexer.start()
        return self

    async def start(self) -> None:
        """``open()`` in a worker thread (recovery can take seconds), then start the retention timer."""
        await asyncio.to_thread(self.open)
        self.retention.start()

    def shutdown(self) -> None:
        """Finish every queued append, flush everything, write a clean checkpoint and remove the abort marker."""
        with self._put_lock:
            if self._state != "open":
                if self._state == "new":
                    self._state = "closed"
                return
            self._state = "closing"
        self.retention.stop()
        self._queue.put(_STOP)
        if self._writer is not None:
            self._writer.join()
        if self._flusher is not None:
            self._flusher_stop.set()
            self._flusher.join()
        if self._checkpointer is not None:
            self._checkpoint_stop.set()
            self._checkpointer.join()
        with self._append_lock:  # a blocking appender still writing its own group finishes first
            pass
        if self._indexer is not None:
            self._index_stop = True
            self._index_wake.set()
            self._indexer.join()
        self._fail_leftovers()
        try:
            if self._failure is None:
                self._flush_commit_log()
                self._write_checkpoint(clean=True)
                self._abort.remove()
            else:
                log.error(
                    "store closing after a write failure (%s); the next open will run crash recovery", self._failure
                )
        finally:
            self._state = "closed"
            self._close_files()

    async def close(self) -> None:
        """:meth:`shutdown` in a worker thread; the retention timer is stopped here, on its own loop."""
        self.retention.stop()
        await asyncio.to_thread(self.shutdown)

    def __enter__(self) -> MessageStore:
        return self.open() if self._state == "new" else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    async def __aenter__(self) -> MessageStore:
        if self._state == "new":
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def is_open(self) -> bool:
        return self._state == "open"

    def _lock_root(self) -> None:
        """Hold ``<root>/lock`` (flock) while open: two stores appending to one directory would corrupt it."""
        fd = os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"the store at {self.root} is already open (its lock file is held)") from None
        self._lock_fd = fd

    def _close_files(self) -> None:
        for closer in (self.consume_queue, self.key_index):
            if closer is not None:
                try:
                    closer.close()
                except Exception:
                    log.exception("closing %r failed", closer)
        self._checkpoint.close()
        self.commit_log.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def _fail_leftovers(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            remark = f"the store failed: {self._failure}" if self._failure else "the store is closed"
            if isinstance(item, list):
                self._finish_failed(item, PutStatus.SERVICE_NOT_AVAILABLE, remark)
            elif isinstance(item, _Task):
                item.error = StoreError(remark) if self._failure else StoreClosedError(remark)
                item.done.release()

    # ------------------------------------------------------------------------------------------ appending

    async def put(self, record: MessageRecord) -> PutResult:
        """Append one record; returns once it is durable (SYNC_FLUSH) or written (ASYNC_FLUSH).

        Invalid records and a closed store give a result with a failure status instead of raising.
        """
        return await self.put_future(record)

    def put_future(self, record: MessageRecord) -> asyncio.Future[PutResult]:
        """:meth:`put` without a coroutine: a future of the result, for hot paths that would otherwise pay for a
        task per message (the broker's send processor). Must be called on a running event loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PutResult] = loop.create_future()
        try:
            entry = encode_entry(record, self._max_body, self._delay_levels)
        except EntryError as exc:
            fut.set_result(self._refused(exc.status, str(exc)))
            return fut
        if len(entry[0]) > self._max_record:
            fut.set_result(self._refused("MESSAGE_ILLEGAL", self._too_big(len(entry[0]))))
            return fut
        self._submit(loop, _Request([entry], fut, loop, True))
        return fut

    async def put_many(self, records: list[MessageRecord], *, link: str | None = None) -> list[PutResult]:
        """Append records as one request: see :meth:`put_many_future`."""
        return await self.put_many_future(records, link=link)

    def put_many_future(
        self, records: list[MessageRecord], *, link: str | None = None
    ) -> asyncio.Future[list[PutResult]]:
        """Append records as one request: consecutive queue offsets per queue, all written or none accepted.

        ``link`` names a property of the **last** record whose value is a comma-separated list of offsetMsgId
        placeholders (IPv4 or IPv6 store host, any offset), one per record before it (empty items are skipped): the
        writer sets the offset part of the k-th placeholder to the commit-log offset the k-th record gets. One
        append can so store records together with references to them (committed copies and their op marker)
        without a second round through the writer.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[PutResult]] = loop.create_future()
        entries = self._encode_all(records)
        if isinstance(entries, PutResult):
            fut.set_result([entries] * max(1, len(records)))
            return fut
        req = _Request(entries, fut, loop, False)
        if link is not None:
            req.link = _link_positions(entries, link)
        self._submit(loop, req)
        return fut

    async def put_raw(self, data: bytes | bytearray, store_host: Host | None = None) -> PutResult:
        """Append an already encoded record (its offsets and store time are overwritten)."""
        try:
            entry = entry_from_bytes(data, self._max_body, self._delay_levels, store_host)
        except EntryError as exc:
            return self._refused(exc.status, str(exc))
        if len(entry[0]) > self._max_record:
            return self._refused("MESSAGE_ILLEGAL", self._too_big(len(entry[0])))
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._submit(loop, _Request([entry], fut, loop, True))
        result: PutResult = await fut
        return result

    def put_sync(self, record: MessageRecord) -> PutResult:
        """Blocking :meth:`put` for threads without an event loop (tools, the crash-test child)."""
        return self.put_many_sync([record])[0]

    def put_many_sync(self, records: list[MessageRecord]) -> list[PutResult]:
        entries = self._encode_all(records)
        if isinstance(entries, PutResult):
            return [entries] * max(1, len(records))
        req = _Request(entries, None, None, False)
        # Leader path: with the writer idle, the calling thread writes (and in SYNC mode fdatasyncs) its own group,
        # which spares a blocking appender the two thread hand-overs. It holds the append lock as the writer does,
        # so there is still one writer at a time; when the writer is busy the request joins its next group.
        if self._append_lock.acquire(blocking=False):
            try:
                if self._state == "open" and self._failure is None and self._queue.empty():
                    self._run_group([req])
                    inline: list[PutResult] = req.result
                    return inline
            finally:
                self._append_lock.release()
        req.waiter = _thread.allocate_lock()
        req.waiter.acquire()
        with self._put_lock:
            if self._state != "open" or self._failure is not None:
                return [self._unavailable()] * len(records)
            self._queue.put([req])
        req.waiter.acquire()
        results: list[PutResult] = req.result
        return results

    def _submit(self, loop: asyncio.AbstractEventLoop, req: _Request) -> None:
        """Collect the requests of one event-loop iteration and hand them to the writer together: one queue put
        and at most one writer wake-up per iteration, after every ready task has had its turn to append."""
        batch = self._loop_batches.get(loop)
        if batch is None:
            self._loop_batches[loop] = [req]
            loop.call_soon(self._hand_over, loop)
        else:
            batch.append(req)

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._loop_batches.pop(loop, None)
        if not batch:
            return
        with self._put_lock:
            if self._state == "open" and self._failure is None:
                self._queue.put(batch)
                return
        unavailable = self._unavailable()
        for req in batch:
            req.result = unavailable if req.single else [unavailable] * len(req.entries)
        _complete_on_loop(batch, None, [])

    def _encode_all(self, records: list[MessageRecord]) -> list[AppendEntry] | PutResult:
        if not records:
            return self._refused("MESSAGE_ILLEGAL", "no records to put")
        entries: list[AppendEntry] = []
        for i, record in enumerate(records):
            try:
                entry = encode_entry(record, self._max_body, self._delay_levels)
            except EntryError as exc:
                return self._refused(exc.status, f"record {i} of {len(records)}: {exc}")
            if len(entry[0]) > self._max_record:
                return self._refused("MESSAGE_ILLEGAL", f"record {i}: {self._too_big(len(entry[0]))}")
            entries.append(entry)
        return entries

    def _too_big(self, size: int) -> str:
        return f"record of {size} bytes does not fit a commit-log segment of {self.config.mapped_file_size_commit_log}"

    def _refused(self, status: str, remark: str) -> PutResult:
        self.statistics.put_failures += 1
        return PutResult(PutStatus[status], remark=remark)

    def _unavailable(self) -> PutResult:
        self.statistics.put_failures += 1
        if self._failure is not None:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=f"the store failed: {self._failure}")
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=f"the store is {self._state}")

    # ------------------------------------------------------------------------------------------ the writer

    def _writer_main(self) -> None:
        try:
            self._writer_loop()
        except BaseException as exc:  # a bug, not an IO error (those are handled per group): never leave puts hanging
            log.critical("the append pipeline's writer thread died; refusing further appends", exc_info=True)
            with self._put_lock:
                self._failure = self._failure or f"writer thread died: {type(exc).__name__}: {exc}"
                self._writer_dead = True
            self._fail_leftovers()

    def _writer_loop(self) -> None:
        q = self._queue
        get = q.get
        stop = False
        while not stop:
            items = [get()]
            for _ in range(q.qsize()):  # qsize() is a lower bound here: only this thread takes items
                items.append(q.get_nowait())
            reqs: list[_Request] = []
            for item in items:
                if type(item) is list:  # a hand-over: the requests of one loop iteration or one put_sync
                    reqs += item
                    continue
                if reqs:
                    with self._append_lock:
                        self._run_group(reqs)
                    reqs = []
                if item is _STOP:
                    stop = True
                else:
                    with self._append_lock:
                        self._run_task(item)
            if reqs:
                with self._append_lock:
                    self._run_group(reqs)

    def _run_task(self, task: _Task) -> None:
        try:
            task.result = task.fn()
        except BaseException as exc:
            task.error = exc
        finally:
            task.done.release()

    def call_in_writer(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the writer thread between groups and return its result (blocking)."""
        task = _Task(fn)
        with self._put_lock:
            if self._state != "open":
                raise StoreClosedError(f"the store is {self._state}")
            if self._writer_dead:
                raise StoreError(f"the store failed: {self._failure}")
            self._queue.put(task)
        task.done.acquire()
        if task.error is not None:
            raise task.error
        return task.result

    def _run_group(self, reqs: list[_Request]) -> None:
        if self._failure is not None:
            self._finish_failed(reqs, PutStatus.SERVICE_NOT_AVAILABLE, f"the store failed: {self._failure}")
            return
        try:
            self._write_group(reqs)
        except BaseException as exc:
            # The log, the queues and what readers see may now disagree; only crash recovery can reconcile
            # them, so refuse all further appends until the store is reopened.
            self._failure = f"{type(exc).__name__}: {exc}"
            log.critical("append pipeline failed; refusing further appends until restart", exc_info=True)
            self._finish_failed(reqs, PutStatus.SERVICE_NOT_AVAILABLE, f"the store failed: {self._failure}")

    def _write_group(self, reqs: list[_Request]) -> None:
        """Stamp, write, dispatch, flush, publish and complete one group. Writer thread only."""
        now = self.clock.now_ms()
        commit_log = self.commit_log
        seg = self._seg
        wpos = self._wpos
        if seg is None or not seg.start <= wpos < seg.end:
            seg = commit_log.segment_for_write(wpos)
        seg_end = seg.end
        write_from = wpos
        bufs: list[Any] = []
        dispatches: list[DispatchRequest] = []
        touched: dict[tuple[str, int], int] = {}
        next_offsets = self._next_offsets
        pack_qo_po = QO_PO.pack_into
        qo_pos = QUEUE_OFFSET_POS
        pack_i64 = I64.pack_into
        dispatch = DispatchRequest
        result = PutResult
        ok = PutStatus.PUT_OK
        stats = self.statistics
        topic_puts = stats.topic_puts
        messages = 0
        nbytes = 0
        for req in reqs:
            results: list[PutResult] = []
            for buf, topic, queue_id, key, sys_flag, needs_cq, code, keys, uniq, delay, ts_pos, host in req.entries:
                size = len(buf)
                if wpos + size + 8 > seg_end:
                    # Seal this segment (blank + fdatasync) before any byte reaches the next one, so a segment
                    # never holds data while its predecessor's end is not durable.
                    if wpos < seg_end:
                        bufs.append(blank_for(seg_end - wpos))
                    if bufs:
                        commit_log.write(seg, write_from - seg.start, bufs)
                        bufs = []
                    commit_log.flush(seg)
                    seg = commit_log.segment_for_write(seg_end)
                    wpos = write_from = seg.start
                    seg_end = seg.end
                if needs_cq:
                    qo = next_offsets.get(key, 0)
                    next_offsets[key] = touched[key] = qo + 1
                else:
                    qo = 0
                pack_qo_po(buf, qo_pos, qo, wpos)
                pack_i64(buf, ts_pos, now)
                dispatches.append(
                    dispatch(topic, queue_id, qo, wpos, size, now + delay if delay else code, now, sys_flag, keys, uniq)
                )
                bufs.append(buf)
                results.append(result(ok, wpos, qo, now, size, host))
                wpos += size
                nbytes += size
            if req.link is not None:  # the last entry refers to those before it (its buffer is not written yet)
                last = req.entries[-1][0]
                for k, at in enumerate(req.link):
                    last[at : at + 16] = b"%016X" % results[k].physical_offset
            n = len(results)
            messages += n
            topic_puts[topic] = topic_puts.get(topic, 0) + n  # per request: a put_many has one topic in practice
            req.result = results[0] if req.single else results
        if bufs:
            commit_log.write(seg, write_from - seg.start, bufs)
        self._seg = seg
        self._wpos = wpos
        commit_log.maybe_prepare(wpos)
        self.consume_queue.put(dispatches)
        with self._index_backlog_lock:
            backlog = self._index_backlog
            backlog += dispatches
            waiting = len(backlog)
        self._index_queued += len(dispatches)
        if waiting >= _INDEX_WAKE_AT:  # else the indexer's next tick takes them: no wake-up per group
            self._index_wake.set()
            if waiting >= _INDEX_BACKLOG_MAX:
                # The indexer is not keeping up (it competes for the GIL with the event loop and this writer):
                # index here, so the backlog, and the catch-up a query or checkpoint may have to do, stay bounded.
                self._drain_index()
        if self._sync:
            t0 = time.perf_counter_ns()
            commit_log.flush(seg)
            stats.flush_latency_us.add((time.perf_counter_ns() - t0) // 1000)
            stats.flushes += 1
            self._flushed = wpos
        # Publish only now: in SYNC mode a reader never sees an entry that a crash could take back.
        if touched:
            self._visible.update(touched)
        self._confirmed = wpos
        self._snap = (wpos, now, now)
        stats.groups += 1
        stats.put_requests += len(reqs)
        stats.put_messages += messages
        stats.put_bytes += nbytes
        stats.group_messages.add(messages)
        self._complete(reqs, touched)

    def _complete(self, reqs: list[_Request], touched: dict[tuple[str, int], int]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Request]] = {}
        for req in reqs:
            loop = req.loop
            if loop is None:
                if req.waiter is not None:  # None: a blocking appender that wrote its own group
                    req.waiter.release()
            else:
                group = by_loop.get(loop)
                if group is None:
                    by_loop[loop] = [req]
                else:
                    group.append(req)
        hooks = self._hooks
        updates = list(touched.items()) if touched and hooks else None
        for loop, group in by_loop.items():
            try:
                loop.call_soon_threadsafe(_complete_on_loop, group, updates, hooks.get(loop, ()))
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                pass
        if updates:
            for loop, callbacks in hooks.items():
                if loop in by_loop:
                    continue
                if loop is None:
                    _complete_on_loop([], updates, callbacks)
                    continue
                try:
                    loop.call_soon_threadsafe(_complete_on_loop, [], updates, callbacks)
                except RuntimeError:
                    pass

    def _finish_failed(self, reqs: list[_Request], status: PutStatus, remark: str) -> None:
        for req in reqs:
            failed = PutResult(status, remark=remark)
            req.result = failed if req.single else [failed] * len(req.entries)
            self.statistics.put_failures += len(req.entries)
        self._complete(reqs, {})

    def _indexer_main(self) -> None:
        wake = self._index_wake
        while True:
            wake.wait(_INDEX_TICK)
            wake.clear()
            try:
                self._drain_index()
            except Exception as exc:
                # As for a failed write: the index and the log may now disagree until crash recovery rebuilds it.
                self._failure = self._failure or f"key index: {type(exc).__name__}: {exc}"
                log.critical("building the key index failed; refusing further appends until restart", exc_info=True)
                return
            if self._index_stop:
                return

    def _drain_index(self) -> None:
        """Index every dispatched record still waiting (indexer thread, writer when it falls behind, key queries,
        checkpoints). The GIL is given up after every _INDEX_CHUNK records, so other threads (the event loop, a
        thread back from its fdatasync) wait for at most one chunk of indexing."""
        with self._index_drain_lock:
            with self._index_backlog_lock:
                batch, self._index_backlog = self._index_backlog, []
            if not batch:
                return
            if len(batch) <= _INDEX_CHUNK:
                self.key_index.put(batch)
            else:
                for i in range(0, len(batch), _INDEX_CHUNK):
                    self.key_index.put(batch[i : i + _INDEX_CHUNK])
                    time.sleep(0)
            self._index_ts = batch[-1].store_timestamp

    def _checkpoint_main(self) -> None:
        """Periodic checkpoints on their own thread: the consume-queue and index fdatasyncs take milliseconds to tens
        of milliseconds under load, and appends must not wait for them."""
        interval = max(0.01, self.config.flush_interval_consume_queue / 1000.0)
        while not self._checkpoint_stop.wait(interval):
            self._maybe_checkpoint()

    def _maybe_checkpoint(self) -> None:
        if self._failure is not None:
            return
        wpos = self._snap[0]
        if self._checkpointed_pos == wpos and self._flushed >= wpos:
            return
        try:
            t0 = time.perf_counter_ns()
            self._write_checkpoint(clean=False)
            self.statistics.checkpoint_latency_us.add((time.perf_counter_ns() - t0) // 1000)
        except Exception:
            log.exception("writing the checkpoint failed; will retry")

    def _write_checkpoint(self, clean: bool, index: bool = False) -> None:
        """Flush the consume queues (and the index when ``clean``, ``index``, or flushIntervalIndex has passed), then
        record what is durable. Any thread: the position comes from the end of the last group (all of it
        dispatched), and the queues' and index's flushes run beside appends."""
        with self._checkpoint_lock:
            wpos, last_ts, index_ts = self._snap
            flushed = self._flushed
            self.consume_queue.flush()
            now = time.monotonic()
            if (
                clean
                or index
                or self._index_queued - self._index_queued_at_flush >= _INDEX_FLUSH_RECORDS
                or now - self._index_flushed_at >= self.config.flush_interval_index / 1000.0
            ):
                self._index_queued_at_flush = self._index_queued
                self._drain_index()  # the index must hold everything up to wpos before it is flushed
                self.key_index.flush()
                self._index_flushed_at = now
                self._index_durable = (wpos, index_ts)
            state = CheckpointState(
                physic_msg_timestamp=last_ts,
                logics_msg_timestamp=last_ts,
                index_msg_timestamp=self._index_durable[1],
                commit_flushed=flushed,
                cq_dispatched=wpos,
                index_dispatched=self._index_durable[0],
                clean=clean,
            )
            if clean:
                state.cq_max_phys = self.consume_queue.max_physical_offset()
                state.cq_offset_sum = cq_offset_sum(self.consume_queue)
                state.index_max_phys = self.key_index.max_physical_offset()
            self._checkpoint.write(state)
            self._checkpointed_pos = wpos

    def flush(self) -> None:
        """Make everything appended so far durable and checkpoint it (blocking; normally periodic)."""

        def work() -> None:
            self._flush_commit_log()
            self._write_checkpoint(clean=False, index=True)

        self.call_in_writer(work)

    # ------------------------------------------------------------------------------------------ ASYNC_FLUSH

    def _flusher_main(self) -> None:
        interval = max(0.001, self.config.flush_interval_commit_log / 1000.0)
        while not self._flusher_stop.wait(interval):
            try:
                self._flush_commit_log()
            except Exception as exc:
                self._failure = f"fdatasync failed: {exc}"
                log.critical("commit-log flush failed; refusing further appends until restart", exc_info=True)
                return

    def _flush_commit_log(self) -> None:
        """fdatasync every segment holding bytes between the flushed and the written position (ASYNC_FLUSH's
        flusher thread, forced flushes and shutdown; the lock keeps ``_flushed`` from moving backwards)."""
        with self._flush_lock:
            target = self._wpos
            flushed = self._flushed
            if target <= flushed:
                return
            t0 = time.perf_counter_ns()
            for seg in self.commit_log.segments:
                if seg.end > flushed and seg.start < target:
                    os.fdatasync(seg.fd)
            stats = self.statistics
            stats.flush_latency_us.add((time.perf_counter_ns() - t0) // 1000)
            stats.flushes += 1
            self._flushed = target

    # ------------------------------------------------------------------------------------------ hooks

    def on_new_messages(self, callback: NewMessagesCallback, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Call ``callback(topic, queue_id, max_offset)`` when entries become visible, once per queue per group.

        It runs on ``loop`` (default: the running loop at registration), scheduled once per group; without a
        loop it runs on the writer thread and must be quick and thread-safe.
        """
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        hooks = {k: list(v) for k, v in self._hooks.items()}
        hooks.setdefault(loop, []).append(callback)
        self._hooks = hooks  # replaced whole: the writer iterates its own snapshot

    def add_retention_guard(self, guard: Callable[[], int]) -> None:
        """``guard()`` returns the lowest commit-log offset that must be kept; retention keeps its segment."""
        self.retention.add_guard(guard)

    # ------------------------------------------------------------------------------------------ reading

    def _check_readable(self) -> None:
        if self._state not in ("open", "closing"):
            raise StoreClosedError(f"the store is {self._state}")

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next logical offset of the queue (number of visible entries ever written)."""
        return self._visible.get((topic, queue_id), 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        self._check_readable()
        return self.consume_queue.min_offset(topic, queue_id)

    def queues(self) -> list[tuple[str, int]]:
        return list(self._visible)

    def max_physical_offset(self) -> int:
        """End of the visible commit log."""
        return self._confirmed

    def min_physical_offset(self) -> int:
        return self.commit_log.min_offset

    def flushed_physical_offset(self) -> int:
        return self._flushed

    def read_consume_queue(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Visible consume-queue entries ``(phys, size, tags_code)`` from ``offset``."""
        self._check_readable()
        count = min(max_count, self._visible.get((topic, queue_id), 0) - offset)
        if count <= 0:
            return []
        return self.consume_queue.read(topic, queue_id, offset, count)

    def read_bytes(self, phys: int, size: int) -> bytes | None:
        """Raw stored bytes ``[phys, phys + size)`` (within one segment), or None when not (or no longer) there."""
        self._check_readable()
        if phys < 0 or size <= 0 or phys + size > self._confirmed:
            return None
        return self.commit_log.read(phys, size)

    def read_record(self, phys: int, size: int | None = None) -> bytes | None:
        """The stored bytes of the record at ``phys`` (a VIEW / QUERY body unit), or None."""
        self._check_readable()
        if phys < 0 or phys >= self._confirmed:
            return None
        data = self.commit_log.read_record_bytes(phys, size)
        if data is None or phys + len(data) > self._confirmed:
            return None
        return data

    def read_message(self, phys: int, size: int | None = None) -> MessageRecord | None:
        """The decoded record at ``phys`` (None when there is no record there)."""
        data = self.read_record(phys, size)
        return None if data is None else decode_record(data)

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int | None = None,
        max_bytes: int | None = None,
        tags_codes: Iterable[int] | None = None,
        message_filter: Callable[[bytes], bool] | None = None,
    ) -> GetMessageResult:
        """RocketMQ's getMessage: up to ``max_count`` records / ``max_bytes`` from ``offset``, optionally only
        those whose tagsCode is in ``tags_codes`` and for whose record bytes ``message_filter`` is true (RocketMQ's
        ``isMatchedByCommitLog``). Neighbouring records are read in one slice."""
        self._check_readable()
        cfg = self.config
        max_count = cfg.max_transfer_count_on_message_in_memory if max_count is None else max(1, max_count)
        max_bytes = cfg.max_transfer_bytes_on_message_in_memory if max_bytes is None else max_bytes
        codes = None if tags_codes is None else set(tags_codes)
        max_off = self.max_offset(topic, queue_id)
        min_off = self.consume_queue.min_offset(topic, queue_id)
        if max_off == 0:
            return GetMessageResult(GetStatus.NO_MESSAGE_IN_QUEUE, 0, min_off, max_off)
        if offset < min_off:
            return GetMessageResult(GetStatus.OFFSET_TOO_SMALL, min_off, min_off, max_off)
        if offset == max_off:
            return GetMessageResult(GetStatus.OFFSET_OVERFLOW_ONE, offset, min_off, max_off)
        if offset > max_off:
            nxt = min_off if min_off == 0 else max_off
            return GetMessageResult(GetStatus.OFFSET_OVERFLOW_BADLY, nxt, min_off, max_off)
        if message_filter is not None:  # RocketMQ reads at most 16 000 bytes of consume queue (800 entries)
            scan = max(800, max_count)
        else:
            scan = max_count if codes is None else max(16000, max_count * 20)
        entries = self.read_consume_queue(topic, queue_id, offset, scan)
        if not entries:
            return GetMessageResult(GetStatus.OFFSET_FOUND_NULL, offset, min_off, max_off)
        log_min = self.commit_log.min_offset
        picked: list[tuple[int, int]] = []
        total = 0
        consumed = 0
        for phys, size, code in entries:
            if len(picked) >= max_count or (picked and total + size > max_bytes):
                break
            consumed += 1
            if phys < log_min:  # its segment was deleted by retention
                continue
            if codes is not None and code not in codes:
                continue
            if message_filter is not None:
                data = self.commit_log.read(phys, size)
                if data is None or not message_filter(data):
                    continue
            picked.append((phys, size))
            total += size
        buffers = self.commit_log.read_many(picked) if picked else []
        if not buffers:
            status = GetStatus.NO_MATCHED_MESSAGE if consumed else GetStatus.OFFSET_FOUND_NULL
            return GetMessageResult(status, offset + consumed, min_off, max_off)
        read = sum(len(b) for b in buffers)
        if read != total:  # a segment vanished mid-read: return what was read, resume after it
            count = 0
            acc = 0
            for _phys, size in picked:
                if acc + size > read:
                    break
                acc += size
                count += 1
            picked = picked[:count]
        return GetMessageResult(GetStatus.FOUND, offset + consumed, min_off, max_off, buffers, len(picked), read)

    def _store_time_of(self, phys: int, size: int) -> int:
        head = self.commit_log.read(phys, MIN_RECORD_SIZE) if phys >= self.commit_log.min_offset else None
        if head is None:
            return -1
        return read_store_timestamp(head)

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """STORETIMESTAMP of the message at ``offset`` of the queue, or None."""
        entries = self.read_consume_queue(topic, queue_id, offset, 1)
        if not entries:
            return None
        ts = self._store_time_of(entries[0][0], entries[0][1])
        return ts if ts >= 0 else None

    def earliest_store_time(self, topic: str, queue_id: int) -> int | None:
        """Store time of the queue's oldest message (GET_EARLIEST_MSG_STORETIME), or None."""
        return self.store_time_at(topic, queue_id, self.min_offset(topic, queue_id))

    def last_store_time(self, topic: str, queue_id: int) -> int | None:
        max_off = self.max_offset(topic, queue_id)
        return self.store_time_at(topic, queue_id, max_off - 1) if max_off > 0 else None

    def earliest_message_time(self) -> int | None:
        """Store time of the oldest record in the whole commit log."""
        self._check_readable()
        segs = self.commit_log.segments
        if not segs or self._confirmed <= segs[0].start:
            return None
        return self.commit_log.first_store_timestamp(segs[0])

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the logical offset whose store time is nearest ``timestamp``."""
        self._check_readable()
        offset = self.consume_queue.search_by_timestamp(topic, queue_id, timestamp, self._store_time_of)
        return min(offset, self.max_offset(topic, queue_id))

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ts: int = 0, end_ts: int = 2**63 - 1) -> list[int]:
        """Physical offsets of visible records of ``topic`` whose UNIQ_KEY or one of whose KEYS is ``key``.

        Index hits are checked against the record, so hash collisions never leak other messages.
        """
        self._check_readable()
        self._drain_index()  # acknowledged records the indexer has not reached yet
        hits = self.key_index.query(topic, key, max_num, begin_ts, end_ts)
        topic_bytes = topic.encode()
        confirmed = self._confirmed
        out: list[int] = []
        for phys in hits:
            if phys >= confirmed:
                continue
            data = self.commit_log.read_record_bytes(phys)
            if data is None:
                continue
            try:
                record = RecordView(data)
                if record.topic_bytes != topic_bytes or not begin_ts <= record.store_timestamp <= end_ts:
                    continue
                found = key == record.uniq_key or key in record.keys
            except RecordDecodeError:
                continue
            if found:
                out.append(phys)
                if len(out) >= max_num:
                    break
        return out

    def index_last_update_timestamp(self) -> int:
        return self._index_ts

    def stats(self) -> dict[str, Any]:
        snap = self.statistics.snapshot()
        snap["commit_log_min_offset"] = self.commit_log.min_offset
        snap["commit_log_max_offset"] = self._confirmed
        snap["commit_log_flushed_offset"] = self._flushed
        return snap

    # ------------------------------------------------------------------------------------------ retention hook

    def _delete_segments(self, count: int, guard: int) -> list[str]:
        """Delete the ``count`` oldest segments (writer thread), then move queue and index minimums up."""
        deleted: list[str] = []
        for seg in list(self.commit_log.segments[:count]):
            if seg is self.commit_log.segments[-1] or seg.end > guard or seg.end > self._wpos:
                break
            self.commit_log.delete_segment(seg)
            deleted.append(seg.path)
            log.info("retention: deleted commit-log segment %s", seg.path)
        if deleted:
            new_min = self.commit_log.min_offset
            self.consume_queue.correct_min_offset(new_min)
            self.key_index.delete_before(new_min)
        return deleted

    # ------------------------------------------------------------------------------------------ recovery

    def _recover(self) -> RecoveryInfo:
        t0 = time.monotonic()
        cp = self._checkpoint.load()
        crashed = self._abort.exists()
        self.commit_log.load()
        self._abort.create()
        cq = self.consume_queue
        info = Recovery(
            self.commit_log,
            cq,
            self.key_index,
            check_crc=self.config.check_crc_on_recover,
            delay_levels_ms=self._delay_levels,
        ).run(cp, crashed)
        end = info.log_end
        self._wpos = self._flushed = self._confirmed = end
        self._seg = None
        tables = {(t, q): cq.max_offset(t, q) for t, q in cq.queues()}
        self._next_offsets = dict(tables)
        self._visible = dict(tables)
        last_ts = self._index_ts = info.last_store_timestamp
        if cp is not None:
            self._index_ts = max(self._index_ts, cp.index_msg_timestamp)
            last_ts = max(last_ts, cp.physic_msg_timestamp)
        self._snap = (self._wpos, last_ts, self._index_ts)
        last = self.commit_log.last_segment
        if last is not None and info.mode == "crash":
            # After a kill -9 under ASYNC_FLUSH the tail may still be only in the page cache; the checkpoint about
            # to be written calls it flushed, so make that true. (Earlier segments were sealed with fdatasync.)
            os.fdatasync(last.fd)
        self._write_checkpoint(clean=False, index=True)
        info.seconds = time.monotonic() - t0
        log.info(
            "store recovered (%s) in %.3fs: log end %d, scanned %d records / %d bytes, replayed %d CQ / %d index",
            info.mode,
            info.seconds,
            end,
            info.scanned_records,
            info.scanned_bytes,
            info.cq_replayed,
            info.index_replayed,
        )
        return info


def _default_consume_queue(root: str, config: StoreConfig) -> ConsumeQueueLike:
    from txmq.store.consume_queue import ConsumeQueueStore

    return ConsumeQueueStore(root, config.consume_queue_entries_per_file)


def _default_key_index(root: str, config: StoreConfig) -> KeyIndexLike:
    from txmq.store.key_index import KeyIndex

    return KeyIndex(root, slot_count=config.max_hash_slot_num, max_entries=config.max_index_num)
