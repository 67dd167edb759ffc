"""Opening a store's files: the fast path after a clean shutdown, and crash recovery (verify the log tail, cut a torn
tail, replay consume queues and the index past their durable points, drop their entries past the log's end)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txmq.errors import CorruptStoreError, DiskFullError
from txmq.store.checkpoint import CheckpointState
from txmq.store.commit_log import CommitLog, ScanResult
from txmq.store.dispatch import DispatchRequest
from txmq.store.entry import dispatch_from_fields

if TYPE_CHECKING:
    from txmq.store.message_store import ConsumeQueueLike, KeyIndexLike

log = logging.getLogger("txmq.store")

_REPLAY_CHUNK = 4096


@dataclass(slots=True)
class RecoveryInfo:
    """What opening the store found and did; also logged."""

    mode: str = "empty"  # "empty", "clean" (no scan) or "crash"
    log_end: int = 0
    scan_start: int = -1
    scanned_records: int = 0
    scanned_bytes: int = 0
    stop_reason: str = ""
    truncated_at: int = -1  # first offset that was cut off, -1 when nothing was
    truncated_bytes: int = 0
    deleted_segments: list[str] = field(default_factory=list)
    cq_replay_from: int = -1
    cq_replayed: int = 0
    index_replay_from: int = -1
    index_replayed: int = 0
    last_store_timestamp: int = 0  # of the last record replayed, 0 when none was
    seconds: float = 0.0


def cq_offset_sum(cq: ConsumeQueueLike) -> int:
    """Sum of every queue's max offset: with the max physical offset, a cheap fingerprint of the consume queues."""
    return sum(cq.max_offset(t, q) for t, q in cq.queues())


