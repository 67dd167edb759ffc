"""The message store's facade: every caller appends, reads and manages the store through :class:`MessageStore`, which
wires the commit log, consume queues, key index, checkpoint, recovery (:mod:`txmq.store.recovery`) and retention
to the append pipeline (:mod:`txmq.store.writer`), the background threads (:mod:`txmq.store.background`) and the
reads (:mod:`txmq.store.reads`).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from txmq.clock import SYSTEM_CLOCK, Clock
from txmq.errors import DiskFullError, StoreError
from txmq.protocol.record import Host, MessageRecord
from txmq.store.background import Checkpointer, Flusher, KeyIndexer, delete_oldest_segments
from txmq.store.checkpoint import AbortMarker, Checkpoint
from txmq.store.commit_log import CommitLog
from txmq.store.config import StoreConfig
from txmq.store.damage import DamageLog
from txmq.store.dispatch import DispatchRequest
from txmq.store.reads import GetMessageResult, GetStatus, Reads
from txmq.store.recovery import Recovery, RecoveryInfo
from txmq.store.replica import read_chunk
from txmq.store.retention import RetentionService
from txmq.store.state import Health, Published
from txmq.store.stats import StoreStats
from txmq.store.verify import Scrubber
from txmq.store.writer import NewMessagesCallback, PutResult, PutStatus, Writer

__all__ = [
    "ConsumeQueueLike",
    "GetMessageResult",
    "GetStatus",
    "KeyIndexLike",
    "MessageStore",
    "NewMessagesCallback",
    "PutResult",
    "PutStatus",
]

log = logging.getLogger("txmq.store")


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
        self.scrubber: Scrubber | None = None
        self._lock_fd: int | None = None

        health = self._health = Health()
        published = self._published = Published()
        stats = self.statistics
        self._indexer = KeyIndexer(health)
        self._flusher = Flusher(self.commit_log, cfg, published, stats, health)
        self._checkpointer = Checkpointer(self._checkpoint, self._indexer, cfg, published, stats, health)
        self._writer = Writer(self.commit_log, self._indexer, cfg, clock, stats, published, health)
        self.damage = DamageLog(self.root)
        self._reads = Reads(self.commit_log, self._indexer, cfg, published, health, self.damage)
        self.retention = RetentionService(cfg, clock, self.commit_log, self._delete_segments, disk_usage=disk_usage)

    # ------------------------------------------------------------------------------------------ life cycle

    def open(self) -> MessageStore:
        """Recover (fast after a clean shutdown, verifying after a crash) and start the append pipeline."""
        health = self._health
        if health.state != "new":
            raise StoreError(f"the store is {health.state}; open() runs once")
        os.makedirs(self.root, exist_ok=True)
        self._lock_root()
        cfg = self.config
        try:
            self.consume_queue = self._cq_factory(os.path.join(self.root, "consumequeue"), cfg)
            self.key_index = self._index_factory(os.path.join(self.root, "index"), cfg)
            self._attach()
            self.recovery = self._recover()
        except BaseException:
            self._close_files()
            raise
        health.state = "open"
        self._writer.start()
        if not cfg.sync_flush:
            self._flusher.start()
        self._checkpointer.start()
        self._indexer.start()
        if cfg.scrub_commit_log_on_start and self.recovery.log_end > self.commit_log.min_offset:
            self.scrubber = Scrubber(lambda: self.commit_log.segments, self.recovery.log_end, self.damage.add)
            self.scrubber.start()
        return self

    def _attach(self) -> None:
        """Hand the consume queues and the key index, opened by open(), to the parts that use them."""
        consume_queue, key_index = self.consume_queue, self.key_index
        self._writer.consume_queue = self._reads.consume_queue = self._checkpointer.consume_queue = consume_queue
        self._indexer.key_index = self._reads.key_index = self._checkpointer.key_index = key_index

    async def start(self) -> None:
        """``open()`` in a worker thread (recovery can take seconds), then start the retention timer."""
        await asyncio.to_thread(self.open)
        self.retention.start()

    def shutdown(self) -> None:
        """Finish every queued append, flush everything, write a clean checkpoint and remove the abort marker."""
        health = self._health
        with health.put_lock:
            if health.state != "open":
                if health.state == "new":
                    health.state = "closed"
                return
            health.state = "closing"
        if self.scrubber is not None:
            self.scrubber.stop()
        self.retention.stop()
        self._writer.stop()
        self._flusher.stop()
        self._checkpointer.stop()
        self._writer.wait_idle()  # a blocking appender still writing its own group finishes first
        self._indexer.stop()
        self._writer.fail_leftovers()
        try:
            behind = self._indexer.pending()
            if health.failure is None and not behind:
                try:
                    self._flusher.flush()
                    self._checkpointer.write(clean=True)
                    self._abort.remove()
                except DiskFullError as exc:
                    # The commit log is durable (every append was fdatasynced); what could not be written is
                    # rebuilt from it: the abort marker stays, so the next start runs crash recovery.
                    log.warning("store closing on a full disk (%s); the next start rebuilds what is missing", exc)
            elif health.failure is None:
                # The indexer could not finish (the disk was full when it last tried, or it never ran): keep the
                # abort marker, so that the next start replays the key index past its durable point (nothing else
                # needs recovering).
                self._flusher.flush()
                blocked = self._indexer.blocked
                log.warning(
                    "store closing with %d records not in the key index (%s); the next start indexes them",
                    behind,
                    f"disk full: {blocked}" if blocked else "indexing had not caught up",
                )
            else:
                log.error(
                    "store closing after a write failure (%s); the next open will run crash recovery", health.failure
                )
        finally:
            health.state = "closed"
            self._close_files()

    async def close(self) -> None:
        """:meth:`shutdown` in a worker thread; the retention timer is stopped here, on its own loop."""
        self.retention.stop()
        await asyncio.to_thread(self.shutdown)

    def __enter__(self) -> MessageStore:
        return self.open() if self._health.state == "new" else self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    async def __aenter__(self) -> MessageStore:
        if self._health.state == "new":
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def is_open(self) -> bool:
        return self._health.state == "open"

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

    # ------------------------------------------------------------------------------------------ appending

    async def put(self, record: MessageRecord) -> PutResult:
        """Append one record; returns once it is durable (SYNC_FLUSH) or written (ASYNC_FLUSH).

        Invalid records and a closed store give a result with a failure status instead of raising.
        """
        return await self._writer.put_future(record)

    def put_future(self, record: MessageRecord) -> asyncio.Future[PutResult]:
        """:meth:`put` without a coroutine: a future of the result, for hot paths that would otherwise pay for a
        task per message (the broker's send processor). Must be called on a running event loop."""
        return self._writer.put_future(record)

    def put_then(
        self, record: MessageRecord, then: Callable[[PutResult], None], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        """:meth:`put_future` without the future: ``then(result)`` runs on this event loop once the result is there,
        one event-loop turn sooner than a future's callback would. Must be called on a running event loop (passed
        as ``loop`` when the caller has it at hand)."""
        self._writer.put_then(record, then, loop)

    async def put_many(self, records: list[MessageRecord], *, link: str | None = None) -> list[PutResult]:
        """Append records as one request: see :meth:`put_many_future`."""
        return await self._writer.put_many_future(records, link)

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
        return self._writer.put_many_future(records, link)

    async def put_raw(self, data: bytes | bytearray, store_host: Host | None = None) -> PutResult:
        """Append an already encoded record (its offsets and store time are overwritten)."""
        return await self._writer.put_raw(data, store_host)

    def put_sync(self, record: MessageRecord) -> PutResult:
        """Blocking :meth:`put` for threads without an event loop (tools, the crash-test child)."""
        return self._writer.put_many_sync([record])[0]

    def put_many_sync(self, records: list[MessageRecord]) -> list[PutResult]:
        return self._writer.put_many_sync(records)

    def _refused(self, status: str, remark: str) -> PutResult:
        return self._writer.refused(status, remark)

    def call_in_writer(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the writer thread between groups and return its result (blocking)."""
        return self._writer.call_in_writer(fn)

    # ------------------------------------------------------------------------------------------ replication

    @property
    def replica(self) -> bool:
        """True while this store is a slave's copy: it takes only :meth:`append_replicated`, other puts are refused."""
        return self._health.replica

    @replica.setter
    def replica(self, value: bool) -> None:
        self._health.replica = value

    def append_replicated(self, offset: int, data: bytes, durable: Callable[[int], None] | None = None) -> int:
        """Append a master's bytes verbatim at ``offset`` (this log's end), durably, and dispatch them. Blocking, on
        the calling thread (a slave's link thread), which holds the append lock as the writer thread does: no
        hand-over to the writer and back. ``durable(end)`` runs as soon as the bytes are durable, before their
        dispatch, and must not raise. Returns the new end; raises :class:`~txmq.store.replica.ReplicaError` on
        bad bytes, :class:`~txmq.errors.StoreClosedError` once the store is closing."""
        return self._writer.append_replicated_here(offset, data, durable)

    def read_replica_chunk(self, start: int, end: int) -> bytes:
        """Whole records from ``start`` within one segment, before ``end`` (a master's next chunk to ship): written
        bytes, fsynced or not, as RocketMQ's masters ship (a send is acknowledged only once both copies are durable)."""
        self._reads._check_readable()
        return read_chunk(self.commit_log, start, end, self._published.written)

    def flush(self) -> None:
        """Make everything appended so far durable and checkpoint it (blocking; normally periodic)."""

        def work() -> None:
            self._flusher.flush()
            self._checkpointer.write(clean=False, index=True)

        self._writer.call_in_writer(work)

    # ------------------------------------------------------------------------------------------ hooks

    def on_written(self, callback: Callable[[int], None] | None) -> None:
        """Call ``callback(written_end)`` on the writer thread after each append is written, before its fsync
        (quick and thread-safe); None removes it. One at a time: the HA master's."""
        self._writer.on_written = callback

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
        self._writer.on_new_messages(callback, loop)

    def add_retention_guard(self, guard: Callable[[], int]) -> None:
        """``guard()`` returns the lowest commit-log offset that must be kept; retention keeps its segment."""
        self.retention.add_guard(guard)

    # ------------------------------------------------------------------------------------------ reading

    def max_offset(self, topic: str, queue_id: int) -> int:
        """Next logical offset of the queue (number of visible entries ever written)."""
        return self._reads.max_offset(topic, queue_id)

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._reads.min_offset(topic, queue_id)

    def queues(self) -> list[tuple[str, int]]:
        return self._reads.queues()

    def max_physical_offset(self) -> int:
        """End of the visible commit log."""
        return self._published.confirmed

    def min_physical_offset(self) -> int:
        return self.commit_log.min_offset

    def flushed_physical_offset(self) -> int:
        return self._published.flushed

    def written_physical_offset(self) -> int:
        """End of what has been written to the commit log (flushed or not)."""
        return self._published.written

    def read_consume_queue(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[tuple[int, int, int]]:
        """Visible consume-queue entries ``(phys, size, tags_code)`` from ``offset``."""
        return self._reads.read_consume_queue(topic, queue_id, offset, max_count)

    def read_bytes(self, phys: int, size: int) -> bytes | None:
        """Raw stored bytes ``[phys, phys + size)`` (within one segment), or None when not (or no longer) there."""
        return self._reads.read_bytes(phys, size)

    def read_record(self, phys: int, size: int | None = None) -> bytes | None:
        """The stored bytes of the record at ``phys`` (a VIEW / QUERY body unit), or None."""
        return self._reads.read_record(phys, size)

    def read_message(self, phys: int, size: int | None = None) -> MessageRecord | None:
        """The decoded record at ``phys`` (None when there is no record there)."""
        return self._reads.read_message(phys, size)

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
        return self._reads.get_messages(topic, queue_id, offset, max_count, max_bytes, tags_codes, message_filter)

    def store_time_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        """STORETIMESTAMP of the message at ``offset`` of the queue, or None."""
        return self._reads.store_time_at(topic, queue_id, offset)

    def earliest_store_time(self, topic: str, queue_id: int) -> int | None:
        """Store time of the queue's oldest message (GET_EARLIEST_MSG_STORETIME), or None."""
        return self._reads.earliest_store_time(topic, queue_id)

    def last_store_time(self, topic: str, queue_id: int) -> int | None:
        return self._reads.last_store_time(topic, queue_id)

    def earliest_message_time(self) -> int | None:
        """Store time of the oldest record in the whole commit log."""
        return self._reads.earliest_message_time()

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the logical offset whose store time is nearest ``timestamp``."""
        return self._reads.search_offset_by_timestamp(topic, queue_id, timestamp)

    def query_by_key(self, topic: str, key: str, max_num: int, begin_ts: int = 0, end_ts: int = 2**63 - 1) -> list[int]:
        """Physical offsets of visible records of ``topic`` whose UNIQ_KEY or one of whose KEYS is ``key``.

        Index hits are checked against the record, so hash collisions never leak other messages.
        """
        return self._reads.query_by_key(topic, key, max_num, begin_ts, end_ts)

    def index_last_update_timestamp(self) -> int:
        return self._indexer.last_timestamp

    def stats(self) -> dict[str, Any]:
        snap = self.statistics.snapshot()
        snap["commit_log_min_offset"] = self.commit_log.min_offset
        snap["commit_log_max_offset"] = self._published.confirmed
        snap["commit_log_flushed_offset"] = self._published.flushed
        snap.update(self.damage.stats())
        return snap

    # ------------------------------------------------------------------------------------------ retention hook

    def _delete_segments(self, count: int, guard: int) -> list[str]:
        """Delete the ``count`` oldest segments on the writer thread, then move queue and index minimums up."""

        def delete() -> list[str]:
            return delete_oldest_segments(
                self.commit_log, self.consume_queue, self.key_index, self._published.written, count, guard
            )

        deleted: list[str] = self._writer.call_in_writer(delete)
        return deleted

    # ------------------------------------------------------------------------------------------ recovery

    def _recover(self) -> RecoveryInfo:
        t0 = time.monotonic()
        cp = self._checkpoint.load()
        crashed = self._abort.exists()
        self.commit_log.load()
        self.damage.load(self.commit_log.min_offset)
        self._abort.create()
        cq = self.consume_queue
        recovery = Recovery(
            self.commit_log,
            cq,
            self.key_index,
            check_crc=self.config.check_crc_on_recover,
            delay_levels_ms=self.config.delay_levels_ms(),
            damage=self.damage,
        )
        info = recovery.run(cp, crashed)
        if recovery.deferred_index:
            self._indexer.defer([d for d in recovery.deferred_index if d.physical_offset < info.log_end])
        end = info.log_end
        published = self._published
        published.written = published.flushed = published.confirmed = end
        tables = {(t, q): cq.max_offset(t, q) for t, q in cq.queues()}
        self._writer.reset(dict(tables))
        published.visible = dict(tables)
        last_ts = index_ts = info.last_store_timestamp
        if cp is not None:
            index_ts = max(index_ts, cp.index_msg_timestamp)
            last_ts = max(last_ts, cp.physic_msg_timestamp)
        self._indexer.last_timestamp = index_ts
        published.snap = (end, last_ts, index_ts)
        last = self.commit_log.last_segment
        if last is not None and info.mode == "crash":
            # After a kill -9 under ASYNC_FLUSH the tail may still be only in the page cache; the checkpoint about
            # to be written calls it flushed, so make that true. (Earlier segments were sealed with fdatasync.)
            os.fdatasync(last.fd)
        self._checkpointer.write(clean=False, index=True)
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
