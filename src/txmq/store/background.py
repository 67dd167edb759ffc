"""The store's work off the append path, each on a thread of its own: the key indexer (records are queued by the writer
and indexed every 10 ms), the checkpointer (consume-queue and index fdatasyncs, then the checkpoint file), and
ASYNC_FLUSH's commit-log flusher; and the deletion of old segments that retention asks the writer thread to run."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from txmq.errors import DiskFullError, is_disk_full
from txmq.store.checkpoint import Checkpoint, CheckpointState
from txmq.store.commit_log import CommitLog
from txmq.store.config import StoreConfig
from txmq.store.dispatch import DispatchRequest
from txmq.store.recovery import cq_offset_sum
from txmq.store.state import Health, Published
from txmq.store.stats import StoreStats

if TYPE_CHECKING:
    from txmq.store.message_store import ConsumeQueueLike, KeyIndexLike

log = logging.getLogger("txmq.store")

# The indexer takes what the writer queued every _INDEX_TICK seconds, or at once when _INDEX_WAKE_AT records wait.
# Nothing reads the index without first indexing what is queued, so the tick only bounds memory and catch-up work.
_INDEX_TICK = 0.01
_INDEX_WAKE_AT = 1024
_INDEX_CHUNK = 256  # records indexed per hold of the GIL (about a millisecond)
_INDEX_BACKLOG_MAX = 20_000  # the writer indexes itself past this many waiting records
# A checkpoint flushes the index once this many records were indexed since its last flush, or flushIntervalIndex
# has passed: a busy store keeps its post-crash index replay (and each flush) bounded, a quiet one flushes rarely.
_INDEX_FLUSH_RECORDS = 100_000


class KeyIndexer:
    """Builds the key index off the append path: the writer hands each group's dispatches over (appends are
    acknowledged without waiting for the index), and a key query first indexes whatever is still queued, so a query
    always sees every acknowledged record."""

    def __init__(self, health: Health) -> None:
        self.key_index: KeyIndexLike = None  # type: ignore[assignment]  # set when the store opens
        self._health = health
        self._backlog: list[DispatchRequest] = []
        self._backlog_lock = threading.Lock()
        self._drain_lock = threading.Lock()  # one drain at a time, so the index gets records in log order
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.queued = 0  # records ever handed over (by the writer)
        self.last_timestamp = 0  # store time of the last record handed to the key index
        self.blocked: str | None = None  # why indexing waits (a full disk), None when it does not

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="txmq-store-indexer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Index what is queued and end the thread (after the writer stopped)."""
        if self._thread is not None:
            self._stop = True
            self._wake.set()
            self._thread.join()

    def enqueue(self, dispatches: list[DispatchRequest]) -> None:
        """Queue one group's records (whoever holds the append lock)."""
        with self._backlog_lock:
            backlog = self._backlog
            backlog += dispatches
            waiting = len(backlog)
        self.queued += len(dispatches)
        if waiting >= _INDEX_WAKE_AT:  # else the indexer's next tick takes them: no wake-up per group
            self._wake.set()
            if waiting >= _INDEX_BACKLOG_MAX:
                # The indexer is not keeping up (it competes for the GIL with the event loop and the writer): index
                # here, so the backlog, and the catch-up a query or checkpoint may have to do, stay bounded.
                self.drain()

    def _run(self) -> None:
        wake = self._wake
        while True:
            wake.wait(_INDEX_TICK)
            wake.clear()
            try:
                self.drain()
            except Exception as exc:
                # As for a failed write: the index and the log may now disagree until crash recovery rebuilds it.
                self._health.fail(f"key index: {type(exc).__name__}: {exc}")
                log.critical("building the key index failed; refusing further appends until restart", exc_info=True)
                return
            if self._stop:
                return

    def defer(self, dispatches: list[DispatchRequest]) -> None:
        """Queue records recovery could not index (the disk was full) ahead of anything new."""
        with self._backlog_lock:
            self._backlog[:0] = dispatches

    def pending(self) -> int:
        """Records handed over and not indexed yet."""
        with self._backlog_lock:
            return len(self._backlog)

    def drain(self) -> bool:
        """Index every dispatched record still waiting (indexer thread, writer when it falls behind, key queries,
        checkpoints). The GIL is given up after every _INDEX_CHUNK records, so other threads (the event loop, a
        thread back from its fdatasync) wait for at most one chunk of indexing.

        False when the disk is full: what could not be indexed goes back to the front of the queue, and a later
        drain (the indexer's next tick) tries again; appends and reads go on meanwhile."""
        with self._drain_lock:
            with self._backlog_lock:
                batch, self._backlog = self._backlog, []
            if not batch:
                self.blocked = None
                return True
            i = 0
            try:
                while i < len(batch):
                    self.key_index.put(batch[i : i + _INDEX_CHUNK])
                    i += _INDEX_CHUNK
                    if i < len(batch):
                        time.sleep(0)
            except DiskFullError as exc:
                with self._backlog_lock:
                    self._backlog[:0] = batch[i:]
                if self.blocked is None:
                    log.error("%s; indexing waits for free space (queries by key miss new records)", exc)
                self.blocked = str(exc)
                return False
            if self.blocked is not None:
                log.warning("key index: space is back; indexing caught up")
                self.blocked = None
            self.last_timestamp = batch[-1].store_timestamp
            return True