class Recovery:
    """Brings a loaded commit log, the consume queues and the key index into agreement."""

    def __init__(
        self,
        commit_log: CommitLog,
        consume_queue: ConsumeQueueLike,
        key_index: KeyIndexLike,
        *,
        check_crc: bool = True,
        delay_levels_ms: list[int] | None = None,
    ) -> None:
        self.commit_log = commit_log
        self.cq = consume_queue
        self.index = key_index
        self.check_crc = check_crc
        self.delay_levels = delay_levels_ms or []
        self.info = RecoveryInfo()
        # Records the key index could not take because the disk is full: the store queues them for its indexer,
        # which indexes them once space is freed (the broker starts and serves meanwhile).
        self.deferred_index: list[DispatchRequest] = []

    def run(self, checkpoint: CheckpointState | None, crashed: bool) -> RecoveryInfo:
        """Recover; ``crashed`` says the abort marker was present. Returns the info with the log's end."""
        info = self.info
        cp = checkpoint
        cq, index = self.cq, self.index
        segs = self.commit_log.segments
        cq_max = cq.max_physical_offset()
        index_max = index.max_physical_offset()
        if not segs:
            if (cp is not None and cp.commit_flushed > 0) or cq_max > 0:
                raise CorruptStoreError(
                    f"{self.commit_log.directory} holds no segment, but the checkpoint or the consume queues "
                    f"refer to {max(cp.commit_flushed if cp else 0, cq_max)} bytes of commit log; "
                    f"refusing to start on an empty log (wrong storePathRootDir, or lost files?)"
                )
            info.mode = "empty"
            cq.truncate_after(0)
            index.truncate_after(0)
            info.log_end = 0
            return info
        log_min = segs[0].start
        clean = (
            not crashed
            and cp is not None
            and cp.clean
            and log_min <= cp.commit_flushed <= segs[-1].end
            and self._looks_like_end(cp.commit_flushed)
        )
        if clean:
            assert cp is not None
            end = cp.commit_flushed
            info.mode = "clean"
            cq_ok = cq_max == cp.cq_max_phys and cq_offset_sum(cq) == cp.cq_offset_sum
            index_ok = index_max == cp.index_max_phys
            if not cq_ok:
                log.warning("consume queues differ from the clean checkpoint; rebuilding them from the log")
            if not index_ok:
                log.warning("key index differs from the clean checkpoint; rebuilding it from the log")
            cq_from = end if cq_ok else log_min
            index_from = end if index_ok else log_min
            if cq_from < end or index_from < end:
                end = self._scan_and_replay(min(cq_from, index_from), cq_from, index_from, end)
        else:
            info.mode = "crash"
            why = "abort marker present" if crashed else "no clean checkpoint"
            log.warning(
                "store at %s was not shut down cleanly (%s); verifying the commit log", self.commit_log.directory, why
            )
            # Their durable points: everything below is in their files. The scan starts no later than the last
            # segment's start, so a crash that tore any byte of it (or a bit flip there) is found.
            cq_from = min(max(cq_max, log_min), segs[-1].end)
            index_from = min(max(index_max, log_min), segs[-1].end)
            start = min(segs[-1].start, cq_from, index_from)
            if cp is not None and log_min <= cp.commit_flushed <= segs[-1].end:
                start = min(start, cp.commit_flushed)
            end = self._scan_and_replay(start, cq_from, index_from, None)
            if cp is not None and end < cp.commit_flushed:
                log.error(
                    "commit log is valid only up to %d but %d bytes were flushed before the crash: records in "
                    "[%d, %d) were lost to corruption",
                    end,
                    cp.commit_flushed,
                    end,
                    cp.commit_flushed,
                )
        info.log_end = end
        return info

    def _looks_like_end(self, end: int) -> bool:
        """A clean checkpoint's end must sit on zeros (or a segment boundary): nothing was written after it."""
        seg = self.commit_log.find_segment(end)
        if seg is None:
            return end == self.commit_log.segments[-1].end
        return self.commit_log.read(end, 8) == bytes(8)

    def _scan_and_replay(self, start: int, cq_from: int, index_from: int, stop_at: int | None) -> int:
        """Verify records from ``start``, re-dispatch those past the queues' and index's durable points, and cut
        the log at the first invalid record (crash path) or check it ends at ``stop_at`` (clean path)."""
        info = self.info
        cq, index = self.cq, self.index
        info.scan_start = start
        info.cq_replay_from = cq_from
        info.index_replay_from = index_from
        # Entries past the replay points are rewritten from the log, so the expected next offset of each queue
        # is known and every replayed record can be checked against it (the body CRC does not cover the header).
        cq.truncate_after(cq_from)
        index.truncate_after(index_from)
        expected = {(t, q): cq.max_offset(t, q) for t, q in cq.queues()}
        known = {k for k, v in expected.items() if v > 0}
        result = ScanResult(start)
        cq_batch: list[DispatchRequest] = []
        index_batch: list[DispatchRequest] = []
        delay_levels = self.delay_levels
        end: int | None = None
        scanner = self.commit_log.scan(
            start, check_crc=self.check_crc, result=result, yield_from=min(cq_from, index_from)
        )
        make_dispatch = dispatch_from_fields
        try:
            for phys, size, qid, qoff, sys_flag, ts, topic_raw, props_raw in scanner:
                if stop_at is not None and phys >= stop_at:
                    end = phys
                    break
                d = make_dispatch(phys, size, qid, qoff, sys_flag, ts, topic_raw, props_raw, delay_levels)
                info.last_store_timestamp = ts
                if phys >= cq_from:
                    if (sys_flag & 0xC) in (0x0, 0x8):  # has a consume-queue entry
                        key = (d.topic, qid)
                        want = expected.get(key)
                        if want is not None and key in known and qoff != want:
                            result.reason = f"record at {phys} has queue offset {qoff}, {d.topic}:{qid} expects {want}"
                            result.clean_end = False
                            end = phys
                            break
                        expected[key] = qoff + 1
                        known.add(key)
                        info.cq_replayed += 1
                    cq_batch.append(d)
                    if len(cq_batch) >= _REPLAY_CHUNK:
                        cq.put(cq_batch)
                        cq_batch = []
                if phys >= index_from:
                    index_batch.append(d)
                    info.index_replayed += 1
                    if len(index_batch) >= _REPLAY_CHUNK:
                        self._index(index_batch)
                        index_batch = []
        finally:
            scanner.close()
        if cq_batch:
            cq.put(cq_batch)
        if index_batch:
            self._index(index_batch)
        if end is None:
            end = result.end
        info.scanned_records = result.records
        info.scanned_bytes = result.bytes
        info.stop_reason = result.reason
        if stop_at is not None and end != stop_at:
            log.error("commit log ends at %d (%s) although the clean checkpoint says %d", end, result.reason, stop_at)
        if stop_at is None or end != stop_at:
            self._truncate_log(end, result)
        cq.truncate_after(end)
        index.truncate_after(end)
        return end

    def _index(self, batch: list[DispatchRequest]) -> None:
        if not self.deferred_index:
            try:
                self.index.put(batch)
                return
            except DiskFullError as exc:
                log.error("key index replay stopped (%s); the rest is indexed once space is freed", exc)
        self.deferred_index += batch

    def _truncate_log(self, end: int, result: ScanResult) -> None:
        info = self.info
        first, zeroed, deleted = self.commit_log.truncate(end)
        info.truncated_bytes = zeroed
        info.deleted_segments = deleted
        if zeroed or deleted:
            info.truncated_at = first
            log.warning(
                "commit log: cut the torn tail at %d (%s): zeroed %d bytes [%d, %d)%s",
                first,
                result.reason,
                zeroed,
                first,
                first + zeroed,
                f", deleted segments {deleted}" if deleted else "",
            )
