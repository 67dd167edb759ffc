"""The append pipeline: one writer at a time assigns offsets, writes each group of pending appends with as few
``pwritev`` calls as possible, dispatches consume-queue entries (and hands them to the key indexer), fdatasyncs
(SYNC_FLUSH), publishes what became visible and completes the waiting requests, one ``call_soon_threadsafe`` per
event loop per group. The writer is the writer thread, or a thread calling the blocking ``put_sync`` while the writer
is idle (it then writes its own group under the same append lock)."""

from __future__ import annotations

import _thread
import asyncio
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from txmq.clock import Clock
from txmq.errors import DiskFullError, StoreClosedError, StoreError
from txmq.protocol.record import Host, MessageRecord, WalkResult, encode_offset_msg_id, walk_segment
from txmq.protocol.record.layout import I64, QO_PO, QUEUE_OFFSET_POS
from txmq.store.background import KeyIndexer
from txmq.store.commit_log import CommitLog, blank_for
from txmq.store.config import StoreConfig
from txmq.store.dispatch import DispatchRequest
from txmq.store.entry import AppendEntry, EntryError, dispatch_from_fields, encode_entry, entry_from_bytes
from txmq.store.replica import ReplicaError
from txmq.store.state import Health, Published
from txmq.store.stats import StoreStats

if TYPE_CHECKING:
    from txmq.store.message_store import ConsumeQueueLike

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


NewMessagesCallback = Callable[[str, int, int], Any]


class _Request:
    """One put or put_many waiting for the writer."""

    __slots__ = ("entries", "future", "link", "loop", "result", "single", "then", "waiter")

    def __init__(
        self,
        entries: list[AppendEntry],
        future: asyncio.Future[Any] | None,
        loop: asyncio.AbstractEventLoop | None,
        single: bool,
        then: Callable[[Any], None] | None = None,
    ) -> None:
        self.entries = entries
        self.future = future  # resolved with the result on ``loop``; or
        self.then = then  # called with it there (no future, no extra event-loop turn)
        self.loop = loop
        self.single = single
        self.result: Any = None
        self.waiter: Any = None
        # Byte positions in the last entry that receive the offsets (hex) of the entries before it, in order.
        self.link: list[int] | None = None


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

    def finish(self) -> None:
        self.done.release()


_STOP = object()


def _complete_on_loop(
    reqs: list[_Request], updates: list[tuple[tuple[str, int], int]] | None, hooks: list[NewMessagesCallback]
) -> None:
    """Runs on an event loop: resolve that loop's futures of one group (or call their ``then``), then tell the
    new-message hooks."""
    for req in reqs:
        then = req.then
        if then is not None:
            try:
                then(req.result)
            except Exception:
                log.exception("a put's callback %r failed", then)
            continue
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


