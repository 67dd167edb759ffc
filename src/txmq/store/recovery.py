"""Opening a store's files: the fast path after a clean shutdown, and crash recovery (verify the log tail, cut a torn
tail, replay consume queues and the index past their durable points, drop their entries past the log's end)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txmq.errors import CorruptStoreError, DiskFullError, RecordDecodeError
from txmq.protocol.record import MIN_RECORD_SIZE, RecordView
from txmq.store.checkpoint import CheckpointState
from txmq.store.commit_log import CommitLog, ScanResult, segment_name
from txmq.store.damage import Damage, DamageLog
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
    damaged: list[Damage] = field(default_factory=list)  # found by this recovery's scan; the records after are kept
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
        damage: DamageLog | None = None,
    ) -> None:
        self.commit_log = commit_log
        self.cq = consume_queue
        self.index = key_index
        self.check_crc = check_crc
        self.delay_levels = delay_levels_ms or []
        self.info = RecoveryInfo()
        self.damage = damage if damage is not None else DamageLog(None)
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
            flushed = cp.commit_flushed if cp is not None else 0
            end = self._scan_and_replay(start, cq_from, index_from, None, flushed)
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

    def _scan_and_replay(self, start: int, cq_from: int, index_from: int, stop_at: int | None, flushed: int = 0) -> int:
        """Verify records from ``start``, re-dispatch those past the queues' and index's durable points, and cut
        the log at its torn tail (crash path) or check it ends at ``stop_at`` (clean path).

        Damage in the middle does not cut the log: a record whose body CRC fails is recorded as damaged (its
        consume-queue entry stays, reads skip it), and bytes that are no record are recorded as a damaged range
        when a sound record follows them; the scan resumes there. Only damage with nothing sound after it is a torn
        tail. Zeros are the end of the data, unless the checkpoint says more than that was flushed (``flushed``).
        """
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
        last_phys: dict[tuple[str, int], int] = {}  # the last replayed record of each queue
        damaged: list[tuple[int, int]] = []  # ranges found by this scan, in log order
        cq_batch: list[DispatchRequest] = []
        index_batch: list[DispatchRequest] = []
        delay_levels = self.delay_levels
        end: int | None = None
        make_dispatch = dispatch_from_fields
        yield_from = min(cq_from, index_from)

        def gap_allowed(key: tuple[str, int], gap: int) -> bool:
            # Records of this queue may have been lost in a damaged range since its last record: no more of them
            # than the range can hold (a damaged QUEUEOFFSET past that is damage of its own, not a gap to fill).
            if not damaged or damaged[-1][0] < last_phys.get(key, cq_from):
                return False
            at, stop = damaged[-1]
            return gap <= (stop - at) // MIN_RECORD_SIZE + 1

        def fill_gap(key: tuple[str, int], want: int, upto: int, ts: int) -> None:
            at, stop = damaged[-1]
            for lost in range(want, upto):
                cq_batch.append(DispatchRequest(key[0], key[1], lost, at, stop - at, 0, ts, 0))
            log.error(
                "consume queue %s:%d: offsets [%d, %d) were in damaged range [%d, %d); they are skipped",
                key[0],
                key[1],
                want,
                upto,
                at,
                stop,
            )

        def on_damaged(phys: int, size: int, why: str) -> None:
            self._record_damage(phys, phys + size, why, "record")
            damaged.append((phys, phys + size))
            if phys < cq_from:
                return  # its consume-queue entry is already on disk; reads skip it
            data = self.commit_log.read(phys, size)
            try:
                view = RecordView(data)
                topic, qid, qoff, sys_flag = view.topic, view.queue_id, view.queue_offset, view.sys_flag
                ts = view.store_timestamp
            except (RecordDecodeError, TypeError):
                return  # its header is damaged too: the queue's next record shows the gap
            if (sys_flag & 0xC) not in (0x0, 0x8):
                return
            key = (topic, qid)
            want = expected.get(key)
            if want is not None and key in known and qoff != want:
                return  # a damaged queue offset: the queue's next record shows the gap
            # The entry keeps the queue's offsets dense; reads find the record damaged and skip it.
            cq_batch.append(DispatchRequest(topic, qid, qoff, phys, size, 0, ts, sys_flag))
            expected[key] = qoff + 1
            known.add(key)
            last_phys[key] = phys

        pos = start
        while end is None:
            result = ScanResult(pos)
            scanner = self.commit_log.scan(
                pos,
                check_crc=self.check_crc,
                result=result,
                yield_from=yield_from,
                on_damaged=on_damaged if self.check_crc else None,
            )
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
                                if qoff > want and gap_allowed(key, qoff - want):
                                    fill_gap(key, want, qoff, ts)
                                else:
                                    # A sound frame whose QUEUEOFFSET (outside the body's CRC) disagrees with its
                                    # queue: its header is damaged. It is recorded as damaged and never served; its
                                    # queue keeps the offset it should have had (pointing at it, so reads skip it),
                                    # and the scan goes on: the records after it are kept, not cut.
                                    why = f"record at {phys} has queue offset {qoff}, {d.topic}:{qid} expects {want}"
                                    self._record_damage(phys, phys + size, why, "record")
                                    damaged.append((phys, phys + size))
                                    cq_batch.append(DispatchRequest(d.topic, qid, want, phys, size, 0, ts, 0))
                                    expected[key] = want + 1
                                    last_phys[key] = phys
                                    info.cq_replayed += 1
                                    continue
                            expected[key] = qoff + 1
                            known.add(key)
                            last_phys[key] = phys
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
            info.scanned_records += result.records
            info.scanned_bytes += result.bytes
            info.stop_reason = result.reason
            if end is not None:
                break
            stop = result.end
            if stop_at is not None and stop >= stop_at:
                end = stop
                break
            if result.clean_end and not stop < flushed:
                end = stop
                break
            # Damage, or zeros below what was flushed: keep what follows when a sound record does.
            nxt = self.commit_log.next_sound_record(stop)
            if stop_at is not None and nxt >= stop_at:
                nxt = -1
            if nxt < 0:
                end = stop
                break
            self._record_damage(stop, nxt, result.reason, "range")
            damaged.append((stop, nxt))
            pos = nxt
        if cq_batch:
            cq.put(cq_batch)
        if index_batch:
            self._index(index_batch)
        if stop_at is not None and end != stop_at:
            log.error(
                "commit log ends at %d (%s) although the clean checkpoint says %d", end, info.stop_reason, stop_at
            )
        if stop_at is None or end != stop_at:
            self._truncate_log(end, info.stop_reason)
        cq.truncate_after(end)
        index.truncate_after(end)
        return end

    def _record_damage(self, start: int, end: int, reason: str, kind: str) -> None:
        seg = self.commit_log.find_segment(start)
        path = seg.path if seg is not None else segment_name(start - start % self.commit_log.segment_size)
        d = Damage(start, end, path, reason, kind)
        self.info.damaged.append(d)
        self.damage.add(d)

    def _index(self, batch: list[DispatchRequest]) -> None:
        if not self.deferred_index:
            try:
                self.index.put(batch)
                return
            except DiskFullError as exc:
                log.error("key index replay stopped (%s); the rest is indexed once space is freed", exc)
        self.deferred_index += batch

    def _truncate_log(self, end: int, reason: str) -> None:
        info = self.info
        first, zeroed, deleted = self.commit_log.truncate(end)
        info.truncated_bytes = zeroed
        info.deleted_segments = deleted
        if zeroed or deleted:
            info.truncated_at = first
            log.warning(
                "commit log: cut the torn tail at %d (%s): zeroed %d bytes [%d, %d)%s",
                first,
                reason,
                zeroed,
                first,
                first + zeroed,
                f", deleted segments {deleted}" if deleted else "",
            )