class _Periodic:
    """A daemon thread calling ``_tick()`` every ``_interval()`` seconds until stopped or ``_tick()`` returns False."""

    _thread_name = ""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def _run(self) -> None:
        interval = self._interval()
        while not self._stop.wait(interval):
            if self._tick() is False:
                return

    def _interval(self) -> float:
        raise NotImplementedError

    def _tick(self) -> bool | None:
        raise NotImplementedError


class Flusher(_Periodic):
    """fdatasyncs the commit log up to the written position: ASYNC_FLUSH's thread, forced flushes and shutdown."""

    _thread_name = "txmq-store-flusher"

    def __init__(
        self, commit_log: CommitLog, config: StoreConfig, published: Published, stats: StoreStats, health: Health
    ) -> None:
        self._commit_log = commit_log
        self._config = config
        self._published = published
        self._stats = stats
        self._health = health
        self._lock = threading.Lock()  # keeps the flushed position from moving backwards
        super().__init__()

    def _interval(self) -> float:
        return max(0.001, self._config.flush_interval_commit_log / 1000.0)

    def _tick(self) -> bool:
        try:
            self.flush()
        except Exception as exc:
            self._health.failure = f"fdatasync failed: {exc}"
            log.critical("commit-log flush failed; refusing further appends until restart", exc_info=True)
            return False
        return True

    def flush(self) -> None:
        """fdatasync every segment holding bytes between the flushed and the written position."""
        with self._lock:
            published = self._published
            target = published.written
            flushed = published.flushed
            if target <= flushed:
                return
            t0 = time.perf_counter_ns()
            for seg in self._commit_log.segments:
                if seg.end > flushed and seg.start < target:
                    os.fdatasync(seg.fd)
            stats = self._stats
            stats.flush_latency_us.add((time.perf_counter_ns() - t0) // 1000)
            stats.flushes += 1
            published.flushed = target


class Checkpointer(_Periodic):
    """Periodic checkpoints on their own thread: the consume-queue and index fdatasyncs take milliseconds to tens of
    milliseconds under load, and appends must not wait for them."""

    _thread_name = "txmq-store-checkpoint"

    def __init__(
        self,
        checkpoint: Checkpoint,
        indexer: KeyIndexer,
        config: StoreConfig,
        published: Published,
        stats: StoreStats,
        health: Health,
    ) -> None:
        self.consume_queue: ConsumeQueueLike = None  # type: ignore[assignment]  # set when the store opens
        self.key_index: KeyIndexLike = None  # type: ignore[assignment]
        self._checkpoint = checkpoint
        self._indexer = indexer
        self._published = published
        self._stats = stats
        self._health = health
        self._config = config
        self._lock = threading.Lock()  # one checkpoint at a time (periodic, forced, final)
        self._checkpointed_pos = -1
        self._index_flushed_at = 0.0  # monotonic time of the last key-index flush
        self._index_durable = (0, 0)  # (position, store time) the index was flushed up to
        self._index_queued_at_flush = 0  # the indexer's queued count when the index was last flushed
        super().__init__()

    def _interval(self) -> float:
        return max(0.01, self._config.flush_interval_consume_queue / 1000.0)

    def _tick(self) -> None:
        if self._health.failure is not None:
            return
        wpos = self._published.snap[0]
        if self._checkpointed_pos == wpos and self._published.flushed >= wpos:
            return
        try:
            t0 = time.perf_counter_ns()
            self.write(clean=False)
            self._stats.checkpoint_latency_us.add((time.perf_counter_ns() - t0) // 1000)
        except Exception as exc:
            if is_disk_full(exc):  # expected while the disk is full: no traceback, the next tick retries
                log.warning("checkpoint deferred, the disk is full: %s", exc)
            else:
                log.exception("writing the checkpoint failed; will retry")

    def write(self, clean: bool, index: bool = False) -> None:
        """Flush the consume queues (and the index when ``clean``, ``index``, or flushIntervalIndex has passed), then
        record what is durable. Any thread: the position comes from the end of the last group (all of it
        dispatched), and the queues' and index's flushes run beside appends."""
        with self._lock:
            wpos, last_ts, index_ts = self._published.snap
            flushed = self._published.flushed
            self.consume_queue.flush()
            now = time.monotonic()
            indexer = self._indexer
            if (
                clean
                or index
                or indexer.queued - self._index_queued_at_flush >= _INDEX_FLUSH_RECORDS
                or now - self._index_flushed_at >= self._config.flush_interval_index / 1000.0
            ):
                self._index_queued_at_flush = indexer.queued
                indexer.drain()  # the index must hold everything up to wpos before it is flushed
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


def delete_oldest_segments(
    commit_log: CommitLog,
    consume_queue: ConsumeQueueLike,
    key_index: KeyIndexLike,
    written: int,
    count: int,
    guard: int,
) -> list[str]:
    """Delete the ``count`` oldest segments (writer thread: ``written`` is its position), never the active one, one
    past ``guard`` or one holding unwritten bytes; then move queue and index minimums up."""
    deleted: list[str] = []
    for seg in list(commit_log.segments[:count]):
        if seg is commit_log.segments[-1] or seg.end > guard or seg.end > written:
            break
        commit_log.delete_segment(seg)
        deleted.append(seg.path)
        log.info("retention: deleted commit-log segment %s", seg.path)
    if deleted:
        new_min = commit_log.min_offset
        consume_queue.correct_min_offset(new_min)
        key_index.delete_before(new_min)
    return deleted