class Writer:
    """The append pipeline: requests in, groups written, results and new-message hooks out."""

    def __init__(
        self,
        commit_log: CommitLog,
        indexer: KeyIndexer,
        config: StoreConfig,
        clock: Clock,
        stats: StoreStats,
        published: Published,
        health: Health,
    ) -> None:
        self.consume_queue: ConsumeQueueLike = None  # type: ignore[assignment]  # set when the store opens
        self._commit_log = commit_log
        self._indexer = indexer
        self._clock = clock
        self._stats = stats
        self._published = published
        self._health = health
        self._segment_size = config.mapped_file_size_commit_log
        self._max_body = config.max_message_size
        # A record must leave room for the end-of-file blank in an otherwise empty segment.
        self._max_record = config.mapped_file_size_commit_log - 8
        self._delay_levels = config.delay_levels_ms()
        self._sync = config.sync_flush
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer_thread: threading.Thread | None = None
        # Held by whoever writes a group: the writer thread, or a blocking appender writing its own (put_many_sync).
        self._append_lock = threading.Lock()
        self._hooks: dict[asyncio.AbstractEventLoop | None, list[NewMessagesCallback]] = {}
        # Called on the writer thread with the written end, before the fsync: a master ships to its slaves from it
        # (issue 21), so the slave's fsync runs alongside this one. Must be quick and thread-safe.
        self.on_written: Callable[[int], None] | None = None
        self._loop_batches: dict[asyncio.AbstractEventLoop, list[_Request]] = {}  # each touched by its loop only
        # Writer state (whoever holds the append lock; set by reset() after recovery).
        self._seg: Any = None
        self._next_offsets: dict[tuple[str, int], int] = {}
        self._in_hand: list[Any] = []  # what the writer thread took from the queue last
        # The group-commit wait (_gather): requests ever handed to the queue (counted under health.put_lock) and
        # taken from it, and while the writer waits, the count it waits for and a lock it holds meanwhile.
        self._gather_s = config.group_commit_wait_us / 1e6 if config.sync_flush else 0.0
        self._handed = 0
        self._taken = 0
        self._wanted: tuple[int, Any] | None = None

    # ------------------------------------------------------------------------------------------ life cycle

    def reset(self, next_offsets: dict[tuple[str, int], int]) -> None:
        """Continue after recovery: the published written position and these next queue offsets."""
        self._seg = None
        self._next_offsets = next_offsets

    def start(self) -> None:
        self._writer_thread = threading.Thread(target=self._main, name="txmq-store-writer", daemon=True)
        self._writer_thread.start()

    def stop(self) -> None:
        """Finish every queued append and end the writer thread."""
        self._queue.put(_STOP)
        if self._writer_thread is not None:
            self._writer_thread.join()

    def wait_idle(self) -> None:
        """Wait until no group is being written (a blocking appender writing its own finishes first)."""
        with self._append_lock:
            pass

    def fail_leftovers(self) -> None:
        """Answer whatever is still queued: the store is closed or failed."""
        health = self._health
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            remark = f"the store failed: {health.failure}" if health.failure else "the store is closed"
            if isinstance(item, list):
                self._finish_failed(item, PutStatus.SERVICE_NOT_AVAILABLE, remark)
            elif isinstance(item, _Task):
                item.error = StoreError(remark) if health.failure else StoreClosedError(remark)
                item.finish()

    # ------------------------------------------------------------------------------------------ appending

    def put_future(self, record: MessageRecord) -> asyncio.Future[PutResult]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PutResult] = loop.create_future()
        self._put(loop, record, fut, None)
        return fut

    def put_then(
        self,
        record: MessageRecord,
        then: Callable[[PutResult], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """:meth:`put_future` without the future: ``then(result)`` runs on this event loop once the result is there
        (in the callback that completes the writer's group: one event-loop turn less than a future's callback).
        ``loop``, when the caller knows it, is the running loop (``asyncio.get_running_loop`` costs a ``getpid``
        system call in CPython 3.11)."""
        self._put(asyncio.get_running_loop() if loop is None else loop, record, None, then)

    def _put(
        self,
        loop: asyncio.AbstractEventLoop,
        record: MessageRecord,
        fut: asyncio.Future[PutResult] | None,
        then: Callable[[PutResult], None] | None,
    ) -> None:
        try:
            entry = encode_entry(record, self._max_body, self._delay_levels)
        except EntryError as exc:
            self._answer_now(loop, fut, then, self.refused(exc.status, str(exc)))
            return
        if len(entry[0]) > self._max_record:
            self._answer_now(loop, fut, then, self.refused("MESSAGE_ILLEGAL", self._too_big(len(entry[0]))))
            return
        self._submit(loop, _Request([entry], fut, loop, True, then))

    @staticmethod
    def _answer_now(
        loop: asyncio.AbstractEventLoop,
        fut: asyncio.Future[PutResult] | None,
        then: Callable[[PutResult], None] | None,
        result: PutResult,
    ) -> None:
        if fut is not None:
            fut.set_result(result)
        elif then is not None:
            loop.call_soon(then, result)  # never before put_then has returned

    def put_many_future(self, records: list[MessageRecord], link: str | None) -> asyncio.Future[list[PutResult]]:
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

    async def put_raw(self, data: bytes | bytearray, store_host: Host | None) -> PutResult:
        try:
            entry = entry_from_bytes(data, self._max_body, self._delay_levels, store_host)
        except EntryError as exc:
            return self.refused(exc.status, str(exc))
        if len(entry[0]) > self._max_record:
            return self.refused("MESSAGE_ILLEGAL", self._too_big(len(entry[0])))
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._submit(loop, _Request([entry], fut, loop, True))
        result: PutResult = await fut
        return result

    def put_many_sync(self, records: list[MessageRecord]) -> list[PutResult]:
        entries = self._encode_all(records)
        if isinstance(entries, PutResult):
            return [entries] * max(1, len(records))
        req = _Request(entries, None, None, False)
        health = self._health
        # Leader path: with the writer idle, the calling thread writes (and in SYNC mode fdatasyncs) its own group,
        # which spares a blocking appender the two thread hand-overs. It holds the append lock as the writer does,
        # so there is still one writer at a time; when the writer is busy the request joins its next group.
        if self._append_lock.acquire(blocking=False):
            try:
                if health.state == "open" and health.failure is None and self._queue.empty():
                    self._run_group([req])
                    inline: list[PutResult] = req.result
                    return inline
            finally:
                self._append_lock.release()
        req.waiter = _thread.allocate_lock()
        req.waiter.acquire()
        with health.put_lock:
            if health.state != "open" or health.failure is not None:
                return [self._unavailable()] * len(records)
            self._queue.put([req])
            self._handed_over(1)
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
        health = self._health
        with health.put_lock:
            if health.state == "open" and health.failure is None:
                self._queue.put(batch)
                self._handed_over(len(batch))
                return
        unavailable = self._unavailable()
        for req in batch:
            req.result = unavailable if req.single else [unavailable] * len(req.entries)
        _complete_on_loop(batch, None, [])

    def _handed_over(self, count: int) -> None:
        """``count`` more requests are in the queue (caller holds health.put_lock): wake the writer if it waits
        for them."""
        handed = self._handed = self._handed + count
        wanted = self._wanted
        if wanted is not None and handed >= wanted[0]:
            self._wanted = None
            try:
                wanted[1].release()
            except RuntimeError:  # it stopped waiting meanwhile
                pass

    def _encode_all(self, records: list[MessageRecord]) -> list[AppendEntry] | PutResult:
        if not records:
            return self.refused("MESSAGE_ILLEGAL", "no records to put")
        entries: list[AppendEntry] = []
        for i, record in enumerate(records):
            try:
                entry = encode_entry(record, self._max_body, self._delay_levels)
            except EntryError as exc:
                return self.refused(exc.status, f"record {i} of {len(records)}: {exc}")
            if len(entry[0]) > self._max_record:
                return self.refused("MESSAGE_ILLEGAL", f"record {i}: {self._too_big(len(entry[0]))}")
            entries.append(entry)
        return entries

    def _too_big(self, size: int) -> str:
        return f"record of {size} bytes does not fit a commit-log segment of {self._segment_size}"

    def refused(self, status: str, remark: str) -> PutResult:
        """A failed result with PutStatus ``status`` (counted as a put failure)."""
        self._stats.put_failures += 1
        return PutResult(PutStatus[status], remark=remark)

    def _unavailable(self) -> PutResult:
        self._stats.put_failures += 1
        failure = self._health.failure
        if failure is not None:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=f"the store failed: {failure}")
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=f"the store is {self._health.state}")

    # ------------------------------------------------------------------------------------------ the writer thread

    def _main(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # a bug, not an IO error (those are handled per group): never leave puts hanging
            log.critical("the append pipeline's writer thread died; refusing further appends", exc_info=True)
            health = self._health
            with health.put_lock:
                health.fail(f"writer thread died: {type(exc).__name__}: {exc}")
                health.writer_dead = True
            self._fail_in_hand(f"the store failed: {health.failure}")
            self.fail_leftovers()

    def _fail_in_hand(self, remark: str) -> None:
        """Answer what the dead loop had taken from the queue but not finished (taken with the item it died on)."""
        for item in self._in_hand:
            if type(item) is list:
                left = [req for req in item if req.result is None]
                if left:
                    self._finish_failed(left, PutStatus.SERVICE_NOT_AVAILABLE, remark)
            elif isinstance(item, _Task) and item.done.locked():
                item.error = StoreError(remark)
                item.finish()
        self._in_hand = []

    def _loop(self) -> None:
        q = self._queue
        get = q.get
        stop = False
        last = 0  # requests in the last round
        while not stop:
            items = [get()]
            for _ in range(q.qsize()):  # qsize() is a lower bound here: only this thread takes items
                items.append(q.get_nowait())
            if last > 1 and self._gather_s:
                self._gather(items, last)
            self._in_hand = items
            last = 0
            for item in items:
                if type(item) is list:
                    last += len(item)
            self._taken += last
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

    def _gather(self, items: list[Any], last: int) -> None:
        """The group-commit wait: the last round wrote ``last`` requests, whose answers have gone out; when fewer
        than that are in ``items``, wait up to ``groupCommitWaitMicros`` for the queue to have received as many
        since that round (their clients' next requests, most likely), then take what is there. Nothing is waited
        for when ``items`` holds a task or the stop."""
        have = 0
        for item in items:
            if type(item) is not list:
                return
            have += len(item)
        if have >= last:
            return
        target = self._taken + last
        lock = _thread.allocate_lock()
        lock.acquire()
        self._wanted = (target, lock)
        if self._handed < target:  # else what it waits for came while it was set up
            self._stats.group_waits += 1
            lock.acquire(True, self._gather_s)
        self._wanted = None
        q = self._queue
        for _ in range(q.qsize()):
            items.append(q.get_nowait())

    def _run_task(self, task: _Task) -> None:
        try:
            task.result = task.fn()
        except BaseException as exc:
            task.error = exc
        finally:
            task.finish()

    def call_in_writer(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the writer thread between groups and return its result (blocking)."""
        task = _Task(fn)
        health = self._health
        with health.put_lock:
            if health.state != "open":
                raise StoreClosedError(f"the store is {health.state}")
            if health.writer_dead:
                raise StoreError(f"the store failed: {health.failure}")
            self._queue.put(task)
        task.done.acquire()
        if task.error is not None:
            raise task.error
        return task.result

    def _run_group(self, reqs: list[_Request]) -> None:
        health = self._health
        if health.failure is not None:
            self._finish_failed(reqs, PutStatus.SERVICE_NOT_AVAILABLE, f"the store failed: {health.failure}")
            return
        if health.replica:
            self._finish_failed(
                reqs, PutStatus.SERVICE_NOT_AVAILABLE, "this store is a slave's: it takes only the master's bytes"
            )
            return
        try:
            self._write_group(reqs)
        except DiskFullError as exc:
            # Raised only where a segment is created, before the group wrote a byte: refuse this group and stay
            # open, so that writes resume once space is freed (no restart).
            log.error("append refused: %s", exc)
            self._finish_failed(reqs, PutStatus.SERVICE_NOT_AVAILABLE, str(exc))
        except BaseException as exc:
            # The log, the queues and what readers see may now disagree; only crash recovery can reconcile
            # them, so refuse all further appends until the store is reopened.
            health.failure = f"{type(exc).__name__}: {exc}"
            log.critical("append pipeline failed; refusing further appends until restart", exc_info=True)
            self._finish_failed(reqs, PutStatus.SERVICE_NOT_AVAILABLE, f"the store failed: {health.failure}")

    def _write_group(self, reqs: list[_Request]) -> None:
        """Stamp, write, dispatch, flush, publish and complete one group. Holder of the append lock only."""
        now = self._clock.now_ms()
        commit_log = self._commit_log
        published = self._published
        seg = self._seg
        wpos = published.written
        if seg is None or not seg.start <= wpos < seg.end:
            seg = commit_log.segment_for_write(wpos)
        seg_end = seg.end
        self._create_segments_ahead(reqs, wpos, seg_end)
        write_from = wpos
        bufs: list[Any] = []
        dispatches: list[DispatchRequest] = []
        touched: dict[tuple[str, int], int] = {}
        next_offsets = self._next_offsets
        pack_qo_po = QO_PO.pack_into
        qo_pos = QUEUE_OFFSET_POS
        pack_i64 = I64.pack_into
        ok = PutStatus.PUT_OK
        stats = self._stats
        topic_puts = stats.topic_puts
        topic_bytes = stats.topic_bytes
        messages = 0
        nbytes = 0
        for req in reqs:
            results: list[PutResult] = []
            req_from = nbytes
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
                # Called by name, not through a local alias: compiled, that is a direct call of the compiled class.
                dispatches.append(
                    DispatchRequest(
                        topic, queue_id, qo, wpos, size, now + delay if delay else code, now, sys_flag, keys, uniq
                    )
                )
                bufs.append(buf)
                results.append(PutResult(ok, wpos, qo, now, size, host))
                wpos += size
                nbytes += size
            if req.link is not None:  # the last entry refers to those before it (its buffer is not written yet)
                last = req.entries[-1][0]
                for k, at in enumerate(req.link):
                    last[at : at + 16] = b"%016X" % results[k].physical_offset
            n = len(results)
            messages += n
            if n == 1 or all(e[1] == topic for e in req.entries):
                topic_puts[topic] = topic_puts.get(topic, 0) + n
                topic_bytes[topic] = topic_bytes.get(topic, 0) + nbytes - req_from
            else:  # a commit: the copy on its topic and the marker on the op topic
                for e in req.entries:
                    t = e[1]
                    topic_puts[t] = topic_puts.get(t, 0) + 1
                    topic_bytes[t] = topic_bytes.get(t, 0) + len(e[0])
            req.result = results[0] if req.single else results
        self._seg = seg
        on_written = self.on_written
        # With no slave to ship to first, SYNC_FLUSH writes and syncs the group by one system call: the thread gives
        # the GIL up once per group, not twice (taking it back after the write meant waiting for a busy event loop),
        # and the dispatches below follow the sync.
        one_call = self._sync and on_written is None
        t0 = time.perf_counter_ns()
        if bufs:
            commit_log.write(seg, write_from - seg.start, bufs, one_call)
        t1 = time.perf_counter_ns()
        published.written = wpos
        if on_written is not None:  # a master ships the bytes now, so its slaves' fsync runs alongside its own
            on_written(wpos)
        commit_log.maybe_prepare(wpos)
        self.consume_queue.put(dispatches)
        self._indexer.enqueue(dispatches)
        if self._sync:
            if not one_call:
                t0 = time.perf_counter_ns()
                commit_log.flush(seg)
                t1 = time.perf_counter_ns()
            stats.flush_latency_us.add((t1 - t0) // 1000)
            stats.flushes += 1
            published.flushed = wpos
        # Publish only now: in SYNC mode a reader never sees an entry that a crash could take back.
        if touched:
            published.visible.update(touched)
        published.confirmed = wpos
        published.snap = (wpos, now, now)
        stats.groups += 1
        stats.put_requests += len(reqs)
        stats.put_messages += messages
        stats.put_bytes += nbytes
        stats.group_messages.add(messages)
        self._complete(reqs, touched)

    def _create_segments_ahead(self, reqs: list[_Request], wpos: int, seg_end: int) -> None:
        """Create the segments this group will cross into before any of its bytes is written, so that a full disk
        (:class:`DiskFullError`) stops the group before it wrote or numbered anything."""
        starts: list[int] = []
        for req in reqs:
            for entry in req.entries:
                size = len(entry[0])
                if wpos + size + 8 > seg_end:
                    starts.append(seg_end)
                    wpos, seg_end = seg_end, seg_end + self._segment_size
                wpos += size
        for start in starts:
            self._commit_log.segment_for_write(start)

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
                loop.call_soon_threadsafe(_complete_on_loop, group, updates, hooks.get(loop, []))
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
            self._stats.put_failures += len(req.entries)
        self._complete(reqs, {})

    # ------------------------------------------------------------------------------------------ a slave's appends

    def append_replicated_here(self, offset: int, data: bytes, durable: Callable[[int], None] | None = None) -> int:
        """:meth:`append_replicated` on the calling thread, under the append lock (a group or a task of the writer
        thread finishes first); refused once the store is closing or has failed."""
        health = self._health
        with self._append_lock:
            if health.state != "open":
                raise StoreClosedError(f"the store is {health.state}")
            if health.failure is not None:
                raise StoreError(f"the store failed: {health.failure}")
            return self.append_replicated(offset, data, durable)

    def append_replicated(self, offset: int, data: bytes, durable: Callable[[int], None] | None = None) -> int:
        """A slave's append (under the append lock): ``data`` (whole records, maybe ending with a
        segment's end-of-file blank) at ``offset``, which must be this log's end. Verify every record (magic, sizes,
        CRC, PHYSICALOFFSET, queue offsets in sequence), write, fdatasync, call ``durable(end)`` (which must not
        raise: the slave reports its durable end from there, before the dispatch), dispatch with recovery's fields,
        publish. Returns the new end; raises :class:`ReplicaError` and writes nothing on bad bytes."""
        published = self._published
        if offset != published.written:
            raise ReplicaError(f"replicated bytes at {offset}, but this commit log ends at {published.written}")
        seg = self._commit_log.segment_for_write(offset)
        end = offset + len(data)
        if end > seg.end:
            raise ReplicaError(f"replicated bytes [{offset}, {end}) cross the segment end {seg.end}")
        result = WalkResult()
        records = list(walk_segment(data, base=offset, tail_room=0, check_crc=True, result=result))
        if result.blank:
            if end != seg.end:
                raise ReplicaError(
                    f"an end-of-file blank at {result.end} that does not end at the segment end {seg.end}"
                )
        elif result.end != end:
            raise ReplicaError(f"replicated bytes are not whole records: stopped at {result.end} ({result.reason})")
        next_offsets = self._next_offsets
        touched: dict[tuple[str, int], int] = {}
        dispatches: list[DispatchRequest] = []
        delay_levels = self._delay_levels
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
        health = self._health
        try:
            self._commit_log.write(seg, offset - seg.start, [data], True)  # a slave acknowledges only what is durable
        except BaseException as exc:
            health.fail(f"{type(exc).__name__}: {exc}")
            log.critical("replicated append failed; refusing further appends until restart", exc_info=True)
            raise
        self._seg = None
        published.written = end
        if durable is not None:
            durable(end)
        self._commit_log.maybe_prepare(end)
        self.consume_queue.put(dispatches)
        self._indexer.enqueue(dispatches)
        next_offsets.update(touched)
        published.flushed = end
        if touched:
            published.visible.update(touched)
        published.confirmed = end
        if last_ts:
            published.snap = (end, last_ts, last_ts)
        else:
            published.snap = (end, published.snap[1], published.snap[2])
        stats = self._stats
        stats.groups += 1
        stats.put_messages += len(dispatches)
        stats.put_bytes += len(data)
        self._complete([], touched)
        return end

    # ------------------------------------------------------------------------------------------ hooks

    def on_new_messages(self, callback: NewMessagesCallback, loop: asyncio.AbstractEventLoop | None) -> None:
        hooks = {k: list(v) for k, v in self._hooks.items()}
        hooks.setdefault(loop, []).append(callback)
        self._hooks = hooks  # replaced whole: the writer iterates its own snapshot
